"""Kernels of the general read, BlockAttnResRead and BlockAttnResReadGrad (op_proto/block_attn_res_read.py).

Unlike the fixed-arity ops, whose launches take one tiling record and a pointer per tensor, the read takes a
list of sources, each read where it lies (its own row stride), so its kernels are called with the tensors:

    read_forward(sources, query, key_norm_weight, output_norm_weight, out, inv_norm, probs, output_inv_rms,
                 eps, output_eps, scale, normalize_values)
    read_backward(grad_out, sources, query, key_norm_weight, output_norm_weight, inv_norm, probs,
                  output_inv_rms, grad_sources, grad_query, grad_key_norm_weight, grad_output_norm_weight,
                  eps, output_eps, scale, normalize_values)

sources: L tensors [T, H] of one dtype with unit column stride; query [S, H], key_norm_weight [H] and
output_norm_weight [W, H] (W = 1 or S) float32 and contiguous, each weight or None; the outputs contiguous,
the statistics None when not kept (forward) and output_inv_rms None without an output norm. The epsilons and
the scale arrive rounded to float32. The native implementation is op_kernel/native.py's pair of the same
names; the Python one here computes in float64 (the oracle).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnres_ge.op_kernel import active_implementation, native_module


def _read_math(sources, query, key_norm_weight, output_norm_weight, eps, output_eps, scale, normalize_values):
    """(o [S, T, H], r [T, L], p [S, T, L], rho [S, T] or None) in float64, differentiable."""
    rows = torch.stack([source.double() for source in sources])  # [L, T, H]
    inv_norm = torch.rsqrt(rows.pow(2).mean(dim=-1) + eps)  # [L, T]
    query_w = query.double() if key_norm_weight is None else query.double() * key_norm_weight.double()
    logits = scale * torch.einsum("sh,lth->stl", query_w, rows) * inv_norm.t()
    probs = torch.softmax(logits, dim=-1)  # [S, T, L]
    values = rows * inv_norm.unsqueeze(-1) if normalize_values else rows
    mixed = torch.einsum("stl,lth->sth", probs, values)
    if output_norm_weight is None:
        return mixed, inv_norm.t(), probs, None
    inv_rms = torch.rsqrt(mixed.pow(2).mean(dim=-1) + output_eps)  # [S, T]
    return mixed * inv_rms.unsqueeze(-1) * output_norm_weight.double().unsqueeze(1), inv_norm.t(), probs, inv_rms


def python_read_forward(sources, query, key_norm_weight, output_norm_weight, out, inv_norm, probs, output_inv_rms,
                        eps, output_eps, scale, normalize_values) -> None:
    mixed, r, p, rho = _read_math(sources, query, key_norm_weight, output_norm_weight, eps, output_eps, scale,
                                  normalize_values)
    out.copy_(mixed)
    for saved, value in ((inv_norm, r), (probs, p), (output_inv_rms, rho)):
        if saved is not None:
            saved.copy_(value)


def python_read_backward(grad_out, sources, query, key_norm_weight, output_norm_weight, inv_norm, probs,
                         output_inv_rms, grad_sources, grad_query, grad_key_norm_weight, grad_output_norm_weight,
                         eps, output_eps, scale, normalize_values) -> None:
    """The derivative of the float64 forward at these inputs (the saved statistics are recomputed in float64)."""
    leaves = [tensor.detach().double().requires_grad_() if tensor is not None else None
              for tensor in (*sources, query, key_norm_weight, output_norm_weight)]
    rows, (query64, key64, gain64) = leaves[:len(sources)], leaves[len(sources):]
    with torch.enable_grad():
        mixed = _read_math(rows, query64, key64, gain64, eps, output_eps, scale, normalize_values)[0]
        wanted = [leaf for leaf in leaves if leaf is not None]
        grads = torch.autograd.grad(mixed, wanted, grad_out.double(), allow_unused=True)
    targets = [*grad_sources, grad_query, grad_key_norm_weight, grad_output_norm_weight]
    given = iter(grads)
    for leaf, target in zip(leaves, targets, strict=True):
        if leaf is not None:
            grad = next(given)
            target.copy_(torch.zeros_like(target) if grad is None else grad)


def read_forward(*arguments) -> None:
    """The forward in the implementation in use (op_kernel.KERNELS)."""
    kernel = native_module().read_forward if active_implementation() == "native" else python_read_forward
    kernel(*arguments)


def read_backward(*arguments) -> None:
    """The backward in the implementation in use (op_kernel.KERNELS)."""
    kernel = native_module().read_backward if active_implementation() == "native" else python_read_backward
    kernel(*arguments)


def gathered_sources(sources: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The sources as the kernels take them: each with unit column stride (a copy only where it has none)."""
    return [source if source.stride(-1) == 1 or source.shape[-1] <= 1 else source.contiguous() for source in sources]
