"""TilingParse and Tiling of BlockAttentionResiduals (the forward).

Tokens are dealt to cores in contiguous ranges (former cores take one more).
Each core walks its range `tokens_per_loop` tokens at a time (as many as fit in the
buffer; one on the host CPU, see HOST_TOKENS_PER_LOOP); when even one token's N+1 rows
do not fit in the buffer, the hidden dimension is cut into tiles of `h_tile` columns
(a whole number of LANES) and walked twice: once for the norms and scores, once for
the weighted sum.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from attnres_ge.op_host.platform import HOST_SOC, PlatformInfo
from attnres_ge.op_host.tiling_base import (
    DTYPE_BYTES,
    CompileInfo,
    OpTiling,
    TilingRecord,
    TilingResult,
    as_float32,
    plan_hidden,
    resolve_platform,
    split_evenly,
    strict_from_env,
    tiling_key,
    tiling_parse,
)
from attnres_ge.op_proto import FORWARD, TensorMeta

OP_TYPE = FORWARD.op_type
FLOAT32_BYTES = 4
TOKEN_SCALARS = 3  # inv_norm, score, prob per row
# The host's buffer is its L2, a cache rather than a scratchpad: the second pass re-reads a
# block's rows from it and prefetches the next block's while it computes. With one token per
# loop its rows are the freshest in cache when re-read, and the next token's arrive during the
# second pass (measurements: docs/notes/performance-runs.md).
HOST_TOKENS_PER_LOOP = 1


@dataclass(frozen=True)
class ForwardTilingData(TilingRecord):
    tokens: int
    blocks: int
    rows: int
    hidden: int
    used_core_num: int
    former_core_num: int
    former_core_tokens: int
    tail_core_tokens: int
    tokens_per_loop: int
    h_tile: int
    h_tile_num: int
    h_last_tile: int
    need_backward: int
    norm_eps: float

    def tensor_sizes(self, dtype: torch.dtype) -> tuple[tuple[torch.dtype, int], ...]:
        """(dtype, element count) of each tensor a launch takes, inputs then outputs in prototype order."""
        row, stats = self.tokens * self.hidden, self.tokens * self.rows if self.need_backward else 0
        return ((dtype, row), (dtype, row * self.blocks), (dtype, self.hidden), (dtype, self.hidden),
                (dtype, row), (torch.float32, stats), (torch.float32, stats))

    def workspace_bytes(self) -> int:
        return 0


def parse(platform: PlatformInfo | None) -> CompileInfo:
    return tiling_parse(OP_TYPE, platform)


def tiling(
    compile_info: CompileInfo,
    tokens: int,
    blocks: int,
    hidden: int,
    dtype: torch.dtype,
    norm_eps: float,
    need_backward: bool,
    platform: PlatformInfo,
    strict: bool | None = None,
) -> TilingResult:
    resolved = resolve_platform(OP_TYPE, platform, strict_from_env() if strict is None else strict)
    rows = blocks + 1
    used, former_num, former_tokens, tail_tokens = split_evenly(tokens, resolved.core_num)
    in_bytes = DTYPE_BYTES[dtype]
    cast_bytes = 0 if in_bytes == FLOAT32_BYTES else FLOAT32_BYTES
    plan = plan_hidden(
        OP_TYPE,
        resolved.ub_size,
        hidden,
        column_bytes=rows * (in_bytes + cast_bytes) + FLOAT32_BYTES + in_bytes,  # rows, f32 sum, output
        shared_column_bytes=FLOAT32_BYTES,  # score weight norm_weight * proj_weight
        token_bytes=rows * TOKEN_SCALARS * FLOAT32_BYTES,
        max_tokens=HOST_TOKENS_PER_LOOP if platform.soc == HOST_SOC else (former_tokens if former_num else tail_tokens),
    )
    data = ForwardTilingData(
        tokens=tokens,
        blocks=blocks,
        rows=rows,
        hidden=hidden,
        used_core_num=used,
        former_core_num=former_num,
        former_core_tokens=former_tokens,
        tail_core_tokens=tail_tokens,
        tokens_per_loop=plan.tokens_per_loop,
        h_tile=plan.h_tile,
        h_tile_num=plan.h_tile_num,
        h_last_tile=plan.h_last_tile,
        need_backward=int(need_backward),
        norm_eps=as_float32(norm_eps),  # eager and graph (float32 attribute) see the same epsilon
    )
    return TilingResult(tiling_key(plan.mode, dtype), used, data, data.workspace_bytes())


def tiling_for_inputs(compile_info: CompileInfo, inputs: Mapping[str, TensorMeta], attrs: Mapping,
                      platform: PlatformInfo) -> TilingResult:
    """Tiling from the prototype's input metas and bound attributes (what the launcher calls)."""
    tokens, blocks, hidden = inputs["block_res"].shape
    return tiling(compile_info, tokens, blocks, hidden, inputs["partial_block"].dtype, attrs["norm_eps"],
                  attrs["need_backward"], platform)


TILING = OpTiling(FORWARD, ForwardTilingData, parse, tiling_for_inputs)
