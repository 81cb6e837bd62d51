"""Per-call overhead of the per-layer op's paths above the bare kernel, for short (decode-like) kernels.

For short kernels each op path's per-call overhead above the kernel is reported, and beside op-graph's the
overhead of the same calls under torch.compile with backend="eager" (what torch.compile itself costs a call of
these ops), measured in the same rounds: op-graph's overhead includes it.
"""

from __future__ import annotations

import functools
import statistics

import torch

from attnres_ge.bench.cases.per_layer import Case
from attnres_ge.bench.harness import Measurement, paired_differences
from attnres_ge.bench.paths import kernel_path
from attnres_ge.shapes import DTYPES

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


def overhead_lines(rows: list[dict]) -> list[str]:
    """call_overheads as printed lines."""
    lines = []
    for row in rows:
        label = "torch.compile(backend='eager') of op-eager" if row["provider"] == COMPILED_EAGER else row["provider"]
        lines.append(f"  {row['path']} {row['shape']} {row['dtype']} {row['direction']}: {label} costs "
                     f"{row['overhead_us']:.1f} us per call above the kernel back to back, "
                     f"{row['overhead_cold_us']:.1f} us after a copy")
    return lines
