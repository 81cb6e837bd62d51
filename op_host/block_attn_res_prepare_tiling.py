"""TilingParse and Tiling of BlockAttnResPrepare (phase 1 of the two-phase read), for the CPU kernels.

Tokens are dealt to cores in contiguous ranges (former cores take one more). A core walks its
range `tokens_per_loop` tokens at a time and, for each token, reads its N snapshot rows once for a
whole group of `query_tile` pseudo-queries: the group's dots, the row norms, the softmax state and
the weighted sums all come from the same loaded rows. All S queries form one group unless their
sums and dots do not fit the buffer, then the queries are cut into groups walked in order (queries
are independent, so the bits do not change). When one token's rows do not fit, the hidden dimension
is cut into tiles of `h_tile` columns (a whole number of LANES) and walked twice: norms and dots,
then the weighted sums.

valid_blocks is not read here: the kernel reads it when it runs, so a new count needs no new tiling.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from attnres_ge.op_host.platform import PlatformInfo
from attnres_ge.op_host.tiling_base import (
    CompileInfo,
    HiddenPlan,
    OpTiling,
    TilingError,
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
from attnres_ge.op_proto import PREPARE, TensorMeta

OP_TYPE = PREPARE.op_type
FLOAT32_BYTES = 4
ROW_SCALARS = 3  # per (query, row): logit, exp, and the row's norm


@dataclass(frozen=True)
class PrepareTilingData(TilingRecord):
    tokens: int
    blocks: int
    queries: int
    hidden: int
    used_core_num: int
    former_core_num: int
    former_core_tokens: int
    tail_core_tokens: int
    tokens_per_loop: int
    query_tile: int
    query_tile_num: int
    query_last_tile: int
    h_tile: int
    h_tile_num: int
    h_last_tile: int
    eps: float

    def tensor_sizes(self, dtype: torch.dtype) -> tuple[tuple[torch.dtype, int], ...]:
        """(dtype, element count) of each tensor a launch takes, inputs then outputs in prototype order."""
        state = self.queries * self.tokens
        return ((torch.float32, self.tokens * self.blocks * self.hidden), (torch.uint64, 1),
                (torch.float32, self.queries * self.hidden), (torch.float32, state * self.hidden),
                (torch.float32, state), (torch.float32, state))

    def workspace_bytes(self) -> int:
        return 0


def parse(platform: PlatformInfo | None) -> CompileInfo:
    return tiling_parse(OP_TYPE, platform)


def _plan_for_queries(ub_size: int, blocks: int, hidden: int, queries: int, max_tokens: int) -> HiddenPlan:
    """The hidden plan when `queries` pseudo-queries share each loaded token."""
    return plan_hidden(
        OP_TYPE,
        ub_size,
        hidden,
        column_bytes=(blocks + queries) * FLOAT32_BYTES,  # the token's rows, the group's numerator sums
        shared_column_bytes=queries * FLOAT32_BYTES,  # the group's pseudo-queries
        token_bytes=queries * blocks * ROW_SCALARS * FLOAT32_BYTES,
        max_tokens=max_tokens,
    )


def _plan_query_groups(ub_size: int, blocks: int, hidden: int, queries: int, max_tokens: int):
    """(query_tile, hidden plan): every query in one group if it fits, else the largest group that does
    (halving); one query always fits a buffer of FALLBACK_UB_SIZE at the largest N and D."""
    group = max(queries, 1)
    while True:
        try:
            return group, _plan_for_queries(ub_size, blocks, hidden, group, max_tokens)
        except TilingError:
            if group == 1:
                raise
            group = (group + 1) // 2


def tiling(compile_info: CompileInfo, tokens: int, blocks: int, queries: int, hidden: int, eps: float,
           platform: PlatformInfo, strict: bool | None = None) -> TilingResult:
    resolved = resolve_platform(OP_TYPE, platform, strict_from_env() if strict is None else strict)
    used, former_num, former_tokens, tail_tokens = split_evenly(tokens, resolved.core_num)
    core_tokens = former_tokens if former_num else tail_tokens
    query_tile, plan = _plan_query_groups(resolved.ub_size, blocks, hidden, queries, core_tokens)
    query_tile_num = max(1, -(-queries // query_tile))
    data = PrepareTilingData(
        tokens=tokens,
        blocks=blocks,
        queries=queries,
        hidden=hidden,
        used_core_num=used,
        former_core_num=former_num,
        former_core_tokens=former_tokens,
        tail_core_tokens=tail_tokens,
        tokens_per_loop=plan.tokens_per_loop,
        query_tile=query_tile,
        query_tile_num=query_tile_num,
        query_last_tile=queries - (query_tile_num - 1) * query_tile,
        h_tile=plan.h_tile,
        h_tile_num=plan.h_tile_num,
        h_last_tile=plan.h_last_tile,
        eps=as_float32(eps),  # eager and graph (float32 attribute) see the same epsilon
    )
    return TilingResult(tiling_key(plan.mode, torch.float32), used, data, data.workspace_bytes())


def tiling_for_inputs(compile_info: CompileInfo, inputs: Mapping[str, TensorMeta], attrs: Mapping,
                      platform: PlatformInfo) -> TilingResult:
    """Tiling from the prototype's input metas and bound attributes (what the launcher calls)."""
    tokens, blocks, hidden = inputs["block_res"].shape
    queries = inputs["pseudo_query"].shape[0]
    return tiling(compile_info, tokens, blocks, queries, hidden, attrs["eps"], platform)


TILING = OpTiling(PREPARE, PrepareTilingData, parse, tiling_for_inputs)
