"""Python kernel of BlockAttentionResiduals (the forward), executing a ForwardTilingData.

For each core's token range, `tokens_per_loop` tokens at a time:
  pass 1 over hidden tiles: sum of squares and score dot of every row, [B, N+1]
  inv_norm, scores, softmax over rows (float64, each rounded to float32 only when stored)
  pass 2 over hidden tiles: hidden_states = sum_i probs * v
"""

from __future__ import annotations

import torch

from attnres_ge.op_host.block_attention_residuals_tiling import TILING, ForwardTilingData
from attnres_ge.op_kernel.kernel_common import core_range, hidden_tiles, sequential_sum, softmax_rows, value_rows
from attnres_ge.op_kernel.kernel_spec import OpKernel


def block_attention_residuals_kernel(
    partial_block: torch.Tensor,  # [T, H]
    block_res: torch.Tensor,  # [T, N, H]
    proj_weight: torch.Tensor,  # [1, H] or [H]
    norm_weight: torch.Tensor,  # [H]
    hidden_states: torch.Tensor,  # [T, H] out, dtype of partial_block
    inv_norm: torch.Tensor,  # [T, N+1] float32 out when need_backward, else [0]
    probs: torch.Tensor,  # [T, N+1] float32 out when need_backward, else [0]
    workspace: torch.Tensor,  # unused by the forward
    tiling: ForwardTilingData,
) -> None:
    score_weight = norm_weight.double() * proj_weight.reshape(-1).double()  # [H], exact
    eps = tiling.norm_eps  # float32-rounded by Tiling
    for core in range(tiling.used_core_num):
        start, stop = core_range(core, tiling.former_core_num, tiling.former_core_tokens, tiling.tail_core_tokens)
        for t0 in range(start, stop, tiling.tokens_per_loop):
            t1 = min(t0 + tiling.tokens_per_loop, stop)
            row_inv_norm, row_probs = _scores(partial_block, block_res, score_weight, eps, t0, t1, tiling)
            for h0, h1 in hidden_tiles(tiling.h_tile, tiling.h_tile_num, tiling.h_last_tile):
                values = value_rows(partial_block, block_res, t0, t1, h0, h1)  # [B, R, h]
                mixed = sequential_sum(row_probs.double().unsqueeze(-1) * values, dim=1)
                hidden_states[t0:t1, h0:h1] = mixed.to(hidden_states.dtype)
            if tiling.need_backward:
                inv_norm[t0:t1] = row_inv_norm
                probs[t0:t1] = row_probs


def _scores(partial_block, block_res, score_weight, eps, t0, t1, tiling):
    """inv_norm and probs of tokens [t0, t1), both float32 [B, R]."""
    squares = dots = None
    for h0, h1 in hidden_tiles(tiling.h_tile, tiling.h_tile_num, tiling.h_last_tile):
        values = value_rows(partial_block, block_res, t0, t1, h0, h1)
        squares = sequential_sum(values * values, dim=-1, start=squares)
        dots = sequential_sum(values * score_weight[h0:h1], dim=-1, start=dots)
    inv = 1.0 / torch.sqrt(squares / tiling.hidden + eps)  # float64 into the scores, like the native kernel
    return inv.float(), softmax_rows(inv * dots).float()


KERNEL = OpKernel(TILING, block_attention_residuals_kernel)
