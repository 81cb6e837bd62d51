"""torch op `attnres::block_attention_residuals` (GE type BlockAttentionResiduals) and its autograd.

The forward returns (hidden_states [T, H], inv_norm [T, N+1] float32, probs [T, N+1] float32);
inv_norm and probs are empty ([0]) unless need_backward is true. Autograd saves them and
calls `attnres::block_attention_residuals_backward`.
"""

from __future__ import annotations

import torch

from ..op_proto import FORWARD
from .op_common import CPP_ENTRY, LIBRARY, fake_outputs, run_eager

NAME = "block_attention_residuals"
SCHEMA = (
    "(Tensor partial_block, Tensor block_res, Tensor proj_weight, Tensor norm_weight, "
    "int valid_block_num=-1, float norm_eps=1e-06, bool need_backward=False) -> (Tensor, Tensor, Tensor)"
)
LIBRARY.define(NAME + SCHEMA)


def _cpu(
    partial_block: torch.Tensor,
    block_res: torch.Tensor,
    proj_weight: torch.Tensor,
    norm_weight: torch.Tensor,
    valid_block_num: int = -1,
    norm_eps: float = 1e-6,
    need_backward: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    attrs = {"valid_block_num": valid_block_num, "norm_eps": norm_eps, "need_backward": need_backward}
    return run_eager(FORWARD, (partial_block, block_res, proj_weight, norm_weight), attrs)


def _fake(partial_block, block_res, proj_weight, norm_weight, valid_block_num=-1, norm_eps=1e-6, need_backward=False):
    attrs = {"valid_block_num": valid_block_num, "norm_eps": norm_eps, "need_backward": need_backward}
    return fake_outputs(FORWARD, (partial_block, block_res, proj_weight, norm_weight), attrs)


def _setup_context(ctx, inputs, output):
    partial_block, block_res, proj_weight, norm_weight, _, norm_eps, need_backward = inputs
    _, inv_norm, probs = output
    ctx.mark_non_differentiable(inv_norm, probs)
    ctx.save_for_backward(partial_block, block_res, proj_weight, norm_weight, inv_norm, probs)
    ctx.norm_eps = norm_eps
    ctx.saved_stats = need_backward


def _backward(ctx, grad_hidden_states, _grad_inv_norm, _grad_probs):
    partial_block, block_res, proj_weight, norm_weight, inv_norm, probs = ctx.saved_tensors
    if not ctx.saved_stats:
        # Called directly with need_backward=False: compute the statistics now rather than fail.
        _, inv_norm, probs = torch.ops.attnres.block_attention_residuals(
            partial_block, block_res, proj_weight, norm_weight, -1, ctx.norm_eps, True
        )
    grad_partial, grad_blocks, grad_proj, grad_norm = torch.ops.attnres.block_attention_residuals_backward(
        partial_block,
        block_res,
        proj_weight.reshape(1, -1),
        norm_weight,
        grad_hidden_states,
        inv_norm,
        probs,
    )
    return grad_partial, grad_blocks, grad_proj.reshape(proj_weight.shape), grad_norm, None, None, None


torch.library.register_fake(f"attnres::{NAME}", _fake, lib=LIBRARY)
if not CPP_ENTRY:  # else ge_plugin/csrc registers the CPU kernel and the same autograd in C++
    LIBRARY.impl(NAME, _cpu, "CPU")
    torch.library.register_autograd(f"attnres::{NAME}", _backward, setup_context=_setup_context, lib=LIBRARY)
