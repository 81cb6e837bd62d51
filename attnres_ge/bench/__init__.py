"""`attnres-ge bench`: Block AttnRes against a paired copy and against PyTorch, side by side in one process.

Block AttnRes is memory-bound, so every figure is taken against a `copy_` timed right beside it (the "paired
copy": the host's memory speed drifts during a run, so a figure from earlier in the run is no yardstick). For each
named shape and dtype, the providers' calls are timed in rounds: each round times every provider's call right
after a copy of its own, so all providers, and their copies, see the host as it is during that round. The report
gives the median and the spread of each call, its effective bandwidth over the minimum traffic, the fraction of
the paired copy's bandwidth, minor page faults per call and speedups against the other providers of the same
rounds. Rounds disturbed by the rest of the host are run again, then flagged, never reported as results.

The modules, by job:
  harness        the rounds, the quiet copy, when rounds are disturbed, one result line (Measurement)
  cases/         what is timed, one module per family, each explaining its providers and traffic:
                   per_layer   block_attention_residuals and its backward against PyTorch (T_N_H)
                   two_phase   block_attn_res_prepare and block_attn_res_update (T_N_S_D)
                   block       one block of a model, per-layer reads against two-phase (block_T_N_D_R)
                   stream      one forward of a model's residual stream, both ways (stream_T_D_L_B)
                   read        the general read (fused_attnres) against Inkling2's module, eager and
                               inductor, and FLA's interface with and without its output norm (read_T_N_H_S)
                   model       a tiny Inkling2 model's prefill and decode step, stock against patched with
                               integrations.transformers.apply (inkling2_P_T_D_L_B)
                   op          any registry op (ge_plugin/ops.py) that sets bench_inputs and has no family
                 and registry, the named shapes of each family and registry op (--shapes, --list)
  overheads      the per-call overhead of the per-layer op's paths above the bare kernel, for short kernels
  paths          what runs the kernels: the native kernels' instruction set paths (--paths)
  report         speedups, the goal tables, the block and stream table, the model's speedups, the machine
  plot           --plot
  run            the command line and the run

    attnres-ge bench [--shapes NAME ...] [--shape T,N,H ...] [--all-blocks] [--ops NAME ...] [--list]
                     [--dtypes float32 bfloat16] [--providers ...] [--paths PATH ... | all] [--rounds R]
                     [--retries K] [--json F] [--plot F]
"""

from attnres_ge.bench.run import build_parser, main

__all__ = ["build_parser", "main"]
