"""Platform facts the host side tiles for, and their lazily filled runtime handle.

On Ascend, GE hands TilingParse and Tiling a platform handle (fe::PlatFormInfos)
that the runtime fills in lazily: before the first launch of a fresh process the
vector-core count may still read 0. `PlatformInfo` models that handle with an
explicit filled/empty state, so tests can reproduce the cold start, and a
`requery` source standing in for asking the runtime again.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

KIB = 1024


@dataclass(frozen=True)
class PlatformProfile:
    """What a filled platform reports: the SoC, its vector cores and each core's on-chip buffer."""

    soc: str
    vector_core_num: int
    ub_size: int  # bytes of unified buffer per vector core (host: L2 per core)


HOST_SOC = "host-cpu"
HOST_DEFAULT_L2 = 512 * KIB


def _host_l2_bytes() -> int:
    """Per-core L2 from sysfs; the usual size when the machine does not say."""
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (index / "level").read_text().strip() == "2":
                text = (index / "size").read_text().strip().upper()
                scale = {"K": KIB, "M": KIB * KIB}.get(text[-1], 1)
                return int(text.rstrip("KM")) * scale
        except (OSError, ValueError):
            continue
    return HOST_DEFAULT_L2


def _usable_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def host_profile() -> PlatformProfile:
    """The host CPU measured now: usable threads as cores, L2 per core as the buffer."""
    return PlatformProfile(HOST_SOC, vector_core_num=_usable_threads(), ub_size=_host_l2_bytes())


# Only the host CPU: these tilings feed this package's CPU kernels. CANN's Ascend kernels read the
# tiling of the C++ registrations (op_host/cann/*_tiling.cpp), so no Ascend SoC gets a Python profile here.
PROFILES: dict[str, Callable[[], PlatformProfile]] = {
    "host": host_profile,
}


def profile_by_name(name: str) -> PlatformProfile:
    """A host profile by name; an Ascend SoC name is refused with where its tiling lives."""
    if name in PROFILES:
        return PROFILES[name]()
    if name.lower().startswith("ascend"):
        raise ValueError(
            f"{name!r} is an Ascend SoC: the Python tiling serves only this package's CPU kernels. On Ascend, "
            "CANN's kernels read the tiling of the C++ registrations (op_host/cann/*_tiling.cpp), run on CPU by the "
            "`make cann-host` test tier (tests/cann) and documented in docs/ascend.md; "
            f"host profiles: {sorted(PROFILES)}"
        )
    raise ValueError(f"unknown platform profile {name!r}; known: {sorted(PROFILES)}")


class PlatformInfo:
    """The platform handle GE passes to TilingParse and Tiling.

    While empty it reads 0 for the core count and the buffer size, as an Ascend
    handle does before the runtime has filled it. `requery()` asks the runtime
    again (the `runtime` callable returns a profile, or None if it has none yet)
    and fills the handle when the answer is usable.
    """

    def __init__(
        self,
        profile: PlatformProfile,
        *,
        filled: bool = True,
        runtime: Callable[[], PlatformProfile | None] | None = None,
    ):
        self.soc = profile.soc
        self._profile = profile
        self._filled = filled
        self._runtime = runtime if runtime is not None else (lambda: profile)
        self._lock = threading.Lock()

    @classmethod
    def empty(cls, profile: PlatformProfile, *, runtime_answers: bool = True) -> PlatformInfo:
        """A handle not yet filled; its runtime answers a re-query only if `runtime_answers`."""
        return cls(profile, filled=False, runtime=(lambda: profile) if runtime_answers else (lambda: None))

    @property
    def filled(self) -> bool:
        return self._filled

    def core_num(self) -> int:
        return self._profile.vector_core_num if self._filled else 0

    def ub_size(self) -> int:
        return self._profile.ub_size if self._filled else 0

    def fill(self) -> None:
        with self._lock:
            self._filled = True

    def requery(self) -> None:
        """Ask the runtime again; fill from its answer when it has one with cores."""
        answer = self._runtime()
        if answer is not None and answer.vector_core_num > 0 and answer.ub_size > 0:
            with self._lock:
                self._profile = answer
                self._filled = True

    def __repr__(self) -> str:
        state = "filled" if self._filled else "empty"
        return f"PlatformInfo({self.soc}, {state}, cores={self.core_num()}, ub={self.ub_size()})"
