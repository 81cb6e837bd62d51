"""What a run reports beyond its result lines: speedups, the goal table, the block and stream table, the machine.

--paths times everything on several of the native kernels' instruction set paths, one after the other in the
same run. Where the goals' shape (GOAL_SHAPE) was timed, a table closes the run: per path and dtype, op-graph's
and op-eager's fraction of the paired copy against GOALS; where a read shape was timed, one per shape and dtype of
the read's ratios against READ_GOALS; where an inkling2-model shape was timed, one of the patched model's speedup
over the stock one (no goal).
"""

from __future__ import annotations

import os
import platform as host_platform
import sys

import torch

from attnres_ge.bench.cases.per_layer import PROVIDERS
from attnres_ge.bench.harness import Measurement
from attnres_ge.bench.paths import kernel_threads

# The project's speed goals: the least fraction of the paired copy per (provider, direction), at GOAL_SHAPE,
# on the vector paths (the scalar path is the portable fallback and has none).
GOAL_SHAPE = (4096, 8, 2048)
GOAL_PATHS = ("avx2", "avx512", "avx512bf16")
GOALS = {("op-graph", "forward"): 0.90, ("op-graph", "backward"): 0.80,
         ("op-eager", "forward"): 0.80, ("op-eager", "backward"): 0.60}

# The general read's goals (cases/read.py), per read shape and dtype: (provider, against) -> the least ratio.
# Against COPY the ratio is the provider's fraction of the paired copy, against another provider that one's median
# time over this one's (a speedup). READ_GOAL_DTYPES limits a goal to some dtypes; elsewhere its ratio is shown
# without a verdict.
COPY = "copy"
READ_GOALS = {("op", COPY): 0.80, ("op", "hf-eager"): 10.0, ("op", "hf-inductor"): 10.0, ("fused", "unfused"): 1.15}
READ_GOAL_DTYPES = {("fused", "unfused"): ("bfloat16",)}


def speedups(results: list[Measurement]) -> list[dict]:
    """Every provider's median against every other's, per path, shape, dtype and direction; only between trusted
    measurements (see harness.disturbance)."""
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
            line += _goal_cell(cells.get((path, dtype, provider, direction))).ljust(22)
        lines.append(line.rstrip())
    return lines


def _goal_cell(row: dict | None) -> str:
    if row is None:
        return "not timed"
    if row["met"] is None:
        return "disturbed"
    return f"{row['fraction_of_copy']:.0%} {'met' if row['met'] else 'NOT MET'}"


def read_goal_rows(results: list[Measurement], read_shapes) -> list[dict]:
    """Per path, read shape (among `read_shapes`, names) and dtype, each READ_GOALS ratio whose providers were
    timed: the ratio from this run's medians (None when a measurement of it was disturbed), its goal (None where
    READ_GOAL_DTYPES leaves this dtype out) and whether it is met (None without a ratio or a goal)."""
    keyed = {(m.path, m.shape, m.dtype, m.provider): m for m in results if m.shape in read_shapes}
    rows = []
    for path, shape, dtype in dict.fromkeys(key[:3] for key in keyed):
        for (provider, against), goal in READ_GOALS.items():
            ours, theirs = keyed.get((path, shape, dtype, provider)), keyed.get((path, shape, dtype, against))
            if ours is None or (theirs is None and against != COPY):
                continue
            ratio = _read_ratio(ours, theirs)
            goal = goal if dtype in READ_GOAL_DTYPES.get((provider, against), (dtype,)) else None
            rows.append({"path": path, "shape": shape, "dtype": dtype, "provider": provider, "against": against,
                         "ratio": ratio, "goal": goal,
                         "met": None if ratio is None or goal is None else ratio >= goal})
    return rows


def _read_ratio(ours: Measurement, theirs: Measurement | None) -> float | None:
    """ours' fraction of the paired copy (theirs None), or theirs' median over ours; None from a disturbed one."""
    if not ours.trusted or (theirs is not None and not theirs.trusted):
        return None
    return ours.fraction_of_copy if theirs is None else theirs.median_ms / ours.median_ms


def read_goal_table(rows: list[dict]) -> list[str]:
    """read_goal_rows as printed lines: a column per goal, a row per path, shape and dtype."""
    cells = {(r["path"], r["shape"], r["dtype"], r["provider"], r["against"]): r for r in rows}
    header = "".join(_read_goal_name(provider, against, goal).ljust(24)
                     for (provider, against), goal in READ_GOALS.items())
    lines = ["the general read's goals (op: Inkling2's read, fused: FLA's with its output norm):",
             f"  {'path':<12}{'shape':<24}{'dtype':<10}{header}".rstrip()]
    for path, shape, dtype in dict.fromkeys((r["path"], r["shape"], r["dtype"]) for r in rows):
        line = f"  {path:<12}{shape:<24}{dtype:<10}"
        for provider, against in READ_GOALS:
            line += _read_goal_cell(cells.get((path, shape, dtype, provider, against))).ljust(24)
        lines.append(line.rstrip())
    return lines


def _read_goal_name(provider: str, against: str, goal: float) -> str:
    return f"{provider} >= {goal:.0%} of copy" if against == COPY else f"{provider} >= {goal:g}x {against}"


def _read_goal_cell(row: dict | None) -> str:
    if row is None:
        return "not timed"
    if row["ratio"] is None:
        return "disturbed"
    ratio = f"{row['ratio']:.0%}" if row["against"] == COPY else f"{row['ratio']:.2f}x"
    if row["goal"] is None:
        return f"{ratio} (no goal)"
    return f"{ratio} {'met' if row['met'] else 'NOT MET'}"


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


def model_rows(results: list[Measurement], model_shapes) -> list[dict]:
    """Per path and inkling2-model shape (among `model_shapes`, names) where both providers were timed: their
    medians and patched's speedup over stock; None for a disturbed median and any ratio from it."""
    keyed = {(m.path, m.shape, m.provider): m for m in results if m.shape in model_shapes}
    rows = []
    for path, shape in dict.fromkeys(key[:2] for key in keyed):
        stock, patched = keyed.get((path, shape, "stock")), keyed.get((path, shape, "patched"))
        if stock is None or patched is None:
            continue
        stock_ms, patched_ms = (m.median_ms if m.trusted else None for m in (stock, patched))
        rows.append({"path": path, "shape": shape, "stock_ms": stock_ms, "patched_ms": patched_ms,
                     "speedup": None if None in (stock_ms, patched_ms) else stock_ms / patched_ms})
    return rows


def model_table(rows: list[dict]) -> list[str]:
    """model_rows as printed lines."""
    lines = ["a tiny Inkling2 model, patched (its reads on fused_attnres) against stock, float32, no goal:"]
    for row in rows:
        stock, patched = ("disturbed" if ms is None else f"{ms:.3f} ms" for ms in (row["stock_ms"], row["patched_ms"]))
        speedup = "-" if row["speedup"] is None else f"{row['speedup']:.2f}x"
        lines.append(f"  {row['path']:<12}{row['shape']:<30} stock {stock:>13}  patched {patched:>13}  "
                     f"speedup {speedup}")
    return lines


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
