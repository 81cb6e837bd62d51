"""The timing harness: rounds of calls each after a paired copy, the quiet copy, and when rounds were disturbed.

Block AttnRes is memory-bound, so every figure is taken against a `copy_` timed right beside it (the "paired
copy": the host's memory speed drifts during a run, so a figure from earlier in the run is no yardstick).

A measurement is trusted only when its rounds were quiet: before the rounds the copy is also timed alone, back to
back ("quiet copy"); when the copies paired with a provider ran at less than DISTURBED_COPY_FRACTION of that
rate, a provider's spread (interquartile range) is as large as its median (DISTURBED_SPREAD_TO_MEDIAN), or the
ratio of its call's time to its copy's, round by round, spreads by DISTURBED_ROUND_RATIO_SPREAD of its median (the
two saw different hosts), the rounds are run again (--retries times), and if they stay disturbed the measurement
is flagged: its fraction of the copy and the speedups from it are not printed, plotted or written as results (the
JSON keeps its raw times with the flag).

A call that uses up state (a model's decode step, its KV cache) carries a `prepare` attribute: run before each of
its calls, before the paired copy and outside the timed region, so that every timed call starts from the same state.
"""

from __future__ import annotations

import functools
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

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


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def time_rounds(calls: dict[str, Callable[[], object]], copy: Callable[[], object], rounds: int,
                warmup: int = 2) -> dict[str, tuple[list[float], list[float], float]]:
    """Per call: (call times, copy times, minor page faults per call). Each round times every call right
    after a copy of its own, so all of them, and their copies, see the host as it is during that round."""
    for _ in range(warmup):
        for call in calls.values():
            _prepare(call)
            copy()
            call()
    call_times = {name: [] for name in calls}
    copy_times = {name: [] for name in calls}
    faults = dict.fromkeys(calls, 0)
    for _ in range(rounds):
        for name, call in calls.items():
            _prepare(call)
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


def _prepare(call: Callable[[], object]) -> None:
    """Run the call's `prepare`, where it has one (module docstring)."""
    prepare = getattr(call, "prepare", None)
    if prepare is not None:
        prepare()


def spread(times: list[float]) -> float:
    """The interquartile range (the whole range for fewer than four times)."""
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
    median, call_spread = statistics.median(call_times), spread(call_times)
    if call_spread >= DISTURBED_SPREAD_TO_MEDIAN * median:
        reasons.append(f"spread {call_spread * 1e3:.3g} ms against a median of {median * 1e3:.3g} ms")
    if copy_times:
        ratios = [copy / call for copy, call in zip(copy_times, call_times, strict=True)]
        ratio_median, ratio_spread = statistics.median(ratios), spread(ratios)
        if ratio_spread >= DISTURBED_ROUND_RATIO_SPREAD * ratio_median:
            reasons.append(f"the call's time against its copy's spreads {ratio_spread / ratio_median:.0%} "
                           "round to round")
    return "; ".join(reasons)


def describe(m: Measurement) -> str:
    """One result line; a disturbed measurement shows its times and why, never a fraction of the copy."""
    times = f"{m.provider:<15} {m.direction:<8} {m.median_ms:9.3f} ms ±{m.spread_ms:7.3f}"
    if not m.trusted:
        return f"{times}  DISTURBED, not a result: {m.disturbed}"
    return (f"{times}  {m.gbps:6.1f} GB/s  {m.fraction_of_copy:6.1%} of copy ({m.copy_gbps:.1f} GB/s paired, "
            f"{m.quiet_copy_gbps:.1f} quiet)  {m.page_faults_per_call:9.0f} faults/call")


def available_providers(case, providers, log=print) -> dict[str, dict[str, Callable[[], object]]]:
    """Each provider's calls per direction; one that cannot be set up is reported and left out."""
    available = {}
    for provider in providers:
        try:
            available[provider] = case.provider(provider)
        except Exception as error:  # e.g. inductor without a compiler: report, keep going
            log(f"  {provider}: unavailable ({type(error).__name__}: {error})")
    return available


def measure_case(case, shape_name: str, dtype_name: str, providers, rounds: int, retries: int = 2,
                 log=print) -> list[Measurement]:
    """Every provider of a case (any family's: see bench.cases) timed direction by direction in shared rounds
    against a copy of case.copy_elements() elements of case.dtype, rounds run again while disturbed."""
    source = torch.randn(case.copy_elements()).to(case.dtype)
    target = torch.empty_like(source)
    copy_bytes = 2 * source.nbytes
    copy = functools.partial(target.copy_, source)
    available = available_providers(case, providers, log)
    results = []
    quiet = 0.0
    for direction in case.directions:
        calls = {provider: both[direction] for provider, both in available.items()}
        for attempt in range(1, retries + 2):
            quiet = max(quiet, quiet_copy_gbps(copy, copy_bytes))  # the quietest the host was seen this case
            rows = {provider: _row(timed, copy_bytes, quiet) for provider, timed in
                    time_rounds(calls, copy, rounds).items()}
            disturbed = [f"{provider}: {row[3]}" for provider, row in rows.items() if row[3]]
            if not disturbed:
                break
            log(f"  {direction} rounds disturbed (attempt {attempt} of {retries + 1}): " + " | ".join(disturbed))
        for provider, (call_times, copy_gbps, faults, reason) in rows.items():
            traffic, path = case.provider_traffic(direction, provider), case.path(provider)
            median = statistics.median(call_times)
            gbps = traffic / median / 1e9
            measurement = Measurement(shape_name, dtype_name, provider, direction, median * 1e3,
                                      spread(call_times) * 1e3, min(call_times) * 1e3, traffic, gbps, copy_gbps,
                                      gbps / copy_gbps, faults, quiet, attempt, reason, path)
            results.append(measurement)
            log("  " + describe(measurement))
    return results


def _row(timed: tuple[list[float], list[float], float], copy_bytes: int, quiet: float):
    """(call times, paired copy rate, faults per call, why disturbed) of one provider's rounds."""
    call_times, copy_times, faults = timed
    copy_gbps = copy_bytes / statistics.median(copy_times) / 1e9
    return call_times, copy_gbps, faults, disturbance(call_times, copy_gbps, quiet, copy_times)


def paired_differences(calls: dict[str, Callable[[], object]], baseline: str, copy: Callable[[], object] | None,
                       rounds: int, warmup: int = 20) -> dict[str, list[float]]:
    """Per round, each call (after a copy, if given); each other call's time minus the baseline's that round."""
    for _ in range(warmup):
        for call in calls.values():
            _prepare(call)
            call()
    differences = {name: [] for name in calls if name != baseline}
    for _ in range(rounds):
        times = {}
        for name, call in calls.items():
            _prepare(call)
            if copy is not None:
                copy()
            start = time.perf_counter()
            result = call()
            times[name] = time.perf_counter() - start
            del result
        for name in differences:
            differences[name].append(times[name] - times[baseline])
    return differences
