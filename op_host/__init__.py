"""Host side of the ops: platforms, TilingParse and Tiling (the launch runtime is op_kernel/launcher.py)."""

from attnres_ge.op_host.platform import PlatformInfo, PlatformProfile, host_profile, profile_by_name
from attnres_ge.op_host.tiling_base import (
    CHUNK_TOKENS,
    LANES,
    PlatformFallbackWarning,
    PlatformNotReadyError,
    TilingError,
    TilingResult,
    reset_fallback_warnings,
)

__all__ = [
    "CHUNK_TOKENS",
    "LANES",
    "PlatformFallbackWarning",
    "PlatformInfo",
    "PlatformNotReadyError",
    "PlatformProfile",
    "TilingError",
    "TilingResult",
    "host_profile",
    "profile_by_name",
    "reset_fallback_warnings",
]
