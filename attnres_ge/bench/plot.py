"""--plot: a PNG of a run's measurements, one row per (path, shape, dtype)."""

from __future__ import annotations

from collections.abc import Callable

from attnres_ge.bench.cases.block import BLOCK_PROVIDERS
from attnres_ge.bench.cases.per_layer import BASELINES, OUR_PROVIDERS, READ
from attnres_ge.bench.cases.read import OUR_READ_PROVIDERS
from attnres_ge.bench.cases.two_phase import TWO_PHASE_PROVIDERS
from attnres_ge.bench.harness import Measurement


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
        ours = (*OUR_PROVIDERS, READ, *TWO_PHASE_PROVIDERS, *BLOCK_PROVIDERS, *OUR_READ_PROVIDERS)
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
