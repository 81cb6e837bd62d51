"""The autograd of torch op `attnres::block_attention_residuals_backward` (GE type BlockAttentionResidualsGrad);
the op itself is defined from its registry entry (op_common.define_op).

Returns (grad_partial_block [T, H], grad_block_res [T, N, H], grad_proj_weight [1, H],
grad_norm_weight [H]) in the dtype of partial_block, from the forward's saved inv_norm and probs.

The op is differentiable in all seven inputs (second-order gradients: a gradient penalty, a
Hessian-vector product): `BackwardFunction` differentiates torch_formulas.backward, which takes
inv_norm and probs as given like the kernel; their dependence on the inputs flows back through the
forward op's node that produced them. Only a call that needs a graph (grad mode on and an input that
requires grad: a backward with create_graph=True) runs it; every other call goes straight to the
kernel. The C++ entry's Autograd kernel makes that choice in C++; without the C++ entry a Python
one does; under torch.func transforms the FuncTorchDynamicLayerFrontMode kernel runs the Function.
"""

from __future__ import annotations

import torch

from attnres_ge.ge_plugin import cpp_entry, torch_formulas
from attnres_ge.ge_plugin.block_attention_residuals import _vmap_loop, statistics_backward
from attnres_ge.ge_plugin.op_common import CPP_ENTRY, LIBRARY
from attnres_ge.ge_plugin.ops import BLOCK_ATTENTION_RESIDUALS_GRAD as OP


class BackwardFunction(torch.autograd.Function):
    """The backward op as a differentiable function (see the module docstring)."""

    @staticmethod
    def forward(partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm, probs,
                valid_block_num):
        with torch._C._AutoDispatchBelowAutograd():
            return torch.ops.attnres.block_attention_residuals_backward.default(
                partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm, probs,
                valid_block_num=valid_block_num,
            )

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:7])
        ctx.save_for_forward(*inputs[:7])

    @staticmethod
    def jvp(ctx, *tangents):
        """Forward-mode AD (torch.func.jvp, jacfwd, hessian): the backward's formula in torch ops."""
        dtype = ctx.saved_tensors[0].dtype
        return tuple(tangent.to(dtype) for tangent in torch_formulas.jvp(torch_formulas.backward, ctx.saved_tensors,
                                                                         tangents[:7]))

    @staticmethod
    def backward(ctx, *grad_outputs):
        return (*torch_formulas.backward_vjp(ctx.saved_tensors, grad_outputs), None)

    @staticmethod
    def vmap(info, in_dims, *inputs):
        tensors, valid_block_num = inputs[:7], inputs[7]
        return _vmap_loop(torch.ops.attnres.block_attention_residuals_backward.default, info.batch_size, in_dims,
                          tensors, (), valid_block_num=valid_block_num)


def differentiable_backward(partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm, probs,
                            valid_block_num=0):
    """The op with a graph for its own backward (the C++ entry's Autograd kernel calls this when one is needed)."""
    return BackwardFunction.apply(partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm,
                                  probs, valid_block_num)


def _autograd(*tensors, valid_block_num=0):
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        return differentiable_backward(*tensors, valid_block_num)
    with torch._C._AutoDispatchBelowAutograd():
        return torch.ops.attnres.block_attention_residuals_backward.default(*tensors, valid_block_num=valid_block_num)


def _functorch(*tensors, valid_block_num=0):
    return differentiable_backward(*tensors, valid_block_num)


LIBRARY.impl(OP.name, _functorch, "FuncTorchDynamicLayerFrontMode")
if CPP_ENTRY:  # the C++ Autograd kernels of both ops; they call these for the derivatives the kernels do not compute
    cpp_entry.MODULE.set_autograd_formulas(statistics_backward, differentiable_backward)
    cpp_entry.MODULE.register_autograd()
else:
    LIBRARY.impl(OP.name, _autograd, "Autograd")
