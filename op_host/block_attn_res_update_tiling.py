"""TilingParse and Tiling of BlockAttnResUpdate (phase 2 of the two-phase read), for the CPU kernels.

Tokens are dealt to cores in contiguous ranges (former cores take one more); a core walks its
range `tokens_per_loop` tokens at a time, one pass over each token's row (p = partial + delta, its
norm and score, then h) when the row fits the buffer. Otherwise the hidden dimension is cut into
tiles of `h_tile` columns (a whole number of LANES) and walked twice: p, its norm and score, then h.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from attnres_ge.op_host.platform import PlatformInfo
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
from attnres_ge.op_proto import UPDATE, TensorMeta

OP_TYPE = UPDATE.op_type
FLOAT32_BYTES = 4
TOKEN_SCALARS = 4  # logit_max, exp_sum, the norm and the score


@dataclass(frozen=True)
class UpdateTilingData(TilingRecord):
    tokens: int
    hidden: int
    used_core_num: int
    former_core_num: int
    former_core_tokens: int
    tail_core_tokens: int
    tokens_per_loop: int
    h_tile: int
    h_tile_num: int
    h_last_tile: int
    eps: float

    def tensor_sizes(self, dtype: torch.dtype) -> tuple[tuple[torch.dtype, int], ...]:
        """(dtype, element count) of each tensor a launch takes, inputs then outputs in prototype order;
        `dtype` is delta's (and h's)."""
        row = self.tokens * self.hidden
        return ((torch.float32, row), (dtype, row), (torch.float32, self.hidden), (torch.float32, row),
                (torch.float32, self.tokens), (torch.float32, self.tokens), (torch.float32, row), (dtype, row))

    def workspace_bytes(self) -> int:
        return 0


def parse(platform: PlatformInfo | None) -> CompileInfo:
    return tiling_parse(OP_TYPE, platform)


def tiling(compile_info: CompileInfo, tokens: int, hidden: int, delta_dtype: torch.dtype, eps: float,
           platform: PlatformInfo, strict: bool | None = None) -> TilingResult:
    resolved = resolve_platform(OP_TYPE, platform, strict_from_env() if strict is None else strict)
    used, former_num, former_tokens, tail_tokens = split_evenly(tokens, resolved.core_num)
    delta_bytes = DTYPE_BYTES[delta_dtype]
    cast_bytes = 0 if delta_bytes == FLOAT32_BYTES else FLOAT32_BYTES
    plan = plan_hidden(
        OP_TYPE,
        resolved.ub_size,
        hidden,
        # partial_block, delta and its float32 cast, numerator, h
        column_bytes=FLOAT32_BYTES + delta_bytes + cast_bytes + FLOAT32_BYTES + delta_bytes,
        shared_column_bytes=FLOAT32_BYTES,  # pseudo_query
        token_bytes=TOKEN_SCALARS * FLOAT32_BYTES,
        max_tokens=former_tokens if former_num else tail_tokens,
    )
    data = UpdateTilingData(
        tokens=tokens,
        hidden=hidden,
        used_core_num=used,
        former_core_num=former_num,
        former_core_tokens=former_tokens,
        tail_core_tokens=tail_tokens,
        tokens_per_loop=plan.tokens_per_loop,
        h_tile=plan.h_tile,
        h_tile_num=plan.h_tile_num,
        h_last_tile=plan.h_last_tile,
        eps=as_float32(eps),  # eager and graph (float32 attribute) see the same epsilon
    )
    return TilingResult(tiling_key(plan.mode, delta_dtype), used, data, data.workspace_bytes())


def tiling_for_inputs(compile_info: CompileInfo, inputs: Mapping[str, TensorMeta], attrs: Mapping,
                      platform: PlatformInfo) -> TilingResult:
    """Tiling from the prototype's input metas and bound attributes (what the launcher calls)."""
    tokens, hidden = inputs["partial_block"].shape
    return tiling(compile_info, tokens, hidden, inputs["delta"].dtype, attrs["eps"], platform)


TILING = OpTiling(UPDATE, UpdateTilingData, parse, tiling_for_inputs)
