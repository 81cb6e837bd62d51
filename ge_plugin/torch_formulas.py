"""The ops' math in differentiable torch ops, accumulated in float32 (SPEC.md's formulas).

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


def _values(partial_block: torch.Tensor, block_res: torch.Tensor) -> torch.Tensor:
    """[T, N+1, H] float32, the partial block last."""
    return torch.cat([block_res, partial_block.unsqueeze(-2)], dim=-2).float()


def _score_weight(proj_weight: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    return norm_weight.float() * proj_weight.reshape(-1).float()


def statistics(partial_block, block_res, proj_weight, norm_weight, norm_eps: float):
    """The forward's (inv_norm [T, N+1], probs [T, N+1]), float32."""
    values = _values(partial_block, block_res)
    inv_norm = torch.rsqrt(values.pow(2).mean(dim=-1) + norm_eps)
    scores = inv_norm * (values @ _score_weight(proj_weight, norm_weight))
    return inv_norm, torch.softmax(scores, dim=-1)


def forward(partial_block, block_res, proj_weight, norm_weight, norm_eps: float):
    """The forward op's (hidden_states in partial_block's dtype, inv_norm, probs)."""
    inv_norm, probs = statistics(partial_block, block_res, proj_weight, norm_weight, norm_eps)
    hidden_states = (probs.unsqueeze(-1) * _values(partial_block, block_res)).sum(dim=-2)
    return hidden_states.to(partial_block.dtype), inv_norm, probs


def backward(partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm, probs):
    """The backward op's (grad_partial_block, grad_block_res, grad_proj_weight, grad_norm_weight), float32,
    from the given statistics (SPEC.md's BlockAttentionResidualsGrad)."""
    values = _values(partial_block, block_res)
    weight = _score_weight(proj_weight, norm_weight)
    grad_out = grad_hidden_states.float()
    inv_norm, probs = inv_norm.float(), probs.float()
    grad_probs = (values @ grad_out.unsqueeze(-1)).squeeze(-1)
    grad_scores = probs * (grad_probs - (probs * grad_probs).sum(dim=-1, keepdim=True))
    scaled = grad_scores * inv_norm
    grad_weight = torch.einsum("ti,tih->h", scaled, values)
    grad_inv_norm = grad_scores * (values @ weight)
    grad_values = (
        grad_out.unsqueeze(-2) * probs.unsqueeze(-1)
        + scaled.unsqueeze(-1) * weight
        - (grad_inv_norm * inv_norm.pow(3) / values.shape[-1]).unsqueeze(-1) * values
    )
    grad_proj = (grad_weight * norm_weight.float()).reshape(proj_weight.shape)
    grad_norm = grad_weight * proj_weight.reshape(-1).float()
    return grad_values[..., -1, :], grad_values[..., :-1, :], grad_proj, grad_norm


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
