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
  torch-eager    the plain formula (concatenate, RMS-norm, softmax, weighted sum) and its autograd
  torch-inductor torch.compile of a concatenation-free formula, forward and autograd backward

For short kernels (decode-like shapes) each op path's per-call overhead above the kernel is
reported, and beside op-graph's the overhead of the same calls under torch.compile with
backend="eager" (what torch.compile itself costs a call of these ops), measured in the same
rounds: op-graph's overhead includes it.

    attnres-ge bench [--shapes NAME ...] [--dtypes float32 bfloat16] [--providers ...] [--json F] [--plot F]
"""

from __future__ import annotations

import argparse
import functools
import json
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
PROVIDERS = ("op-eager", "op-graph", "kernel", "torch-eager", "torch-inductor")
OUR_PROVIDERS = ("op-eager", "op-graph", "kernel")
NORM_EPS = 1e-6


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
        from .op_host import block_attention_residuals_grad_tiling as grad_tiling
        from .op_host import block_attention_residuals_tiling as forward_tiling
        from .op_host.runtime import default_runtime
        from .op_kernel import KERNELS

        tokens, blocks, hidden = self.shape
        platform = default_runtime().platform
        platform.requery()
        forward = forward_tiling.tiling(forward_tiling.parse(platform), tokens, blocks, hidden, self.dtype, NORM_EPS,
                                        True, platform)
        backward = grad_tiling.tiling(grad_tiling.parse(platform), tokens, blocks, hidden, self.dtype, platform)
        stats = (tokens, blocks + 1)
        forward_out = (torch.empty_like(self.inputs[0]), torch.empty(stats), torch.empty(stats))
        backward_out = tuple(torch.empty_like(t) for t in self.inputs)
        workspace = torch.empty(max(forward.workspace_size, backward.workspace_size), dtype=torch.uint8)
        # Launched as the runtime launches them: a record prepared once, no per-call checks.
        _, forward_launch = KERNELS.launch("BlockAttentionResiduals", forward.data, self.dtype)
        _, backward_launch = KERNELS.launch("BlockAttentionResidualsGrad", backward.data, self.dtype)
        backward_inputs = (*self.inputs, self.grad_hidden, self.inv_norm, self.probs)
        return {
            "forward": lambda: forward_launch(self.inputs, forward_out, workspace),
            "backward": lambda: backward_launch(backward_inputs, backward_out, workspace),
        }

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


def measure(shape_name: str, dtype_name: str, providers, rounds: int, log=print) -> list[Measurement]:
    shape, dtype = SHAPES[shape_name], DTYPES[dtype_name]
    case = Case(shape, dtype)
    tokens, blocks, hidden = shape
    source = torch.randn(tokens * (blocks + 1) * hidden).to(dtype)  # the value stack's size
    target = torch.empty_like(source)
    copy_bytes = 2 * source.nbytes
    available = {}
    for provider in providers:
        try:
            available[provider] = case.provider(provider)
        except Exception as error:  # e.g. inductor without a compiler: report, keep going
            log(f"  {provider}: unavailable ({type(error).__name__}: {error})")
    results = []
    for direction in ("forward", "backward"):
        calls = {provider: both[direction] for provider, both in available.items()}
        timed = time_rounds(calls, lambda: target.copy_(source), rounds)
        for provider, (call_times, copy_times, faults) in timed.items():
            median, copy_median = statistics.median(call_times), statistics.median(copy_times)
            traffic = case.traffic(direction)
            copy_gbps = copy_bytes / copy_median / 1e9
            gbps = traffic / median / 1e9
            results.append(Measurement(shape_name, dtype_name, provider, direction, median * 1e3,
                                       _spread(call_times) * 1e3, min(call_times) * 1e3, traffic, gbps, copy_gbps,
                                       gbps / copy_gbps, faults))
            log(f"  {provider:<15} {direction:<8} {median * 1e3:9.3f} ms ±{_spread(call_times) * 1e3:7.3f}  "
                f"{gbps:6.1f} GB/s  {gbps / copy_gbps:6.1%} of copy ({copy_gbps:.1f} GB/s)  "
                f"{faults:9.0f} faults/call")
    return results


def speedups(results: list[Measurement]) -> list[dict]:
    """Every provider's median against every other's, per shape, dtype and direction."""
    rows = []
    keyed = {(m.shape, m.dtype, m.direction, m.provider): m for m in results}
    for (shape, dtype, direction, provider), measurement in keyed.items():
        for other in PROVIDERS:
            baseline = keyed.get((shape, dtype, direction, other))
            if baseline is not None and other != provider:
                rows.append({"shape": shape, "dtype": dtype, "direction": direction, "provider": provider,
                             "against": other, "speedup": baseline.median_ms / measurement.median_ms})
    return rows


OVERHEAD_KERNEL_MS = 1.0  # longer kernels: the overhead is lost in the kernel's own spread
OVERHEAD_ROUNDS = 1001
COMPILED_EAGER = "compiled-eager"  # torch.compile(backend="eager") of the op-eager calls


def call_overheads(results: list[Measurement], rounds: int = OVERHEAD_ROUNDS) -> list[dict]:
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
                    if m.provider == "kernel" and m.median_ms < OVERHEAD_KERNEL_MS})
    rows = []
    for shape, dtype in short:
        case = Case(SHAPES[shape], DTYPES[dtype])
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
            rows += [{"shape": shape, "dtype": dtype, "direction": direction, "provider": name,
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


def machine() -> dict:
    info = {"python": sys.version.split()[0], "torch": torch.__version__, "threads": torch.get_num_threads(),
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
    from .op_kernel import active_implementation

    info["kernels"] = active_implementation()
    return info


def plot(results: list[Measurement], path: str) -> bool:
    """A PNG bar chart of the fraction of paired copy; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    groups = sorted({(m.shape, m.dtype) for m in results})
    figure, axes = plt.subplots(len(groups), 1, figsize=(10, 3.2 * len(groups)), squeeze=False)
    for axis, (shape, dtype) in zip(axes[:, 0], groups, strict=True):
        labels, values = [], []
        for m in results:
            if (m.shape, m.dtype) == (shape, dtype):
                labels.append(f"{m.provider}\n{m.direction}")
                values.append(100 * m.fraction_of_copy)
        axis.bar(range(len(values)), values, color=["C0" if "backward" not in x else "C1" for x in labels])
        axis.set_xticks(range(len(values)), labels, fontsize=7)
        axis.axhline(100, color="grey", linewidth=0.8, linestyle="--")
        axis.set_ylabel("% of paired copy")
        axis.set_title(f"{shape} {dtype}")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attnres-ge bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=list(DTYPES))
    parser.add_argument("--providers", nargs="+", default=list(PROVIDERS), choices=list(PROVIDERS))
    parser.add_argument("--rounds", type=int, default=0, help="timed pairs per measurement (default: by shape)")
    parser.add_argument("--json", metavar="FILE", help="write the measurements, speedups and machine here")
    parser.add_argument("--plot", metavar="FILE", help="write a PNG bar chart here (needs matplotlib)")
    args = parser.parse_args(argv)

    import attnres_ge  # noqa: F401  (registers the torch ops)

    results = []
    about = machine()
    print(f"machine: {about}")
    for shape_name in args.shapes:
        tokens, blocks, hidden = SHAPES[shape_name]
        rounds = args.rounds or (7 if tokens * blocks * hidden >= 1 << 24 else 101)
        for dtype_name in args.dtypes:
            print(f"{shape_name} {dtype_name} ({rounds} rounds)")
            results += measure(shape_name, dtype_name, args.providers, rounds)
    ratios = speedups(results)
    for row in ratios:
        if row["provider"] in OUR_PROVIDERS and row["against"] not in OUR_PROVIDERS:
            print(f"  {row['shape']} {row['dtype']} {row['direction']}: {row['provider']} "
                  f"{row['speedup']:.2f}x vs {row['against']}")
    overheads = call_overheads(results)
    for row in overheads:
        label = "torch.compile(backend='eager') of op-eager" if row["provider"] == COMPILED_EAGER else row["provider"]
        print(f"  {row['shape']} {row['dtype']} {row['direction']}: {label} costs "
              f"{row['overhead_us']:.1f} us per call above the kernel back to back, "
              f"{row['overhead_cold_us']:.1f} us after a copy")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"machine": about, "results": [asdict(m) for m in results], "speedups": ratios,
                       "overheads": overheads}, handle, indent=1)
        print(f"wrote {args.json}")
    if args.plot:
        print(f"wrote {args.plot}" if plot(results, args.plot) else "--plot needs matplotlib; no chart written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
