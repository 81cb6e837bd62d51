"""`attnres-ge bench`: Block AttnRes against a paired copy and against PyTorch, side by side in one process.

Block AttnRes is memory-bound, so every figure is taken against a `copy_` timed
right beside it (the "paired copy": the host's memory speed drifts during a run,
so a figure from earlier in the run is no yardstick). For each named shape and
dtype, the forwards of all providers, then their backwards, are timed in rounds:
each round times every provider's call right after a copy of its own, so all
providers, and their copies, see the host as it is during that round. The report
gives the median and the spread of each call, its effective bandwidth over the
minimum traffic, the fraction of the paired copy's bandwidth, minor page faults
per call and speedups against the other providers of the same rounds.

Minimum traffic (elements, each read or written once): forward (N+2) T H, backward (2N+3) T H.
The copy moves 2 (N+1) T H elements (the value stack read and written).

Providers:
  op-eager       torch.ops.attnres.* with fresh outputs each call (what eager training runs)
  op-graph       the same ops through torch.compile(backend="attnres_ge"): converter, local GE,
                 outputs and workspace planned per shape and reused (the graph path)
  kernel         the kernels alone, outputs and workspace allocated once, launched from a record
                 prepared once (as the runtime launches them): the floor both op paths stand on;
                 op time minus kernel time is the per-call overhead
  read           torch.sum of a float32 tensor of as many bytes as the pass moves: the host merely
                 reading that traffic, a reference for the read-heavy forward (it reads N+1 of its
                 N+2 rows), whose kernel does at least that and more arithmetic
  torch-eager    the plain formula (concatenate, RMS-norm, softmax, weighted sum) and its autograd
  torch-inductor torch.compile of a concatenation-free formula, forward and autograd backward

A measurement is trusted only when its rounds were quiet: before the rounds the copy is also timed
alone, back to back ("quiet copy"); when the copies paired with a provider ran at less than
DISTURBED_COPY_FRACTION of that rate, a provider's spread (interquartile range) is as large
as its median (DISTURBED_SPREAD_TO_MEDIAN), or the ratio of its call's time to its copy's, round by
round, spreads by DISTURBED_ROUND_RATIO_SPREAD of its median (the two saw different hosts), the
rounds are run again (--retries times), and if they stay disturbed the measurement is flagged:
its fraction of the copy and the speedups from it are not printed, plotted or written as results
(the JSON keeps its raw times with the flag).

For short kernels (decode-like shapes) each op path's per-call overhead above the kernel is
reported, and beside op-graph's the overhead of the same calls under torch.compile with
backend="eager" (what torch.compile itself costs a call of these ops), measured in the same
rounds: op-graph's overhead includes it.

--paths times everything on several of the native kernels' instruction set paths, one after the
other in the same run. Where the goals' shape (GOAL_SHAPE) was timed, a table closes the run: per
path and dtype, op-graph's and op-eager's fraction of the paired copy against GOALS.

The two-phase ops (TWO_PHASE_SHAPES, named T_N_S_D; float32, delta too) are timed by the same rounds, against
a copy of block_res's size, over their minimum traffic (every tensor with a token dimension read or written
once; the pseudo-queries, which have none, left out):
  prepare-eager, prepare-graph   block_attn_res_prepare: N T D read, S T D + 2 S T written
  update-eager, update-graph     block_attn_res_update on prepare's first slot: partial_block, delta, numerator
                                 read, partial_block and h written (5 T D), logit_max and exp_sum read
(-graph: through torch.compile(backend="attnres_ge")). Their path is the native kernels' (it would read
"python" for an op without a native kernel, which --paths then times on the first path alone).

One block of a model (BLOCK_SHAPES, named block_T_N_D_R; float32), timed the same way, both ways:
  block-per-layer   R times: live += delta, then block_attention_residuals over the N snapshots and live
  block-two-phase   one block_attn_res_prepare for the R readers, then R block_attn_res_update calls
The traffic model counts [T, D] planes: R (N + 5) per-layer against N + 6 R two-phase; the table closing
the run gives the measured speedup of the two-phase block beside the model's ratio. DEFAULT_BLOCK_SHAPES are
timed by default, --all-blocks times every one.

One no-grad forward of a model's residual stream (STREAM_SHAPES, named stream_T_D_L_B: L layers, a seal every B;
float32), the sublayers' outputs given, so that the stream's reads, seals and storage are timed, both ways:
  stream-per-layer  ResidualStream(two_phase=False): a block_attention_residuals per read
  stream-two-phase  each seal names its readers: a block_attn_res_prepare per seal, an update per read
against a copy of the snapshots' size, over the traffic model of stream_traffic (the planes each step must
read and write); the closing table gives its speedup as for a block.

    attnres-ge bench [--shapes NAME ...] [--shape T,N,H ...] [--all-blocks] [--dtypes float32 bfloat16]
                     [--providers ...] [--paths PATH ... | all] [--rounds R] [--retries K] [--json F] [--plot F]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform as host_platform
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

SHAPES: dict[str, tuple[int, int, int]] = {  # name -> (T, N, H)
    "T4096_N8_H2048": (4096, 8, 2048),
    "T1024_N16_H8192": (1024, 16, 8192),
    "T16_N8_H4096": (16, 8, 4096),  # decode-like: per-call overhead dominates
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
READ = "read"  # not ours and not PyTorch's formula: the host's streaming-read speed, beside ours in the plot
PROVIDERS = ("op-eager", "op-graph", "kernel", READ, "torch-eager", "torch-inductor")
OUR_PROVIDERS = ("op-eager", "op-graph", "kernel")
NORM_EPS = 1e-6
# A paired copy below this fraction of the quiet copy's rate means the host was disturbed during the rounds.
DISTURBED_COPY_FRACTION = 0.5
# A provider whose spread (interquartile range) reaches this multiple of its median has no median to speak of.
DISTURBED_SPREAD_TO_MEDIAN = 1.0
# Round by round, a provider's call and its copy see the same host; when the ratio of their times spreads
# (interquartile range) by this share of its median, they did not: other jobs' memory traffic came and went
# within the rounds, and a fraction of the copy from them means nothing (such rounds read 50-170%).
DISTURBED_ROUND_RATIO_SPREAD = 0.25
QUIET_COPIES = 9  # copies that measure the quiet copy rate
# Written over before each quiet copy, so that it starts from memory as a paired copy does (after a provider's
# call): larger than the last-level cache of common hosts.
EVICT_BYTES = 128 << 20
# The project's speed goals: the least fraction of the paired copy per (provider, direction), at GOAL_SHAPE,
# on the vector paths (the scalar path is the portable fallback and has none).
GOAL_SHAPE = (4096, 8, 2048)
GOAL_PATHS = ("avx2", "avx512", "avx512bf16")
GOALS = {("op-graph", "forward"): 0.90, ("op-graph", "backward"): 0.80,
         ("op-eager", "forward"): 0.80, ("op-eager", "backward"): 0.60}
ALL_PATHS = "all"
# The two-phase ops (block_attn_res_prepare, block_attn_res_update): name -> (T, N, S, D), float32.
TWO_PHASE_SHAPES: dict[str, tuple[int, int, int, int]] = {
    "T4096_N8_S8_D2048": (4096, 8, 8, 2048),
    "T4096_N8_S8_D7168": (4096, 8, 8, 7168),
    "T16_N8_S8_D2048": (16, 8, 8, 2048),  # decode-like
}
TWO_PHASE_PROVIDERS = ("prepare-eager", "prepare-graph", "update-eager", "update-graph")
# One block of a model (issue 23): name -> (T, N, D, R); prefill and decode token counts, R reads per block.
BLOCK_READS = 8
BLOCK_SHAPES: dict[str, tuple[int, int, int, int]] = {
    f"block_T{tokens}_N{blocks}_D{hidden}_R{BLOCK_READS}": (tokens, blocks, hidden, BLOCK_READS)
    for tokens in (4096, 16, 1) for blocks in (8, 32) for hidden in (2048, 7168)
}
DEFAULT_BLOCK_SHAPES = ("block_T4096_N8_D2048_R8", "block_T16_N8_D2048_R8", "block_T1_N8_D2048_R8",
                        "block_T1_N32_D7168_R8")  # timed unless --shapes or --all-blocks says otherwise
BLOCK_PROVIDERS = ("block-per-layer", "block-two-phase")
# One no-grad forward of a model's residual stream (ResidualStream, its sublayers left out): name -> (T, D, layers,
# layers per block); a prefill and a decode token count.
STREAM_SHAPES: dict[str, tuple[int, int, int, int]] = {
    f"stream_T{tokens}_D2048_L32_B4": (tokens, 2048, 32, 4) for tokens in (4096, 1)
}
STREAM_PROVIDERS = ("stream-per-layer", "stream-two-phase")
ALL_PROVIDERS = (*PROVIDERS, *TWO_PHASE_PROVIDERS, *BLOCK_PROVIDERS, *STREAM_PROVIDERS)


@dataclass
class Measurement:
    shape: str
    dtype: str
    provider: str
    direction: str  # forward | backward
    median_ms: float
    spread_ms: float  # interquartile range
    min_ms: float
    traffic_bytes: int
    gbps: float  # traffic / median time
    copy_gbps: float  # the paired copy's (bytes read + written) / its median time
    fraction_of_copy: float
    page_faults_per_call: float
    quiet_copy_gbps: float = 0.0  # the copy alone, back to back, just before the rounds
    attempts: int = 1  # times the rounds were run (more than one: earlier ones were disturbed)
    disturbed: str = ""  # why the measurement is not to be trusted; empty when it is
    path: str = ""  # what ran the kernels: the native kernels' instruction set path, or "python"

    @property
    def trusted(self) -> bool:
        return not self.disturbed


# ---------------------------------------------------------------------------- formulas


def plain_formula(partial_block, block_res, proj_weight, norm_weight):
    """What one writes first: concatenate the rows, RMS-norm, score, softmax, mix (float32 maths)."""
    values = torch.cat([block_res, partial_block.unsqueeze(1)], dim=1).float()  # [T, N+1, H]
    inv_norm = torch.rsqrt(values.pow(2).mean(dim=-1) + NORM_EPS)
    scores = inv_norm * (values * (norm_weight.float() * proj_weight.reshape(-1).float())).sum(dim=-1)
    probs = torch.softmax(scores, dim=-1)
    return (probs.unsqueeze(-1) * values).sum(dim=1).to(partial_block.dtype)


def concat_free_formula(partial_block, block_res, proj_weight, norm_weight):
    """The same maths with the partial block kept apart: no [T, N+1, H] concatenation for inductor to copy."""
    weight = norm_weight.float() * proj_weight.reshape(-1).float()  # [H]
    blocks, partial = block_res.float(), partial_block.float()
    block_scores = torch.rsqrt(blocks.pow(2).mean(-1) + NORM_EPS) * (blocks * weight).sum(-1)  # [T, N]
    partial_score = torch.rsqrt(partial.pow(2).mean(-1, keepdim=True) + NORM_EPS) * (partial * weight).sum(
        -1, keepdim=True)  # [T, 1]
    top = torch.maximum(block_scores.amax(-1, keepdim=True), partial_score)
    block_exp, partial_exp = torch.exp(block_scores - top), torch.exp(partial_score - top)
    total = block_exp.sum(-1, keepdim=True) + partial_exp
    mixed = ((block_exp / total).unsqueeze(-1) * blocks).sum(1) + (partial_exp / total) * partial
    return mixed.to(partial_block.dtype)


# ---------------------------------------------------------------------------- providers


class Case:
    """Inputs of one (shape, dtype) and the forward/backward callables of each provider."""

    def __init__(self, shape: tuple[int, int, int], dtype: torch.dtype, seed: int = 0):
        tokens, blocks, hidden = shape
        generator = torch.Generator().manual_seed(seed)
        self.shape, self.dtype = shape, dtype
        self.inputs = (
            torch.randn(tokens, hidden, generator=generator).to(dtype),
            torch.randn(tokens, blocks, hidden, generator=generator).to(dtype),
            (0.5 * torch.randn(1, hidden, generator=generator) / hidden**0.5).to(dtype),
            (1 + 0.2 * torch.randn(hidden, generator=generator)).to(dtype),
        )
        self.grad_hidden = torch.randn(tokens, hidden, generator=generator).to(dtype)
        _, self.inv_norm, self.probs = torch.ops.attnres.block_attention_residuals(*self.inputs, -1, NORM_EPS, True)

    def traffic(self, direction: str) -> int:
        tokens, blocks, hidden = self.shape
        elements = (blocks + 2 if direction == "forward" else 2 * blocks + 3) * tokens * hidden
        return elements * self.inputs[0].element_size()

    directions = ("forward", "backward")

    def copy_elements(self) -> int:
        tokens, blocks, hidden = self.shape
        return tokens * (blocks + 1) * hidden  # the value stack's size

    def provider_traffic(self, direction: str, provider: str) -> int:
        return self.traffic(direction)

    def path(self, provider: str) -> str:
        return kernel_path()

    def provider(self, name: str) -> dict[str, Callable[[], object]]:
        return getattr(self, "_" + name.replace("-", "_"))()

    def _op_eager(self):
        ops = torch.ops.attnres
        return {
            "forward": lambda: ops.block_attention_residuals(*self.inputs, -1, NORM_EPS, True),
            "backward": lambda: ops.block_attention_residuals_backward(
                *self.inputs[:2], self.inputs[2], self.inputs[3], self.grad_hidden, self.inv_norm, self.probs),
        }

    def _op_graph(self):
        torch._dynamo.reset()  # a fresh cache per case: dynamo's recompile limit would silently fall back to eager
        return self.compiled_ops("attnres_ge")

    def compiled_ops(self, backend: str):
        """The op-eager calls under torch.compile(backend=...); "eager" leaves the ops as they are, which is
        what torch.compile itself costs a call of these ops."""
        ops = torch.ops.attnres

        def forward(partial_block, block_res, proj_weight, norm_weight):
            return ops.block_attention_residuals(partial_block, block_res, proj_weight, norm_weight, -1, NORM_EPS, True)

        def backward(*tensors):
            return ops.block_attention_residuals_backward(*tensors)

        compiled_forward = torch.compile(forward, backend=backend, fullgraph=True, dynamic=False)
        compiled_backward = torch.compile(backward, backend=backend, fullgraph=True, dynamic=False)
        stats = (self.grad_hidden, self.inv_norm, self.probs)
        return {
            "forward": lambda: compiled_forward(*self.inputs),
            "backward": lambda: compiled_backward(*self.inputs, *stats),
        }

    def _kernel(self):
        from attnres_ge.op_host import block_attention_residuals_grad_tiling as grad_tiling
        from attnres_ge.op_host import block_attention_residuals_tiling as forward_tiling
        from attnres_ge.op_kernel import KERNELS
        from attnres_ge.op_kernel.block_attention_residuals import KERNEL as FORWARD_KERNEL
        from attnres_ge.op_kernel.block_attention_residuals_grad import KERNEL as BACKWARD_KERNEL
        from attnres_ge.op_kernel.host_memory import empty_planned
        from attnres_ge.op_kernel.launcher import default_runtime

        tokens, blocks, hidden = self.shape
        platform = default_runtime().platform
        platform.requery()
        forward = forward_tiling.tiling(forward_tiling.parse(platform), tokens, blocks, hidden, self.dtype, NORM_EPS,
                                        True, platform)
        backward = grad_tiling.tiling(grad_tiling.parse(platform), tokens, blocks, hidden, self.dtype, platform)
        stats = (tokens, blocks + 1)
        # Buffers as a compiled graph plans them (host_memory.empty_planned); records prepared once, no
        # per-call checks: launched as the runtime launches them.
        forward_out = (empty_planned(tuple(self.inputs[0].shape), self.dtype), torch.empty(stats), torch.empty(stats))
        backward_out = tuple(empty_planned(tuple(t.shape), t.dtype) for t in self.inputs)
        workspace = empty_planned((max(forward.workspace_size, backward.workspace_size),), torch.uint8)
        _, forward_launch = KERNELS.launch(FORWARD_KERNEL, forward.data, self.dtype)
        _, backward_launch = KERNELS.launch(BACKWARD_KERNEL, backward.data, self.dtype)
        backward_inputs = (*self.inputs, self.grad_hidden, self.inv_norm, self.probs)
        return {
            "forward": lambda: forward_launch(self.inputs, forward_out, workspace),
            "backward": lambda: backward_launch(backward_inputs, backward_out, workspace),
        }

    def _read(self):
        sources = {direction: torch.ones(self.traffic(direction) // 4) for direction in ("forward", "backward")}
        return {direction: functools.partial(torch.sum, source) for direction, source in sources.items()}

    def _autograd_pair(self, function):
        leaves = [t.detach().requires_grad_() for t in self.inputs]
        output = function(*leaves)  # the graph the backward replays
        return {
            "forward": lambda: function(*self.inputs),
            "backward": lambda: torch.autograd.grad(output, leaves, self.grad_hidden, retain_graph=True),
        }

    def _torch_eager(self):
        return self._autograd_pair(plain_formula)

    def _torch_inductor(self):
        torch._dynamo.reset()  # as in _op_graph
        return self._autograd_pair(torch.compile(concat_free_formula, dynamic=False))


# ---------------------------------------------------------------------------- the two-phase ops and one block


def two_phase_path() -> str:
    """What runs the two-phase kernels: "python" while either op has no native kernel, else kernel_path()."""
    from attnres_ge.op_kernel.block_attn_res_prepare import KERNEL as PREPARE_KERNEL
    from attnres_ge.op_kernel.block_attn_res_update import KERNEL as UPDATE_KERNEL

    if not (PREPARE_KERNEL.has_native and UPDATE_KERNEL.has_native):
        return "python"
    return kernel_path()


def prepare_traffic(tokens: int, blocks: int, readers: int, hidden: int) -> int:
    """Prepare's minimum traffic in float32 elements: block_res read, numerator, logit_max and exp_sum written."""
    return blocks * tokens * hidden + readers * tokens * hidden + 2 * readers * tokens


def update_traffic(tokens: int, hidden: int, delta_size: int = 4) -> int:
    """Update's minimum traffic in bytes: partial_block, numerator (float32), delta read, partial_block (float32)
    and h (delta's dtype) written, logit_max and exp_sum read."""
    return tokens * hidden * (3 * 4 + 2 * delta_size) + 2 * tokens * 4


def block_traffic(tokens: int, blocks: int, hidden: int, reads: int) -> dict[str, int]:
    """The traffic model of one block in float32 elements, counting [T, D] planes: per-layer, each read adds its
    delta to live (3 planes) and reads N snapshots and live and writes h (N + 2); two-phase, one prepare
    (N in, R out) and R updates (5 planes each)."""
    plane = tokens * hidden
    return {"block-per-layer": reads * (blocks + 5) * plane, "block-two-phase": (blocks + 6 * reads) * plane}


def compiled_op(op, **attributes):
    """`op` under torch.compile(backend="attnres_ge") with a fresh dynamo cache (as _op_graph)."""
    torch._dynamo.reset()
    return torch.compile(functools.partial(op, **attributes), backend="attnres_ge", fullgraph=True, dynamic=False)


class TwoPhaseCase:
    """Inputs of block_attn_res_prepare and block_attn_res_update at one (T, N, S, D), all float32, and each
    provider's call ("forward": the ops are inference-only)."""

    directions = ("forward",)
    dtype = torch.float32

    def __init__(self, shape: tuple[int, int, int, int], seed: int = 0):
        tokens, blocks, readers, hidden = shape
        generator = torch.Generator().manual_seed(seed)
        self.shape = shape
        self.block_res = torch.randn(tokens, blocks, hidden, generator=generator)
        self.valid_blocks = torch.tensor([blocks], dtype=torch.uint64)
        self.pseudo_query = 0.5 * torch.randn(readers, hidden, generator=generator) / hidden**0.5
        self.partial = torch.randn(tokens, hidden, generator=generator)
        self.delta = torch.randn(tokens, hidden, generator=generator)
        self.state = torch.ops.attnres.block_attn_res_prepare(self.block_res, self.valid_blocks, self.pseudo_query,
                                                              eps=NORM_EPS)

    def copy_elements(self) -> int:
        tokens, blocks, _, hidden = self.shape
        return tokens * blocks * hidden  # block_res's size

    def provider_traffic(self, direction: str, provider: str) -> int:
        tokens, blocks, readers, hidden = self.shape
        if provider.startswith("prepare"):
            return 4 * prepare_traffic(tokens, blocks, readers, hidden)
        return update_traffic(tokens, hidden)

    def path(self, provider: str) -> str:
        return two_phase_path()

    def provider(self, name: str) -> dict[str, Callable[[], object]]:
        ops = torch.ops.attnres
        op_name, mode = name.split("-")
        op = getattr(ops, f"block_attn_res_{op_name}")
        call = functools.partial(op, eps=NORM_EPS) if mode == "eager" else compiled_op(op, eps=NORM_EPS)
        if op_name == "prepare":
            arguments = (self.block_res, self.valid_blocks, self.pseudo_query)
        else:  # the first reader's slot; partial is updated in place, call after call
            arguments = (self.partial, self.delta, self.pseudo_query[0], *(part[0] for part in self.state))
        return {"forward": functools.partial(call, *arguments)}


class BlockCase:
    """One block of a model at (T, N, D, R): N sealed snapshots and R reads before the next seal, each read after
    a sublayer's output (delta) is added to the live stream; all float32.

    block-per-layer: per read, live += delta, then torch.ops.attnres.block_attention_residuals (no backward stats).
    block-two-phase: one block_attn_res_prepare for the R readers, then per read one block_attn_res_update (which
    adds the delta itself)."""

    directions = ("forward",)
    dtype = torch.float32

    def __init__(self, shape: tuple[int, int, int, int], seed: int = 0):
        tokens, blocks, hidden, reads = shape
        generator = torch.Generator().manual_seed(seed)
        self.shape = shape
        self.snapshots = torch.randn(tokens, blocks, hidden, generator=generator)
        self.valid_blocks = torch.tensor([blocks], dtype=torch.uint64)
        self.live = torch.randn(tokens, hidden, generator=generator)
        self.deltas = [torch.randn(tokens, hidden, generator=generator) for _ in range(reads)]
        self.proj_weights = [0.5 * torch.randn(1, hidden, generator=generator) / hidden**0.5 for _ in range(reads)]
        self.norm_weights = [1 + 0.2 * torch.randn(hidden, generator=generator) for _ in range(reads)]
        self.pseudo_queries = torch.stack([n * p.reshape(-1) for n, p in zip(self.norm_weights, self.proj_weights,
                                                                              strict=True)])

    def copy_elements(self) -> int:
        tokens, blocks, hidden, _ = self.shape
        return tokens * blocks * hidden  # the snapshots' size

    def provider_traffic(self, direction: str, provider: str) -> int:
        return 4 * block_traffic(*self.shape)[provider]

    def path(self, provider: str) -> str:
        return kernel_path() if provider == "block-per-layer" else two_phase_path()

    def provider(self, name: str) -> dict[str, Callable[[], object]]:
        return {"forward": self._per_layer_reads if name == "block-per-layer" else self._two_phase_reads}

    def _per_layer_reads(self) -> list[torch.Tensor]:
        read = torch.ops.attnres.block_attention_residuals
        outputs = []
        for delta, proj_weight, norm_weight in zip(self.deltas, self.proj_weights, self.norm_weights, strict=True):
            self.live.add_(delta)
            outputs.append(read(self.live, self.snapshots, proj_weight, norm_weight, -1, NORM_EPS, False)[0])
        return outputs

    def _two_phase_reads(self) -> list[torch.Tensor]:
        ops = torch.ops.attnres
        numerator, logit_max, exp_sum = ops.block_attn_res_prepare(self.snapshots, self.valid_blocks,
                                                                   self.pseudo_queries, eps=NORM_EPS)
        return [ops.block_attn_res_update(self.live, delta, query, numerator[slot], logit_max[slot], exp_sum[slot],
                                          eps=NORM_EPS)
                for slot, (delta, query) in enumerate(zip(self.deltas, self.pseudo_queries, strict=True))]


def stream_traffic(tokens: int, hidden: int, layers: int, block_size: int) -> dict[str, int]:
    """The traffic model of one forward of the stream (StreamCase) in float32 elements: the [T, D] planes each
    step must read and write, walking the schedule. Per-layer: a read with n sealed n + 2 (none with nothing
    sealed: live itself), an accumulate 3 (none right after a seal: out becomes live), a seal 2. Two-phase: the
    float32 live stream 2, a read with nothing sealed 2 (a copy of live), a seal 3 (live into its slot, live
    zeroed) and its prepare n + R (R its readers), a read 5 (an update), an accumulate none (the next update
    adds it)."""
    per_layer, two_phase = 0, 2  # two-phase: the embeddings into the float32 live stream
    sealed = 0
    for layer in range(layers):
        per_layer += sealed + 2 if sealed else 0
        two_phase += 5 if sealed else 2
        if layer % block_size == 0:
            sealed += 1
            readers = 2 * min(block_size, layers - layer)  # the mlp read of this layer ... the next attn read
            per_layer += 2
            two_phase += 3 + sealed + readers
        per_layer += 0 if layer % block_size == 0 else 3  # the attention output
        per_layer += sealed + 2 + 3  # the mlp read, the mlp output
        two_phase += 5
    per_layer += sealed + 2  # the final read
    two_phase += 5
    plane = tokens * hidden
    return {"stream-per-layer": per_layer * plane, "stream-two-phase": two_phase * plane}


class StreamCase:
    """One no-grad forward of a K3-style stack of L layers on a ResidualStream (a seal every B layers, reads
    before attention and MLP, a final read) at (T, D, L, B), all float32. The sublayers are left out: their
    outputs are given, so the stream alone is timed, with the copies and adds its storage needs.

    stream-per-layer: two_phase=False (each read one block_attention_residuals).
    stream-two-phase: each seal declares the reads up to the next one (one prepare, then an update per read)."""

    directions = ("forward",)
    dtype = torch.float32

    def __init__(self, shape: tuple[int, int, int, int], seed: int = 0):
        from attnres_ge.api import BlockAttnRes

        tokens, hidden, layers, block_size = shape
        generator = torch.Generator().manual_seed(seed)
        self.shape = shape
        self.embeddings = torch.randn(tokens, hidden, generator=generator)
        self.outputs = [0.5 * torch.randn(tokens, hidden, generator=generator) for _ in range(2)]
        self.mixers = [BlockAttnRes(hidden, norm_eps=NORM_EPS) for _ in range(2 * layers + 1)]  # attn, mlp, ..., final
        with torch.no_grad():
            for mixer in self.mixers:
                mixer.proj_weight.copy_(0.5 * torch.randn(1, hidden, generator=generator) / hidden**0.5)

    @property
    def seals(self) -> int:
        _, _, layers, block_size = self.shape
        return -(-layers // block_size)

    def copy_elements(self) -> int:
        tokens, hidden, _, _ = self.shape
        return tokens * self.seals * hidden  # the snapshots' size

    def provider_traffic(self, direction: str, provider: str) -> int:
        return 4 * stream_traffic(*self.shape)[provider]

    def path(self, provider: str) -> str:
        return kernel_path() if provider == "stream-per-layer" else two_phase_path()

    def provider(self, name: str) -> dict[str, Callable[[], object]]:
        return {"forward": functools.partial(self.forward, name == "stream-two-phase")}

    def readers(self, layer: int) -> list:
        """The reads from the seal in `layer` to the next seal, in order."""
        _, _, layers, block_size = self.shape
        end = min(layer + block_size, layers)
        return self.mixers[2 * layer + 1: 2 * end + 1]

    def forward(self, two_phase: bool) -> torch.Tensor:
        from attnres_ge.stream import ResidualStream

        _, _, layers, block_size = self.shape
        with torch.no_grad():
            stream = ResidualStream(self.embeddings, max_blocks=self.seals, two_phase=two_phase)
            for layer in range(layers):
                stream.read(self.mixers[2 * layer])
                if layer % block_size == 0:
                    stream.seal(readers=self.readers(layer) if two_phase else None)
                stream.accumulate(self.outputs[0])
                stream.read(self.mixers[2 * layer + 1])
                stream.accumulate(self.outputs[1])
            return stream.read(self.mixers[-1])


# ---------------------------------------------------------------------------- timing


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def time_rounds(calls: dict[str, Callable[[], object]], copy: Callable[[], object], rounds: int,
                warmup: int = 2) -> dict[str, tuple[list[float], list[float], float]]:
    """Per call: (call times, copy times, minor page faults per call). Each round times every call right
    after a copy of its own, so all of them, and their copies, see the host as it is during that round."""
    for _ in range(warmup):
        for call in calls.values():
            copy()
            call()
    call_times = {name: [] for name in calls}
    copy_times = {name: [] for name in calls}
    faults = dict.fromkeys(calls, 0)
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            copy()
            copy_times[name].append(time.perf_counter() - start)
            before = _minor_faults()
            start = time.perf_counter()
            result = call()
            call_times[name].append(time.perf_counter() - start)
            faults[name] += _minor_faults() - before
            del result  # freed outside the timed region, as a training step frees it later
    return {name: (call_times[name], copy_times[name], faults[name] / rounds) for name in calls}


def _spread(times: list[float]) -> float:
    if len(times) < 4:
        return max(times) - min(times)
    quartiles = statistics.quantiles(times, n=4)
    return quartiles[2] - quartiles[0]


def quiet_copy_gbps(copy: Callable[[], object], copy_bytes: int) -> float:
    """The copy's rate timed alone, from memory (the caches flushed before each), the fastest of a few: the
    host at its quietest, as the paired copies would see it without anything else running."""
    evict = torch.empty(EVICT_BYTES, dtype=torch.uint8)
    times = []
    for _ in range(QUIET_COPIES):
        evict.fill_(1)
        start = time.perf_counter()
        copy()
        times.append(time.perf_counter() - start)
    return copy_bytes / min(times) / 1e9


def disturbance(call_times: list[float], copy_gbps: float, quiet_gbps: float,
                copy_times: list[float] | None = None) -> str:
    """Why rounds with these call times, these paired copy times (one per round, optional) and this paired copy
    rate cannot be trusted; "" when they can."""
    reasons = []
    if copy_gbps < DISTURBED_COPY_FRACTION * quiet_gbps:
        reasons.append(f"paired copy {copy_gbps:.1f} GB/s, under {DISTURBED_COPY_FRACTION:.0%} of the quiet "
                       f"copy's {quiet_gbps:.1f} GB/s")
    median, spread = statistics.median(call_times), _spread(call_times)
    if spread >= DISTURBED_SPREAD_TO_MEDIAN * median:
        reasons.append(f"spread {spread * 1e3:.3g} ms against a median of {median * 1e3:.3g} ms")
    if copy_times:
        ratios = [copy / call for copy, call in zip(copy_times, call_times, strict=True)]
        ratio_median, ratio_spread = statistics.median(ratios), _spread(ratios)
        if ratio_spread >= DISTURBED_ROUND_RATIO_SPREAD * ratio_median:
            reasons.append(f"the call's time against its copy's spreads {ratio_spread / ratio_median:.0%} "
                           "round to round")
    return "; ".join(reasons)


def measure(shape_name: str, shape: tuple[int, int, int], dtype_name: str, providers, rounds: int, retries: int = 2,
            log=print) -> list[Measurement]:
    """Every provider's forward, then backward, timed in shared rounds; rounds run again while disturbed."""
    return measure_case(Case(shape, DTYPES[dtype_name]), shape_name, dtype_name, providers, rounds, retries, log)


def measure_case(case, shape_name: str, dtype_name: str, providers, rounds: int, retries: int = 2,
                 log=print) -> list[Measurement]:
    """measure() for any case (Case, TwoPhaseCase, BlockCase): each of its directions timed in shared rounds
    against a copy of case.copy_elements() elements, rounds run again while disturbed."""
    source = torch.randn(case.copy_elements()).to(case.dtype)
    target = torch.empty_like(source)
    copy_bytes = 2 * source.nbytes
    copy = functools.partial(target.copy_, source)
    available = {}
    for provider in providers:
        try:
            available[provider] = case.provider(provider)
        except Exception as error:  # e.g. inductor without a compiler: report, keep going
            log(f"  {provider}: unavailable ({type(error).__name__}: {error})")
    results = []
    quiet = 0.0
    for direction in case.directions:
        calls = {provider: both[direction] for provider, both in available.items()}
        for attempt in range(1, retries + 2):
            quiet = max(quiet, quiet_copy_gbps(copy, copy_bytes))  # the quietest the host was seen this case
            timed = time_rounds(calls, copy, rounds)
            rows = {}
            for provider, (call_times, copy_times, faults) in timed.items():
                copy_gbps = copy_bytes / statistics.median(copy_times) / 1e9
                rows[provider] = (call_times, copy_gbps, faults,
                                  disturbance(call_times, copy_gbps, quiet, copy_times))
            disturbed = [f"{provider}: {row[3]}" for provider, row in rows.items() if row[3]]
            if not disturbed:
                break
            log(f"  {direction} rounds disturbed (attempt {attempt} of {retries + 1}): " + " | ".join(disturbed))
        for provider, (call_times, copy_gbps, faults, reason) in rows.items():
            traffic, path = case.provider_traffic(direction, provider), case.path(provider)
            median = statistics.median(call_times)
            gbps = traffic / median / 1e9
            measurement = Measurement(shape_name, dtype_name, provider, direction, median * 1e3,
                                      _spread(call_times) * 1e3, min(call_times) * 1e3, traffic, gbps, copy_gbps,
                                      gbps / copy_gbps, faults, quiet, attempt, reason, path)
            results.append(measurement)
            log("  " + describe(measurement))
    return results


def describe(m: Measurement) -> str:
    """One result line; a disturbed measurement shows its times and why, never a fraction of the copy."""
    times = f"{m.provider:<15} {m.direction:<8} {m.median_ms:9.3f} ms ±{m.spread_ms:7.3f}"
    if not m.trusted:
        return f"{times}  DISTURBED, not a result: {m.disturbed}"
    return (f"{times}  {m.gbps:6.1f} GB/s  {m.fraction_of_copy:6.1%} of copy ({m.copy_gbps:.1f} GB/s paired, "
            f"{m.quiet_copy_gbps:.1f} quiet)  {m.page_faults_per_call:9.0f} faults/call")


def speedups(results: list[Measurement]) -> list[dict]:
    """Every provider's median against every other's, per path, shape, dtype and direction; only between trusted
    measurements (see `disturbance`)."""
    rows = []
    keyed = {(m.path, m.shape, m.dtype, m.direction, m.provider): m for m in results if m.trusted}
    for (path, shape, dtype, direction, provider), measurement in keyed.items():
        for other in PROVIDERS:
            baseline = keyed.get((path, shape, dtype, direction, other))
            if baseline is not None and other != provider:
                rows.append({"path": path, "shape": shape, "dtype": dtype, "direction": direction,
                             "provider": provider, "against": other,
                             "speedup": baseline.median_ms / measurement.median_ms})
    return rows


def goal_rows(results: list[Measurement], shapes: dict[str, tuple[int, int, int]]) -> list[dict]:
    """Per vector path, dtype and goal (GOALS) at GOAL_SHAPE: the fraction of the paired copy reached, and whether
    it meets the goal (None when the measurement was disturbed: no fraction to judge)."""
    rows = []
    for m in results:
        goal = GOALS.get((m.provider, m.direction))
        if goal is None or shapes.get(m.shape) != GOAL_SHAPE or m.path not in GOAL_PATHS:
            continue
        fraction = m.fraction_of_copy if m.trusted else None
        rows.append({"path": m.path, "dtype": m.dtype, "provider": m.provider, "direction": m.direction,
                     "goal": goal, "fraction_of_copy": fraction,
                     "met": None if fraction is None else fraction >= goal})
    return rows


def goal_table(rows: list[dict]) -> list[str]:
    """goal_rows as printed lines: a column per goal, a row per path and dtype."""
    columns = list(GOALS)
    cells = {(r["path"], r["dtype"], r["provider"], r["direction"]): r for r in rows}
    passes = {"forward": "fwd", "backward": "bwd"}
    header = "".join(f"{provider.removeprefix('op-')} {passes[direction]} >= {goal:.0%}".ljust(22)
                     for (provider, direction), goal in GOALS.items())
    lines = [f"goals at T={GOAL_SHAPE[0]} N={GOAL_SHAPE[1]} H={GOAL_SHAPE[2]}, fraction of the paired copy:",
             f"  {'path':<12}{'dtype':<10}{header}".rstrip()]
    for path, dtype in dict.fromkeys((r["path"], r["dtype"]) for r in rows):
        line = f"  {path:<12}{dtype:<10}"
        for provider, direction in columns:
            row = cells.get((path, dtype, provider, direction))
            if row is None:
                text = "not timed"
            elif row["met"] is None:
                text = "disturbed"
            else:
                text = f"{row['fraction_of_copy']:.0%} {'met' if row['met'] else 'NOT MET'}"
            line += text.ljust(22)
        lines.append(line.rstrip())
    return lines


OVERHEAD_KERNEL_MS = 1.0  # longer kernels: the overhead is lost in the kernel's own spread
OVERHEAD_ROUNDS = 1001
COMPILED_EAGER = "compiled-eager"  # torch.compile(backend="eager") of the op-eager calls


def call_overheads(results: list[Measurement], shapes: dict[str, tuple[int, int, int]],
                   rounds: int = OVERHEAD_ROUNDS) -> list[dict]:
    """Per-call time of each op path above the bare kernel, in microseconds, for every (shape, dtype) whose
    kernel is short enough (decode-like shapes) for the overhead to matter.

    Measured in rounds of (kernel, op path) calls and reported as the median of the per-round
    differences (single calls on a shared host spread by tens of microseconds, so the difference of
    two separately taken medians would be mostly noise), twice: `overhead_us` with the calls back to
    back (caches warm, as in a loop of this op alone) and `overhead_cold_us` with a copy of the value
    stack's size before every call (as after the rest of a model's step: the Python path then runs
    from cold caches and costs several times more).

    Where op-graph is measured, so is `compiled-eager`: the same calls under torch.compile with
    backend="eager" (the ops left as they are), i.e. what torch.compile itself (dynamo's guards and
    frame handling) costs a call of these ops; op-graph's overhead includes it."""
    keyed = {(m.shape, m.dtype, m.direction, m.provider): m for m in results}
    short = sorted({(m.shape, m.dtype) for m in results
                    if m.provider == "kernel" and m.trusted and m.median_ms < OVERHEAD_KERNEL_MS})
    rows = []
    path = kernel_path()
    for shape, dtype in short:
        case = Case(shapes[shape], DTYPES[dtype])
        source = torch.randn(case.inputs[1].numel()).to(DTYPES[dtype])
        copy = functools.partial(torch.empty_like(source).copy_, source)
        paths = [name for name in ("op-eager", "op-graph") if (shape, dtype, "forward", name) in keyed]
        providers = {name: case.provider(name) for name in ["kernel", *paths]}
        if "op-graph" in paths:
            providers[COMPILED_EAGER] = case.compiled_ops("eager")
        for direction in ("forward", "backward"):
            calls = {name: provider[direction] for name, provider in providers.items()}
            warm = paired_differences(calls, "kernel", None, rounds)
            cold = paired_differences(calls, "kernel", copy, rounds)
            rows += [{"path": path, "shape": shape, "dtype": dtype, "direction": direction, "provider": name,
                      "overhead_us": 1e6 * statistics.median(warm[name]),
                      "overhead_cold_us": 1e6 * statistics.median(cold[name])} for name in warm]
    return rows


def paired_differences(calls: dict[str, Callable[[], object]], baseline: str, copy: Callable[[], object] | None,
                       rounds: int, warmup: int = 20) -> dict[str, list[float]]:
    """Per round, each call (after a copy, if given); each other call's time minus the baseline's that round."""
    for _ in range(warmup):
        for call in calls.values():
            call()
    differences = {name: [] for name in calls if name != baseline}
    for _ in range(rounds):
        times = {}
        for name, call in calls.items():
            if copy is not None:
                copy()
            start = time.perf_counter()
            result = call()
            times[name] = time.perf_counter() - start
            del result
        for name in differences:
            differences[name].append(times[name] - times[baseline])
    return differences


def kernel_path() -> str:
    """What runs the kernels now: the native kernels' instruction set path, or "python"."""
    from attnres_ge.op_kernel import active_implementation

    if active_implementation() != "native":
        return "python"
    from attnres_ge.op_kernel import native  # importable only where the native kernels were built

    return native.isa_path()


def paths_to_time(names: list[str] | None) -> list[str]:
    """--paths as a list of the native kernels' paths (ALL_PATHS: every one this CPU runs); [] for the path
    the kernels run on now. ValueError naming what this CPU runs when a path cannot be timed."""
    if not names:
        return []
    from attnres_ge.op_kernel import active_implementation

    if active_implementation() != "native":
        raise ValueError("--paths needs the native kernels; the kernels running now are the Python ones")
    from attnres_ge.op_kernel import native

    available = list(native.available_isa_paths())
    if ALL_PATHS in names:
        return available
    unknown = [name for name in names if name not in available]
    if unknown:
        raise ValueError(f"--paths: this CPU cannot run {', '.join(unknown)}; it runs {', '.join(available)}")
    return list(dict.fromkeys(names))


def kernel_threads() -> int:
    """Threads a large call of the kernels runs on: the host's usable cores, at most torch.get_num_threads()."""
    from attnres_ge.op_host.platform import host_profile

    return min(host_profile().vector_core_num, torch.get_num_threads())


def machine() -> dict:
    from attnres_ge.op_kernel import active_implementation, describe_implementation

    info = {"python": sys.version.split()[0], "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "kernel_threads": kernel_threads(), "kernels": active_implementation(),
            "kernel_path": describe_implementation(),
            "machine": host_platform.machine(), "processor": host_platform.processor()}
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            names = [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")]
        info["cpu"] = f"{len(names)} x {names[0]}" if names else ""
    except OSError:
        pass
    for name, path in (("thp", "/sys/kernel/mm/transparent_hugepage/enabled"),):
        try:
            with open(path) as handle:
                info[name] = handle.read().strip()
        except OSError:
            pass
    # Whether torch puts large allocations (the inputs) in huge pages: it changes the ops' time from memory
    # (docs/memory.md, "Your inputs' pages").
    info["torch_huge_page_allocs"] = os.environ.get("THP_MEM_ALLOC_ENABLE", "0") == "1"
    return info


BASELINES = ("torch-eager", "torch-inductor")


def plot(results: list[Measurement], path: str) -> bool:
    """A PNG, one row per (path, shape, dtype): milliseconds of every provider, our providers' speedup over
    torch-eager and inductor, and the fraction of the paired copy; disturbed measurements are left out
    (their bars are missing and marked). False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    groups = list(dict.fromkeys((m.path, m.shape, m.dtype) for m in results))
    figure, axes = plt.subplots(len(groups), 3, figsize=(16, 3.6 * len(groups)), squeeze=False)
    for row, (isa_path, shape, dtype) in zip(axes, groups, strict=True):
        group = [m for m in results if (m.path, m.shape, m.dtype) == (isa_path, shape, dtype)]
        name = f"{shape} {dtype}" + (f" ({isa_path})" if isa_path else "")
        _bars(row[0], group, lambda m: m.median_ms, "median ms (log)", log=True)
        row[0].set_title(f"{name}: time per call")
        _speedup_bars(row[1], group)
        row[1].set_title(f"{name}: speedup of our ops")
        ours = (*OUR_PROVIDERS, READ, *TWO_PHASE_PROVIDERS, *BLOCK_PROVIDERS)
        _bars(row[2], [m for m in group if m.provider in ours], lambda m: 100 * m.fraction_of_copy,
              "% of paired copy")
        row[2].axhline(100, color="grey", linewidth=0.8, linestyle="--")
        row[2].set_title(f"{name}: fraction of the paired copy")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def _bars(axis, measurements: list[Measurement], value: Callable[[Measurement], float], label: str,
          log: bool = False) -> None:
    """Forward and backward bars side by side per provider; a disturbed measurement shows as a red 'x'."""
    providers = list(dict.fromkeys(m.provider for m in measurements))
    for offset, direction, color in ((-0.2, "forward", "C0"), (0.2, "backward", "C1")):
        for index, provider in enumerate(providers):
            found = [m for m in measurements if (m.provider, m.direction) == (provider, direction)]
            if not found:
                continue
            if found[0].trusted:
                axis.bar(index + offset, value(found[0]), width=0.4, color=color,
                         label=direction if index == 0 else None)
            else:  # at the foot of the axis whatever its scale
                axis.text(index + offset, 0.02, "x", color="red", ha="center", transform=axis.get_xaxis_transform())
    axis.set_xticks(range(len(providers)), providers, fontsize=8)
    axis.set_ylabel(label)
    if log:
        axis.set_yscale("log")
    axis.legend(fontsize=7)


def _speedup_bars(axis, measurements: list[Measurement]) -> None:
    """Each of our providers' speedup over each PyTorch baseline, forward and backward (trusted pairs only)."""
    keyed = {(m.provider, m.direction): m for m in measurements if m.trusted}
    labels, values, colors = [], [], []
    for provider in OUR_PROVIDERS:
        for baseline in BASELINES:
            for direction, color in (("forward", "C0"), ("backward", "C1")):
                ours, theirs = keyed.get((provider, direction)), keyed.get((baseline, direction))
                if ours is not None and theirs is not None:
                    labels.append(f"{provider}\nvs {baseline.removeprefix('torch-')}\n{direction[:3]}")
                    values.append(theirs.median_ms / ours.median_ms)
                    colors.append(color)
    axis.bar(range(len(values)), values, color=colors)
    for index, speedup in enumerate(values):
        axis.annotate(f"{speedup:.1f}x", (index, speedup), ha="center", va="bottom", fontsize=7)
    axis.set_xticks(range(len(values)), labels, fontsize=6)
    axis.axhline(1, color="grey", linewidth=0.8, linestyle="--")
    axis.set_ylabel("speedup (x)")


def named_shape(text: str) -> tuple[str, tuple[int, int, int]]:
    """`T,N,H` -> ("T{T}_N{N}_H{H}", (T, N, H)); the forward needs T, N and H of at least 1."""
    from attnres_ge.cli import parse_shape

    tokens, blocks, hidden = parse_shape(text)
    if min(tokens, blocks, hidden) < 1:
        raise argparse.ArgumentTypeError(f"bench --shape needs T, N and H of at least 1, got {text!r}")
    return f"T{tokens}_N{blocks}_H{hidden}", (tokens, blocks, hidden)


def select_shapes(args: argparse.Namespace) -> dict[str, tuple[int, int, int]]:
    """The per-layer op's shapes of the run; sets args.two_phase_shapes, args.block_shapes and
    args.stream_shapes. Named shapes pick their suite; with neither --shapes nor --shape, every suite's default
    shapes; --all-blocks adds every block shape."""
    default = [*SHAPES, *TWO_PHASE_SHAPES, *DEFAULT_BLOCK_SHAPES, *STREAM_SHAPES]
    names = list(args.shapes or ([] if args.shape else default))
    if args.all_blocks:
        names += list(BLOCK_SHAPES)
    args.two_phase_shapes = {name: TWO_PHASE_SHAPES[name] for name in names if name in TWO_PHASE_SHAPES}
    args.block_shapes = {name: BLOCK_SHAPES[name] for name in names if name in BLOCK_SHAPES}
    args.stream_shapes = {name: STREAM_SHAPES[name] for name in names if name in STREAM_SHAPES}
    shapes = {name: SHAPES[name] for name in names if name in SHAPES}
    shapes.update(args.shape)
    return shapes


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnres-ge bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=None, metavar="NAME",
                        choices=[*SHAPES, *TWO_PHASE_SHAPES, *BLOCK_SHAPES, *STREAM_SHAPES],
                        help=f"named shapes to time: the per-layer op's {', '.join(SHAPES)} (T_N_H); the two-phase "
                             f"ops' {', '.join(TWO_PHASE_SHAPES)} (T_N_S_D); blocks block_T{{4096,16,1}}_N{{8,32}}_"
                             f"D{{2048,7168}}_R{BLOCK_READS}; the stream's {', '.join(STREAM_SHAPES)} (T_D_layers_"
                             f"layers per block) (default: all per-layer, two-phase and stream shapes and the blocks "
                             f"{', '.join(DEFAULT_BLOCK_SHAPES)}, unless --shape is given)")
    parser.add_argument("--all-blocks", action="store_true",
                        help=f"also time every block shape ({len(BLOCK_SHAPES)}), not only the chosen ones")
    parser.add_argument("--shape", action="append", type=named_shape, default=[], metavar="T,N,H",
                        help="a shape of your own (tokens, blocks, hidden); repeat for several")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=list(DTYPES),
                        help="dtypes to time (default: float32 bfloat16)")
    parser.add_argument("--providers", nargs="+", default=list(ALL_PROVIDERS), choices=list(ALL_PROVIDERS),
                        metavar="PROVIDER", help=f"what to time: the per-layer op's {', '.join(PROVIDERS)}; the "
                                                 f"two-phase ops' {', '.join(TWO_PHASE_PROVIDERS)}; a block's "
                                                 f"{', '.join(BLOCK_PROVIDERS)}; the stream's "
                                                 f"{', '.join(STREAM_PROVIDERS)} (default: all)")
    parser.add_argument("--paths", nargs="+", default=None, metavar="PATH",
                        help="instruction set paths of the native kernels to time, one after the other in this run "
                             f"(scalar, avx2, avx512, avx512bf16, or {ALL_PATHS}: every path this CPU runs; "
                             "default: the path the kernels run on)")
    parser.add_argument("--rounds", type=int, default=0,
                        help="timed rounds per measurement (default: 7 for large shapes, 101 for small ones)")
    parser.add_argument("--retries", type=int, default=2,
                        help="times disturbed rounds are run again before the measurement is flagged (default: 2)")
    parser.add_argument("--overhead-rounds", type=int, default=OVERHEAD_ROUNDS,
                        help=f"paired rounds for the per-call overheads of short kernels (default: {OVERHEAD_ROUNDS})")
    parser.add_argument("--json", metavar="FILE", help="write the measurements, speedups and machine here")
    parser.add_argument("--plot", metavar="FILE",
                        help="write a PNG here: milliseconds, speedup over PyTorch and %% of copy (needs matplotlib)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    shapes = select_shapes(args)

    import attnres_ge  # noqa: F401  (registers the torch ops)

    try:
        paths = paths_to_time(args.paths)
    except ValueError as error:
        build_parser().error(str(error))
    results, overheads, blocks = [], [], []
    about = machine()
    print(f"machine: {about}")
    for index, path in enumerate(paths or [None]):
        path_results, path_overheads, path_blocks = time_on_path(path, shapes, args, later_path=index > 0)
        results += path_results
        overheads += path_overheads
        blocks += path_blocks
    ratios = speedups(results)
    for row in ratios:
        if row["provider"] in OUR_PROVIDERS and row["against"] not in OUR_PROVIDERS:
            print(f"  {row['path']} {row['shape']} {row['dtype']} {row['direction']}: {row['provider']} "
                  f"{row['speedup']:.2f}x vs {row['against']}")
    flagged = [m for m in results if not m.trusted]
    if flagged:
        print(f"{len(flagged)} measurement(s) stayed disturbed after {args.retries} rerun(s) and are not results: "
              + ", ".join(f"{m.path} {m.shape} {m.dtype} {m.provider} {m.direction}" for m in flagged))
    for row in overheads:
        label = "torch.compile(backend='eager') of op-eager" if row["provider"] == COMPILED_EAGER else row["provider"]
        print(f"  {row['path']} {row['shape']} {row['dtype']} {row['direction']}: {label} costs "
              f"{row['overhead_us']:.1f} us per call above the kernel back to back, "
              f"{row['overhead_cold_us']:.1f} us after a copy")
    goals = goal_rows(results, shapes)
    if goals:
        print("\n".join(goal_table(goals)))
    if blocks:
        print("\n".join(block_table(blocks)))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"machine": about, "results": [{**asdict(m), "trusted": m.trusted} for m in results],
                       "speedups": ratios, "overheads": overheads, "goals": goals, "blocks": blocks}, handle,
                      indent=1)
        print(f"wrote {args.json}")
    if args.plot:
        print(f"wrote {args.plot}" if plot(results, args.plot) else "--plot needs matplotlib; no chart written")
    return 0


def time_on_path(path: str | None, shapes: dict[str, tuple[int, int, int]], args: argparse.Namespace,
                 later_path: bool = False) -> tuple[list[Measurement], list[dict], list[dict]]:
    """time_cases with the native kernels on `path`, then back on the path they ran on before; None: on the
    kernels as they run now."""
    if path is None:
        return time_cases(shapes, args)
    from attnres_ge.op_kernel import native

    before = native.isa_path()
    native.use_isa_path(path)
    try:
        return time_cases(shapes, args, later_path)
    finally:
        native.use_isa_path(before)


def time_cases(shapes: dict[str, tuple[int, int, int]], args: argparse.Namespace,
               later_path: bool = False) -> tuple[list[Measurement], list[dict], list[dict]]:
    """Every shape and dtype of the run on the kernels as they run now: the measurements, the per-call overheads
    of the short ones, and the block rows (block_rows). On a later path of --paths the two-phase ops are not
    timed again while they run Python kernels (the path does not change them)."""
    from attnres_ge.op_kernel import describe_implementation

    print(f"kernels: {describe_implementation()}, {kernel_threads()} kernel threads, "
          f"{torch.get_num_threads()} torch threads; two-phase kernels: {two_phase_path()}")
    results = []
    providers = [name for name in args.providers if name in PROVIDERS]
    for shape_name, shape in shapes.items() if providers else ():
        rounds = rounds_for(shape[0] * shape[1] * shape[2], args)
        for dtype_name in args.dtypes:
            print(f"{shape_name} {dtype_name} ({rounds} rounds)")
            results += measure(shape_name, shape, dtype_name, providers, rounds, args.retries)
    overheads = call_overheads(results, shapes, args.overhead_rounds)
    if not (later_path and two_phase_path() == "python"):
        results += time_suite(TwoPhaseCase, args.two_phase_shapes, TWO_PHASE_PROVIDERS, args)
    blocks = time_suite(BlockCase, args.block_shapes, BLOCK_PROVIDERS, args)
    streams = time_suite(StreamCase, args.stream_shapes, STREAM_PROVIDERS, args)
    return results + blocks + streams, overheads, block_rows(blocks, BLOCK_PROVIDERS) + block_rows(streams,
                                                                                               STREAM_PROVIDERS)


def rounds_for(elements: int, args: argparse.Namespace) -> int:
    """--rounds, or 7 rounds where the snapshots hold 2^24 elements (T x N x H) or more and 101 for fewer."""
    return args.rounds or (7 if elements >= 1 << 24 else 101)


def time_suite(case_type, shapes: dict[str, tuple[int, ...]], suite_providers: tuple[str, ...],
               args: argparse.Namespace) -> list[Measurement]:
    """The two-phase ops' or the blocks' shapes (float32 only), with the --providers of this suite."""
    providers = [name for name in args.providers if name in suite_providers]
    results = []
    for shape_name, shape in shapes.items() if providers else ():
        case = case_type(shape)
        rounds = rounds_for(case.copy_elements(), args)
        print(f"{shape_name} float32 ({rounds} rounds)")
        results += measure_case(case, shape_name, "float32", providers, rounds, args.retries)
    return results


def block_rows(results: list[Measurement], providers: tuple[str, str]) -> list[dict]:
    """Per block or stream shape timed both ways (`providers`: per-layer, two-phase; trusted only): the two-phase
    speedup over the per-layer reads, beside the ratio the traffic model predicts."""
    keyed = {(m.shape, m.provider): m for m in results if m.trusted}
    rows = []
    for shape in dict.fromkeys(m.shape for m in results):
        per_layer, two_phase = keyed.get((shape, providers[0])), keyed.get((shape, providers[1]))
        if per_layer is None or two_phase is None:
            continue
        rows.append({"shape": shape, "per_layer_path": per_layer.path, "two_phase_path": two_phase.path,
                     "per_layer_ms": per_layer.median_ms, "two_phase_ms": two_phase.median_ms,
                     "speedup": per_layer.median_ms / two_phase.median_ms,
                     "traffic_ratio": per_layer.traffic_bytes / two_phase.traffic_bytes})
    return rows


def block_table(rows: list[dict]) -> list[str]:
    """block_rows as printed lines."""
    lines = ["one block (R reads between two seals) or one forward of the stream, two-phase against per-layer reads:"]
    for row in rows:
        lines.append(f"  {row['shape']:<26} per-layer ({row['per_layer_path']}) {row['per_layer_ms']:10.3f} ms  "
                     f"two-phase ({row['two_phase_path']}) {row['two_phase_ms']:10.3f} ms  "
                     f"speedup {row['speedup']:6.2f}x  (traffic model {row['traffic_ratio']:.2f}x)")
    return lines


if __name__ == "__main__":
    sys.exit(main())
