"""TilingParse and Tiling of BlockAttentionResidualsGrad (the backward).

Tokens are grouped in chunks of CHUNK_TOKENS; chunks are dealt to cores in
contiguous ranges. Each chunk's share of the weight-gradient sum is added token
by token into its own float32 workspace row ([chunk_num, H]); the rows are then
summed in chunk order. The result therefore has the same bits whatever the core
count, loop size or hidden tile. Within a chunk a core walks `tokens_per_loop`
tokens at a time, cutting hidden into tiles when one token's rows do not fit.
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
    plan_hidden,
    resolve_platform,
    split_evenly,
    strict_from_env,
    tiling_key,
    tiling_parse,
)
from attnres_ge.op_proto import BACKWARD, TensorMeta

OP_TYPE = BACKWARD.op_type
FLOAT32_BYTES = 4
TOKEN_SCALARS = 6  # inv_norm, prob, g, wv, gs, coefficient per row


@dataclass(frozen=True)
class BackwardTilingData(TilingRecord):
    tokens: int
    blocks: int
    rows: int
    hidden: int
    used_core_num: int
    former_core_num: int
    former_core_chunks: int
    tail_core_chunks: int
    chunk_tokens: int
    chunk_num: int
    tokens_per_loop: int
    h_tile: int
    h_tile_num: int
    h_last_tile: int

    def tensor_sizes(self, dtype: torch.dtype) -> tuple[tuple[torch.dtype, int], ...]:
        """(dtype, element count) of each tensor a launch takes, inputs then outputs in prototype order."""
        row, stats = self.tokens * self.hidden, self.tokens * self.rows
        values = ((dtype, row), (dtype, row * self.blocks), (dtype, self.hidden), (dtype, self.hidden))
        return (*values, (dtype, row), (torch.float32, stats), (torch.float32, stats), *values)

    def workspace_bytes(self) -> int:
        """The chunk rows: [chunk_num, H] float32."""
        return self.chunk_num * self.hidden * FLOAT32_BYTES


def parse(platform: PlatformInfo | None) -> CompileInfo:
    return tiling_parse(OP_TYPE, platform)


def tiling(
    compile_info: CompileInfo,
    tokens: int,
    blocks: int,
    hidden: int,
    dtype: torch.dtype,
    platform: PlatformInfo,
    strict: bool | None = None,
) -> TilingResult:
    resolved = resolve_platform(OP_TYPE, platform, strict_from_env() if strict is None else strict)
    rows = blocks + 1
    chunk_tokens = compile_info.chunk_tokens
    chunk_num = -(-tokens // chunk_tokens)
    used, former_num, former_chunks, tail_chunks = split_evenly(chunk_num, resolved.core_num)
    in_bytes = DTYPE_BYTES[dtype]
    plan = plan_hidden(
        OP_TYPE,
        resolved.ub_size,
        hidden,
        # rows in, gradient rows out, f32 working rows; grad_hidden_states in and as f32
        column_bytes=rows * (2 * in_bytes + FLOAT32_BYTES) + in_bytes + FLOAT32_BYTES,
        shared_column_bytes=2 * FLOAT32_BYTES,  # score weight and the chunk's weight-gradient row
        token_bytes=rows * TOKEN_SCALARS * FLOAT32_BYTES,
        max_tokens=min(chunk_tokens, max(tokens, 1)),
    )
    data = BackwardTilingData(
        tokens=tokens,
        blocks=blocks,
        rows=rows,
        hidden=hidden,
        used_core_num=used,
        former_core_num=former_num,
        former_core_chunks=former_chunks,
        tail_core_chunks=tail_chunks,
        chunk_tokens=chunk_tokens,
        chunk_num=chunk_num,
        tokens_per_loop=plan.tokens_per_loop,
        h_tile=plan.h_tile,
        h_tile_num=plan.h_tile_num,
        h_last_tile=plan.h_last_tile,
    )
    return TilingResult(tiling_key(plan.mode, dtype), used, data, data.workspace_bytes())


def tiling_for_inputs(compile_info: CompileInfo, inputs: Mapping[str, TensorMeta], attrs: Mapping,
                      platform: PlatformInfo) -> TilingResult:
    """Tiling from the prototype's input metas and bound attributes (what the launcher calls)."""
    tokens, blocks, hidden = inputs["block_res"].shape
    return tiling(compile_info, tokens, blocks, hidden, inputs["partial_block"].dtype, platform)


TILING = OpTiling(BACKWARD, BackwardTilingData, parse, tiling_for_inputs)
