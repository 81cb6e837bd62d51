"""Python kernel of BlockAttentionResidualsGrad (the backward), executing a BackwardTilingData.

With go = grad_hidden_states, p = probs, r = inv_norm, w = norm_weight * proj_weight,
per token block (float64 throughout, outputs rounded once):
  pass 1 over hidden tiles: g = sum_h go * v,  wv = sum_h w * v          [B, R]
  gs = p * (g - sum_j p_j g_j),  a = gs * r,  c = gs * wv * r^3 / H
  pass 2 over hidden tiles: gv = go * p + a * w - c * v  (the input gradients)
                            chunk row += sum over (token, row) of a * v   (weight gradients)
Chunk rows live in the workspace ([chunk_num, H] float32) and are summed in chunk
order at the end, so the weight gradients do not depend on the core split.
"""

from __future__ import annotations

import torch

from attnres_ge.op_host.block_attention_residuals_grad_tiling import TILING, BackwardTilingData
from attnres_ge.op_kernel.kernel_common import core_range, hidden_tiles, sequential_sum, value_rows
from attnres_ge.op_kernel.kernel_spec import OpKernel


def block_attention_residuals_grad_kernel(
    partial_block: torch.Tensor,  # [T, H]
    block_res: torch.Tensor,  # [T, N, H]
    proj_weight: torch.Tensor,  # [1, H]
    norm_weight: torch.Tensor,  # [H]
    grad_hidden_states: torch.Tensor,  # [T, H]
    inv_norm: torch.Tensor,  # [T, N+1] float32
    probs: torch.Tensor,  # [T, N+1] float32
    grad_partial_block: torch.Tensor,  # [T, H] out
    grad_block_res: torch.Tensor,  # [T, N, H] out
    grad_proj_weight: torch.Tensor,  # [1, H] out
    grad_norm_weight: torch.Tensor,  # [H] out
    workspace: torch.Tensor,  # uint8, >= chunk_num * H * 4 bytes
    tiling: BackwardTilingData,
) -> None:
    hidden, blocks = tiling.hidden, tiling.blocks
    proj = proj_weight.reshape(-1).double()
    norm = norm_weight.double()
    score_weight = (norm_weight.float() * proj_weight.reshape(-1).float()).double()  # [H], float32 as in pass 2
    chunk_rows = workspace[: tiling.chunk_num * hidden * 4].view(torch.float32).view(tiling.chunk_num, hidden)
    for core in range(tiling.used_core_num):
        first, last = core_range(core, tiling.former_core_num, tiling.former_core_chunks, tiling.tail_core_chunks)
        for chunk in range(first, last):
            chunk_sum = torch.zeros(hidden, dtype=torch.float64, device=partial_block.device)
            chunk_stop = min((chunk + 1) * tiling.chunk_tokens, tiling.tokens)
            for t0 in range(chunk * tiling.chunk_tokens, chunk_stop, tiling.tokens_per_loop):
                t1 = min(t0 + tiling.tokens_per_loop, chunk_stop)
                tensors = (partial_block, block_res, grad_hidden_states, norm * proj)  # exact weight for the sums
                a, c, p = _row_coefficients(tensors, inv_norm, probs, t0, t1, tiling)
                for h0, h1 in hidden_tiles(tiling.h_tile, tiling.h_tile_num, tiling.h_last_tile):
                    values = value_rows(partial_block, block_res, t0, t1, h0, h1)  # [B, R, h]
                    go = grad_hidden_states[t0:t1, h0:h1].double().unsqueeze(1)  # [B, 1, h]
                    grads = go * p + a * score_weight[h0:h1] - c * values
                    grad_block_res[t0:t1, :, h0:h1] = grads[:, :blocks].to(grad_block_res.dtype)
                    grad_partial_block[t0:t1, h0:h1] = grads[:, blocks].to(grad_partial_block.dtype)
                    contributions = (a * values).reshape(-1, h1 - h0)  # [(B R), h] in token, row order
                    chunk_sum[h0:h1] = sequential_sum(contributions, dim=0, start=chunk_sum[h0:h1])
            chunk_rows[chunk] = chunk_sum.float()
    weight_grad = sequential_sum(chunk_rows.double(), dim=0)  # [H], chunks in order
    grad_norm_weight.copy_((weight_grad * proj).to(grad_norm_weight.dtype))
    grad_proj_weight.copy_((weight_grad * norm).to(grad_proj_weight.dtype).view(1, hidden))


def _row_coefficients(tensors, inv_norm, probs, t0, t1, tiling):
    """Per-row coefficients of tokens [t0, t1): a = gs * r and c = gs * wv * r^3 / H, and p; [B, R, 1]."""
    partial_block, block_res, grad_hidden_states, score_weight = tensors
    g = wv = None
    for h0, h1 in hidden_tiles(tiling.h_tile, tiling.h_tile_num, tiling.h_last_tile):
        values = value_rows(partial_block, block_res, t0, t1, h0, h1)
        go = grad_hidden_states[t0:t1, h0:h1].double().unsqueeze(1)
        g = sequential_sum(go * values, dim=-1, start=g)
        wv = sequential_sum(values * score_weight[h0:h1], dim=-1, start=wv)
    p = probs[t0:t1].double()
    r = inv_norm[t0:t1].double()
    gs = p * (g - sequential_sum(p * g, dim=-1).unsqueeze(-1))
    a = gs * r
    c = gs * wv * r * r * r / tiling.hidden
    return a.unsqueeze(-1), c.unsqueeze(-1), p.unsqueeze(-1)


KERNEL = OpKernel(TILING, block_attention_residuals_grad_kernel)
