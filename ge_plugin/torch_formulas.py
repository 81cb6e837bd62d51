"""The ops' math in differentiable torch ops, in float32: the reference's formulas (op_kernel/reference.py)
computed in float32.

The kernels compute first-order results; these formulas are what autograd differentiates where a
derivative of the kernels' outputs is needed beyond that (and forward-mode AD, `jvp`, under torch.func):

- `statistics_vjp`: the gradient of the forward's `inv_norm` and `probs` outputs with respect to the
  four inputs (they are outputs of the forward op like `hidden_states`, so a loss may use them);
- `backward_vjp`: the gradient of the backward op's four outputs with respect to its seven inputs,
  `inv_norm` and `probs` among them (taken as given by the backward op, so their own dependence on the
  inputs flows back through the forward op's node): second-order gradients.

Both run through torch.func.vjp, so they are differentiable again (third order) and compose with
torch.func transforms. Each materialises a few float32 [T, N+1, H] intermediates.
"""

from __future__ import annotations

import torch

from attnres_ge.op_kernel.reference import backward_math, forward_math


def statistics(partial_block, block_res, proj_weight, norm_weight, norm_eps: float):
    """The forward's (inv_norm [T, N+1], probs [T, N+1]), float32."""
    return forward_math(partial_block, block_res, proj_weight, norm_weight, norm_eps, torch.float32)[1:]


def forward(partial_block, block_res, proj_weight, norm_weight, norm_eps: float):
    """The forward op's (hidden_states in partial_block's dtype, inv_norm, probs)."""
    hidden_states, inv_norm, probs = forward_math(partial_block, block_res, proj_weight, norm_weight, norm_eps,
                                                  torch.float32)
    return hidden_states.to(partial_block.dtype), inv_norm, probs


def backward(partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm, probs):
    """The backward op's (grad_partial_block, grad_block_res, grad_proj_weight, grad_norm_weight), float32,
    from the given statistics."""
    grad_partial, grad_blocks, grad_proj, grad_norm = backward_math(
        partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm, probs, torch.float32
    )
    return grad_partial, grad_blocks, grad_proj.reshape(proj_weight.shape), grad_norm


def jvp(function, primals, tangents):
    """Tangents of `function`'s outputs at `primals` along `tangents` (None entries count as zero)."""
    tangents = tuple(torch.zeros_like(p) if t is None else t for p, t in zip(primals, tangents, strict=True))
    return torch.func.jvp(function, tuple(primals), tangents)[1]


def _vjp(function, primals, cotangents):
    """Gradients of `function` at `primals` along `cotangents` (None entries count as zero)."""
    outputs, pullback = torch.func.vjp(function, *primals)
    cotangents = tuple(
        torch.zeros_like(output) if cotangent is None else cotangent.to(output.dtype)
        for output, cotangent in zip(outputs, cotangents, strict=True)
    )
    return pullback(cotangents)


def statistics_vjp(inputs, norm_eps: float, grad_inv_norm, grad_probs):
    """Gradients of the four forward inputs from gradients of inv_norm and probs (either may be None)."""
    return _vjp(lambda *tensors: statistics(*tensors, norm_eps), inputs, (grad_inv_norm, grad_probs))


def backward_vjp(inputs, grad_outputs):
    """Gradients of the backward op's seven inputs from gradients of its four outputs (None: zero)."""
    return _vjp(backward, inputs, grad_outputs)
