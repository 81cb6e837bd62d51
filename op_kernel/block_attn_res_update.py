"""Python kernel of BlockAttnResUpdate, executing an UpdateTilingData: the oracle of the native
kernel (op_kernel/csrc/update_kernel.h), which follows the same passes.

For each core's token range, `tokens_per_loop` tokens at a time:
  pass 1 over hidden tiles: p = partial_block + float32(delta) in float32, stored into the output
                            partial_block; its sum of squares and score dot (float64, index order)
  norm, score, m = max(logit_max, score), alpha, beta (float64; kernel_common.exp_nonpositive)
  pass 2 over hidden tiles: h = (numerator * alpha + p * beta) / (exp_sum * alpha + beta), in delta's dtype,
                            from the p of pass 1 when one tile holds the row
The output partial_block may be the input's memory (the torch op updates it in place): pass 2 reads p
from the output, never partial_block + delta again.
"""

from __future__ import annotations

import torch

from attnres_ge.op_host.block_attn_res_update_tiling import TILING, UpdateTilingData
from attnres_ge.op_kernel.kernel_common import core_range, exp_nonpositive, hidden_tiles, sequential_sum
from attnres_ge.op_kernel.kernel_spec import OpKernel


def block_attn_res_update_kernel(
    partial_block: torch.Tensor,  # [T, D] float32
    delta: torch.Tensor,  # [T, D] bfloat16 (CPU: also float16, float32)
    pseudo_query: torch.Tensor,  # [D] float32
    numerator: torch.Tensor,  # [T, D] float32
    logit_max: torch.Tensor,  # [T] float32
    exp_sum: torch.Tensor,  # [T] float32
    partial_out: torch.Tensor,  # [T, D] float32 out: p (may be partial_block itself)
    h: torch.Tensor,  # [T, D] out, delta's dtype
    workspace: torch.Tensor,  # unused
    tiling: UpdateTilingData,
) -> None:
    query = pseudo_query.double()  # [D], exact
    tiles = list(hidden_tiles(tiling.h_tile, tiling.h_tile_num, tiling.h_last_tile))
    for core in range(tiling.used_core_num):
        start, stop = core_range(core, tiling.former_core_num, tiling.former_core_tokens, tiling.tail_core_tokens)
        for t0 in range(start, stop, tiling.tokens_per_loop):
            t1 = min(t0 + tiling.tokens_per_loop, stop)
            squares = dots = p = None
            for h0, h1 in tiles:
                p = partial_block[t0:t1, h0:h1] + delta[t0:t1, h0:h1].float()  # [B, h] float32
                partial_out[t0:t1, h0:h1] = p
                p = p.double()
                squares = sequential_sum(p * p, dim=-1, start=squares)  # [B]
                dots = sequential_sum(p * query[h0:h1], dim=-1, start=dots)
            alpha, beta, total = _merge_weights(squares, dots, logit_max[t0:t1], exp_sum[t0:t1], tiling)
            for h0, h1 in tiles:
                if len(tiles) > 1:  # else p of pass 1 is still loaded
                    p = partial_out[t0:t1, h0:h1].double()
                mixed = numerator[t0:t1, h0:h1].double() * alpha + p * beta
                h[t0:t1, h0:h1] = (mixed / total).to(h.dtype)


def _merge_weights(squares, dots, logit_max, exp_sum, tiling):
    """alpha, beta and exp_sum * alpha + beta of a token block, each [B, 1] float64."""
    norm = torch.sqrt(squares / max(tiling.hidden, 1) + tiling.eps)  # D = 0: no column, no 0 / 0
    score = dots / norm
    prior = logit_max.double()
    top = torch.maximum(prior, score)
    alpha, beta = exp_nonpositive(prior - top), exp_nonpositive(score - top)
    total = exp_sum.double() * alpha + beta
    return alpha.unsqueeze(-1), beta.unsqueeze(-1), total.unsqueeze(-1)


KERNEL = OpKernel(TILING, block_attn_res_update_kernel, dtype_input="delta")
