"""Python kernel of BlockAttnResPrepare, executing a PrepareTilingData: the oracle of the native
kernel (op_kernel/csrc/prepare_kernel.h), which follows the same passes.

For each core's token range, `tokens_per_loop` tokens and one group of queries at a time (float64
throughout, products of float32 values exact, every sum in index order; stored once as float32):
  pass 1 over hidden tiles: sum of squares [B, Nv] and the group's dots [B, G, Nv] from one load
                            of the tokens' rows
  norms, logits, their max, exps (kernel_common.exp_nonpositive) and their sum over rows
  pass 2 over hidden tiles: numerator = sum_n exp * row, from the rows of pass 1 when one tile holds them
Nv = min(valid_blocks[0], N) is read here, at run time, so the count can change between calls of one
plan; Nv = 0 writes the empty state.
"""

from __future__ import annotations

import torch

from attnres_ge.op_host.block_attn_res_prepare_tiling import TILING, PrepareTilingData
from attnres_ge.op_kernel.kernel_common import core_range, exp_nonpositive, hidden_tiles, sequential_sum
from attnres_ge.op_kernel.kernel_spec import OpKernel
from attnres_ge.op_kernel.reference import LOWEST_FLOAT32, valid_count


def block_attn_res_prepare_kernel(
    block_res: torch.Tensor,  # [T, N, D] float32
    valid_blocks: torch.Tensor,  # [1] uint64
    pseudo_query: torch.Tensor,  # [S, D] float32
    numerator: torch.Tensor,  # [S, T, D] float32 out
    logit_max: torch.Tensor,  # [S, T] float32 out
    exp_sum: torch.Tensor,  # [S, T] float32 out
    workspace: torch.Tensor,  # unused
    tiling: PrepareTilingData,
) -> None:
    valid = valid_count(valid_blocks, tiling.blocks)
    if valid == 0:
        numerator.zero_()
        logit_max.fill_(LOWEST_FLOAT32)
        exp_sum.zero_()
        return
    queries = pseudo_query.double()  # [S, D], exact
    outputs = (numerator, logit_max, exp_sum)
    for core in range(tiling.used_core_num):
        start, stop = core_range(core, tiling.former_core_num, tiling.former_core_tokens, tiling.tail_core_tokens)
        for t0 in range(start, stop, tiling.tokens_per_loop):
            t1 = min(t0 + tiling.tokens_per_loop, stop)
            for q0, q1 in hidden_tiles(tiling.query_tile, tiling.query_tile_num, tiling.query_last_tile):
                if q1 > q0:
                    _prepare_block(block_res[t0:t1, :valid], queries[q0:q1], outputs, (q0, q1, t0, t1), tiling)


def _prepare_block(rows_in, queries, outputs, where, tiling):
    """The outputs of tokens [t0, t1) for queries [q0, q1): rows_in [B, Nv, D], queries [G, D] float64."""
    q0, q1, t0, t1 = where
    numerator, logit_max, exp_sum = outputs
    tiles = list(hidden_tiles(tiling.h_tile, tiling.h_tile_num, tiling.h_last_tile))
    squares = dots = rows = None
    for h0, h1 in tiles:
        rows = rows_in[:, :, h0:h1].double()  # [B, Nv, h]
        squares = sequential_sum(rows * rows, dim=-1, start=squares)  # [B, Nv]
        products = rows.unsqueeze(1) * queries[:, h0:h1].unsqueeze(1)  # [B, G, Nv, h]
        dots = sequential_sum(products, dim=-1, start=dots)  # [B, G, Nv]
    norms = torch.sqrt(squares / tiling.hidden + tiling.eps)  # [B, Nv]
    logits = dots / norms.unsqueeze(1)
    top = logits.amax(dim=-1)  # [B, G]
    weights = exp_nonpositive(logits - top.unsqueeze(-1))  # [B, G, Nv]
    logit_max[q0:q1, t0:t1] = top.transpose(0, 1).float()
    exp_sum[q0:q1, t0:t1] = sequential_sum(weights, dim=-1).transpose(0, 1).float()
    for h0, h1 in tiles:
        if len(tiles) > 1:  # else the rows of pass 1 are still loaded
            rows = rows_in[:, :, h0:h1].double()
        weighted = weights.unsqueeze(-1) * rows.unsqueeze(1)  # [B, G, Nv, h]
        numerator[q0:q1, t0:t1, h0:h1] = sequential_sum(weighted, dim=2).transpose(0, 1).float()


KERNEL = OpKernel(TILING, block_attn_res_prepare_kernel)
