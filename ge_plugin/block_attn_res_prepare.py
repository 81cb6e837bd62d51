"""The autograd of torch op `attnres::block_attn_res_prepare` (GE type BlockAttnResPrepare); the op itself is
defined from its registry entry (op_common.define_op).

    block_attn_res_prepare(block_res [T, N, D], valid_blocks [1] uint64, pseudo_query [S, D], *, eps)
        -> (numerator [S, T, D], logit_max [S, T], exp_sum [S, T]), all float32

Differentiable in block_res and pseudo_query (CANN lists the op for training). The backward is not
fused: it differentiates `masked_prepare` below, the op's formulas in float64 torch ops, by
torch.func.vjp. That formula masks the snapshots past Nv = min(valid_blocks[0], N) rather than
slicing them off, so it needs no Python int from a tensor and traces under torch.compile. Its Autograd
kernel (op_common.register_gradient_in_python) sends a call that needs no gradient (a decode step's)
below autograd, without Python where the C++ entry is built; one that needs one runs _Differentiable.
"""

from __future__ import annotations

import torch

from attnres_ge.ge_plugin.op_common import register_gradient_in_python
from attnres_ge.ge_plugin.ops import BLOCK_ATTN_RES_PREPARE as OP
from attnres_ge.op_kernel.reference import LOWEST_FLOAT32
from attnres_ge.op_proto.op_def import float32

GRAD_DTYPE = torch.float64  # the backward's arithmetic; its results are rounded to float32 once


def masked_prepare(block_res, valid_blocks, pseudo_query, eps: float, dtype: torch.dtype = GRAD_DTYPE):
    """The op's (numerator, logit_max, exp_sum) in differentiable torch ops computed in `dtype`, with the
    rows n >= Nv masked out; Nv = 0 gives the empty state (constant, so its gradient is 0)."""
    blocks = block_res.shape[1]
    keep = torch.arange(blocks, device=block_res.device) < valid_blocks.reshape(-1)[:1].to(torch.float64)  # [N]
    rows = block_res.to(dtype) * keep.unsqueeze(-1)  # [T, N, D]: masked rows are 0, so is their gradient
    norm = torch.sqrt(rows.pow(2).mean(dim=-1) + eps)  # [T, N]
    logits = torch.einsum("sd,tnd->stn", pseudo_query.to(dtype), rows) / norm  # [S, T, N]
    logits = torch.where(keep, logits, LOWEST_FLOAT32)  # a masked row's exp is 0 once any row is kept
    logit_max = logits.amax(dim=-1)
    weights = torch.exp(logits - logit_max.unsqueeze(-1))
    numerator = torch.einsum("stn,tnd->std", weights, rows)
    any_kept = keep.any()
    return (torch.where(any_kept, numerator, 0.0), torch.where(any_kept, logit_max, LOWEST_FLOAT32),
            torch.where(any_kept, weights.sum(dim=-1), 0.0))


class _Differentiable(torch.autograd.Function):
    """The op with its derivative: the kernel's outputs, and in the backward the vjp of masked_prepare."""

    @staticmethod
    def forward(block_res, valid_blocks, pseudo_query, eps):
        with torch._C._AutoDispatchBelowAutograd():
            return torch.ops.attnres.block_attn_res_prepare.default(block_res, valid_blocks, pseudo_query, eps=eps)

    @staticmethod
    def setup_context(ctx, inputs, output):
        block_res, valid_blocks, pseudo_query, eps = inputs
        ctx.save_for_backward(block_res, valid_blocks, pseudo_query)
        ctx.eps = float32(eps)  # as the kernel holds it

    @staticmethod
    def backward(ctx, grad_numerator, grad_logit_max, grad_exp_sum):
        block_res, valid_blocks, pseudo_query = ctx.saved_tensors

        def formula(rows, queries):
            return masked_prepare(rows, valid_blocks, queries, ctx.eps)

        outputs, pullback = torch.func.vjp(formula, block_res, pseudo_query)
        cotangents = tuple(torch.zeros_like(out) if grad is None else grad.to(out.dtype)
                           for out, grad in zip(outputs, (grad_numerator, grad_logit_max, grad_exp_sum), strict=True))
        grad_block_res, grad_pseudo_query = pullback(cotangents)
        return grad_block_res.to(block_res.dtype), None, grad_pseudo_query.to(pseudo_query.dtype), None


register_gradient_in_python(OP.name, _Differentiable.apply)
