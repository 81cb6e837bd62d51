"""The autograd of torch op `attnres::block_attention_residuals` (GE type BlockAttentionResiduals); the op
itself is defined from its registry entry (op_common.define_op).

The forward returns (hidden_states [T, H], inv_norm [T, N+1] float32, probs [T, N+1] float32);
inv_norm and probs are empty ([0]) unless need_backward is true. All three outputs are
differentiable (the statistics only when need_backward is true): autograd saves the inputs and the
statistics, runs `attnres::block_attention_residuals_backward` for the gradient of hidden_states,
and differentiates torch_formulas.statistics for gradients that reach inv_norm or probs (a loss
that uses the depth weights, or a second-order gradient through the backward op).

Three registrations run `ForwardFunction` below: the C++ entry's Autograd kernel does the same in
C++ (a repeated call costs no Python); without the C++ entry a Python Autograd kernel runs it; and
under torch.func transforms, which cannot run a C++ autograd Function, the
FuncTorchDynamicLayerFrontMode kernel runs it (that key is active only inside a transform, so
ordinary calls never reach it).
"""

from __future__ import annotations

import torch

from attnres_ge.ge_plugin import torch_formulas
from attnres_ge.ge_plugin.op_common import CPP_ENTRY, LIBRARY
from attnres_ge.ge_plugin.ops import BLOCK_ATTENTION_RESIDUALS as OP


def _add(first, second):
    """Sum of two gradients, either of which may be None."""
    if first is None:
        return second
    return first if second is None else first + second


def statistics_backward(partial_block, block_res, proj_weight, norm_weight, norm_eps, grad_inv_norm, grad_probs):
    """Gradients of the four inputs from gradients of inv_norm and probs (the C++ entry calls this too)."""
    inputs = (partial_block, block_res, proj_weight, norm_weight)
    return torch_formulas.statistics_vjp(inputs, norm_eps, grad_inv_norm, grad_probs)


class ForwardFunction(torch.autograd.Function):
    """The forward op's autograd (see the module docstring for where it runs)."""

    @staticmethod
    def forward(partial_block, block_res, proj_weight, norm_weight, valid_block_num, norm_eps, need_backward):
        with torch._C._AutoDispatchBelowAutograd():
            return torch.ops.attnres.block_attention_residuals.default(
                partial_block, block_res, proj_weight, norm_weight, valid_block_num, norm_eps, need_backward
            )

    @staticmethod
    def setup_context(ctx, inputs, output):
        partial_block, block_res, proj_weight, norm_weight, _, norm_eps, need_backward = inputs
        _, inv_norm, probs = output
        if not need_backward:  # empty statistics: nothing to differentiate
            ctx.mark_non_differentiable(inv_norm, probs)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(partial_block, block_res, proj_weight, norm_weight, inv_norm, probs)
        ctx.save_for_forward(partial_block, block_res, proj_weight, norm_weight)
        ctx.norm_eps = norm_eps
        ctx.saved_stats = need_backward

    @staticmethod
    def jvp(ctx, *tangents):
        """Forward-mode AD (torch.func.jvp, jacfwd, hessian): the forward's formula in torch ops."""
        outputs = torch_formulas.jvp(lambda *tensors: torch_formulas.forward(*tensors, ctx.norm_eps),
                                     ctx.saved_tensors, tangents[:4])
        if not ctx.saved_stats:  # the statistics are the empty, non-differentiable [0] outputs
            return outputs[0], None, None
        return outputs

    @staticmethod
    def backward(ctx, grad_hidden_states, grad_inv_norm, grad_probs):
        partial_block, block_res, proj_weight, norm_weight, inv_norm, probs = ctx.saved_tensors
        grads = [None] * 4
        if grad_hidden_states is not None:
            if not ctx.saved_stats:
                # Called directly with need_backward=False: compute the statistics now rather than fail.
                _, inv_norm, probs = torch.ops.attnres.block_attention_residuals(
                    partial_block, block_res, proj_weight, norm_weight, -1, ctx.norm_eps, True
                )
            grads = list(
                torch.ops.attnres.block_attention_residuals_backward(
                    partial_block,
                    block_res,
                    proj_weight.reshape(1, -1),
                    norm_weight,
                    grad_hidden_states,
                    inv_norm,
                    probs,
                )
            )
            grads[2] = grads[2].reshape(proj_weight.shape)
        if grad_inv_norm is not None or grad_probs is not None:
            extra = statistics_backward(
                partial_block, block_res, proj_weight, norm_weight, ctx.norm_eps, grad_inv_norm, grad_probs
            )
            grads = [_add(grad, more) for grad, more in zip(grads, extra, strict=True)]
        return (*grads, None, None, None)

    @staticmethod
    def vmap(info, in_dims, partial_block, block_res, proj_weight, norm_weight, valid_block_num, norm_eps,
             need_backward):
        attrs = (valid_block_num, norm_eps, need_backward)
        tensors = (partial_block, block_res, proj_weight, norm_weight)
        if in_dims[2] is None and in_dims[3] is None:
            return _vmap_folded(info.batch_size, in_dims, tensors, attrs)
        return _vmap_loop(torch.ops.attnres.block_attention_residuals.default, info.batch_size, in_dims, tensors,
                          attrs)


def _batch_first(tensor: torch.Tensor, dim: int | None, batch_size: int) -> torch.Tensor:
    if dim is None:
        return tensor.expand(batch_size, *tensor.shape)
    return tensor.movedim(dim, 0)


def _vmap_folded(batch_size, in_dims, tensors, attrs):
    """Shared weights: the batch folded into the tokens, one call."""
    partial_block, block_res, proj_weight, norm_weight = tensors
    partial_block = _batch_first(partial_block, in_dims[0], batch_size)
    block_res = _batch_first(block_res, in_dims[1], batch_size)
    tokens, hidden = partial_block.shape[1], partial_block.shape[-1]
    hidden_states, inv_norm, probs = torch.ops.attnres.block_attention_residuals.default(
        partial_block.reshape(batch_size * tokens, hidden),
        block_res.reshape(batch_size * tokens, block_res.shape[-2], hidden),
        proj_weight,
        norm_weight,
        *attrs,
    )
    hidden_states = hidden_states.reshape(batch_size, tokens, hidden)
    if inv_norm.dim() == 1:  # empty statistics: the same [0] for every sample
        return (hidden_states, inv_norm, probs), (0, None, None)
    return (hidden_states, inv_norm.reshape(batch_size, tokens, -1), probs.reshape(batch_size, tokens, -1)), (0, 0, 0)


def _vmap_loop(op, batch_size, in_dims, tensors, attrs, **kwargs):
    """One call per sample, results stacked: the rule for batched weights (forward) and for the backward,
    whose weight gradients are per-sample sums."""
    samples = []
    for index in range(batch_size):
        # in_dims covers every argument of the op, attributes included; only the tensors are selected.
        sample = [
            tensor if dim is None else tensor.select(dim, index)
            for tensor, dim in zip(tensors, in_dims[: len(tensors)], strict=True)
        ]
        samples.append(op(*sample, *attrs, **kwargs))
    stacked = tuple(torch.stack(outputs) for outputs in zip(*samples, strict=True))
    return stacked, (0,) * len(stacked)


def _apply(partial_block, block_res, proj_weight, norm_weight, valid_block_num=-1, norm_eps=1e-6, need_backward=False):
    return ForwardFunction.apply(partial_block, block_res, proj_weight, norm_weight, valid_block_num, norm_eps,
                                 need_backward)


LIBRARY.impl(OP.name, _apply, "FuncTorchDynamicLayerFrontMode")
if not CPP_ENTRY:  # else ge_plugin/csrc registers the same autograd in C++ (block_attention_residuals_grad.py)
    LIBRARY.impl(OP.name, _apply, "Autograd")
