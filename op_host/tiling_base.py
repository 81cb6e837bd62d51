"""What both ops' host sides share: compile info, tiling records, core-count resolution.

The cold-start contract (docs/contract.md, "Tiling and the cold start"):
  * TilingParse checks the platform handle is present and records nothing the
    runtime may not have filled yet: never the core count.
  * Tiling reads the vector-core count and buffer size when it runs. A 0 is
    re-queried from the runtime; a 0 again falls back to one core (and the
    smallest known buffer) with a one-time warning naming the op, the stage and
    the values read, or raises PlatformNotReadyError in strict mode. Tiling
    never launches on 0 cores.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from attnres_ge.op_host.platform import KIB, PlatformInfo
from attnres_ge.op_proto import OpPrototype, TensorMeta

# Sums over the hidden dimension run in LANES independent accumulators (one
# SIMD register), combined by a fixed tree at the end; hidden tiles are whole
# multiples of LANES. The sum therefore has the same bits for every tile size.
LANES = 16
# The backward's weight-gradient sum over tokens is cut into chunks of this many
# tokens, each summed token by token into its own workspace row, the rows then
# summed in chunk order: the same bits for every core count and loop size.
CHUNK_TOKENS = 64
FALLBACK_CORE_NUM = 1
FALLBACK_UB_SIZE = 64 * KIB
STRICT_ENV = "ATTNRES_GE_STRICT_PLATFORM"

# Tiling keys: 10 * mode + dtype code.
MODE_FULL_ROW = 1  # every row of a token block fits in the buffer
MODE_SPLIT_H = 2  # the hidden dimension is cut into tiles
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
DTYPE_BYTES = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}


class TilingError(RuntimeError):
    """Tiling cannot produce a launch for these shapes on this platform."""


class PlatformNotReadyError(TilingError):
    """Strict mode: the platform reported no cores even after a re-query."""


class PlatformFallbackWarning(RuntimeWarning):
    """The platform reported 0 cores or no buffer; tiling used the safe fallback."""


def strict_from_env() -> bool:
    return os.environ.get(STRICT_ENV, "0") not in ("", "0", "false", "False")


def as_float32(value: float) -> float:
    """`value` rounded to float32, as GE stores a Float attribute and the tiling record holds it."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


def tiling_key(mode: int, dtype: torch.dtype) -> int:
    return 10 * mode + DTYPE_CODES[dtype]


@dataclass(frozen=True)
class CompileInfo:
    """What TilingParse records once per node: static facts only, nothing the runtime fills."""

    op_type: str
    lanes: int = LANES
    chunk_tokens: int = CHUNK_TOKENS


def tiling_parse(op_type: str, platform: PlatformInfo | None) -> CompileInfo:
    """TilingParse: the platform handle must exist; its core count is deliberately not read."""
    if platform is None:
        raise TilingError(f"{op_type} TilingParse: no platform handle was given")
    return CompileInfo(op_type)


@dataclass(frozen=True)
class TilingRecord:
    """A flat record with a stable little-endian layout: int fields int64, float fields float32.

    `to_bytes()` is what the native kernels receive: they read it as the op's C++ record struct
    (op_kernel/csrc/<op>_launch.h), whose field names, offsets and sizes op_kernel.native compares
    with `field_layout()` before the first launch record of each op is made."""

    @classmethod
    def layout(cls) -> str:
        codes = {"int": "q", "float": "f"}
        return "<" + "".join(codes[str(field.type)] for field in dataclasses.fields(cls))

    @classmethod
    def field_layout(cls) -> tuple[int, tuple[tuple[str, int, int], ...]]:
        """(bytes of to_bytes(), ((field, offset, size), ...)) in field order."""
        fields, offset = [], 0
        for field, code in zip(dataclasses.fields(cls), cls.layout()[1:], strict=True):
            size = struct.calcsize("<" + code)
            fields.append((field.name, offset, size))
            offset += size
        return offset, tuple(fields)

    def to_bytes(self) -> bytes:
        return struct.pack(self.layout(), *dataclasses.astuple(self))

    @classmethod
    def from_bytes(cls, data: bytes):
        return cls(*struct.unpack(cls.layout(), data))


@dataclass(frozen=True)
class TilingResult:
    """Tiling's answer for one shape: which kernel variant, on how many cores, with what."""

    tiling_key: int
    block_dim: int  # cores launched
    data: TilingRecord
    workspace_size: int  # bytes

    def describe(self) -> str:
        lines = [f"tiling_key     {self.tiling_key}", f"block_dim      {self.block_dim}",
                 f"workspace_size {self.workspace_size} bytes"]
        for field in dataclasses.fields(self.data):
            value = getattr(self.data, field.name)
            shown = f"{value:.7g}" if isinstance(value, float) else str(value)  # epsilon: float32 precision
            lines.append(f"  {field.name:<20} {shown}")
        lines.append(f"tiling data    {self.data.to_bytes().hex()}")
        return "\n".join(lines)


@dataclass(frozen=True)
class OpTiling:
    """One op's host side, as the launcher and the local GE use it: the prototype, the tiling record
    type (what the kernels read), TilingParse, and Tiling from the input metas and bound attributes."""

    prototype: OpPrototype
    record: type[TilingRecord]
    parse: Callable[[PlatformInfo | None], CompileInfo]
    tiling: Callable[[CompileInfo, Mapping[str, TensorMeta], Mapping, PlatformInfo], TilingResult]

    @property
    def op_type(self) -> str:
        return self.prototype.op_type


_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def _warn_once(op_type: str, what: str, message: str) -> None:
    with _warned_lock:
        if (op_type, what) in _warned:
            return
        _warned.add((op_type, what))
    warnings.warn(message, PlatformFallbackWarning, stacklevel=4)


def reset_fallback_warnings() -> None:
    """Forget which fallbacks were reported (tests)."""
    with _warned_lock:
        _warned.clear()


@dataclass(frozen=True)
class ResolvedPlatform:
    core_num: int
    ub_size: int


def resolve_platform(op_type: str, platform: PlatformInfo, strict: bool) -> ResolvedPlatform:
    """Tiling's read of the platform: read, re-query on 0, else fall back (or raise in strict mode)."""
    core_num, ub_size = platform.core_num(), platform.ub_size()
    if core_num > 0 and ub_size > 0:
        return ResolvedPlatform(core_num, ub_size)
    first = (core_num, ub_size)
    platform.requery()
    core_num, ub_size = platform.core_num(), platform.ub_size()
    if core_num > 0 and ub_size > 0:
        return ResolvedPlatform(core_num, ub_size)
    context = (
        f"{op_type} Tiling: platform {platform.soc} reported coreNum={first[0]}, ubSize={first[1]}; "
        f"after a re-query coreNum={core_num}, ubSize={ub_size}"
    )
    if strict:
        raise PlatformNotReadyError(f"{context}; strict mode ({STRICT_ENV}=1) refuses to fall back")
    fallback = ResolvedPlatform(
        core_num if core_num > 0 else FALLBACK_CORE_NUM,
        ub_size if ub_size > 0 else FALLBACK_UB_SIZE,
    )
    _warn_once(op_type, "platform", f"{context}; falling back to coreNum={fallback.core_num}, "
               f"ubSize={fallback.ub_size} (correct, slower)")
    return fallback


def split_evenly(items: int, cores: int) -> tuple[int, int, int, int]:
    """Deal `items` over at most `cores` cores: (used, former_num, former_items, tail_items).

    The first `former_num` cores take `former_items` = tail_items + 1, the rest `tail_items`;
    when the cores divide the items evenly, former_num is 0 and former_items equals tail_items.
    At least one core is used, even for 0 items.
    """
    used = max(1, min(cores, items))
    tail_items, former_num = divmod(items, used)
    return used, former_num, tail_items + (1 if former_num else 0), tail_items


@dataclass(frozen=True)
class HiddenPlan:
    """How one core walks its tokens: `tokens_per_loop` tokens at a time, hidden cut in tiles."""

    mode: int
    tokens_per_loop: int
    h_tile: int
    h_tile_num: int
    h_last_tile: int


def plan_hidden(
    op_type: str,
    ub_size: int,
    hidden: int,
    column_bytes: int,
    shared_column_bytes: int,
    token_bytes: int,
    max_tokens: int,
) -> HiddenPlan:
    """Fit the buffer: whole rows for as many tokens as fit, else one token with hidden tiles.

    column_bytes: bytes one token needs per hidden column (all rows, inputs, casts, outputs);
    shared_column_bytes: bytes per hidden column shared by all tokens (e.g. the score weight);
    token_bytes: per-token scalars (norms, scores, probabilities).
    """
    free = ub_size - hidden * shared_column_bytes
    tokens = free // (hidden * column_bytes + token_bytes) if free > 0 else 0
    if tokens >= 1:
        return HiddenPlan(MODE_FULL_ROW, min(tokens, max(1, max_tokens)), hidden, 1, hidden)
    columns = (ub_size - token_bytes) // (column_bytes + shared_column_bytes)
    h_tile = min(columns, hidden) // LANES * LANES
    if h_tile < LANES:
        raise TilingError(
            f"{op_type} Tiling: a buffer of {ub_size} bytes cannot hold {LANES} hidden columns "
            f"({column_bytes + shared_column_bytes} bytes each) plus {token_bytes} bytes per token"
        )
    tile_num = -(-hidden // h_tile)
    return HiddenPlan(MODE_SPLIT_H, 1, h_tile, tile_num, hidden - (tile_num - 1) * h_tile)
