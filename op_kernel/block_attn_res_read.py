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

from collections.abc import Callable, Sequence

import torch

from attnres_ge.op_kernel import active_implementation, native_module
from attnres_ge.op_kernel.kernel_spec import TensorKernel
from attnres_ge.op_proto.block_attn_res_read import PROTOTYPE as READ
from attnres_ge.op_proto.block_attn_res_read_grad import PROTOTYPE as READ_GRAD
from attnres_ge.op_proto.op_def import float32

EMPTY = (0,)  # the shape of a statistic or weight gradient that is not produced


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
    """The backward's formulas (docs/contract.md, "The general read") in float64, the statistics recomputed."""
    rows = torch.stack([source.double() for source in sources])  # [L, T, H]
    hidden = rows.shape[-1]
    r = torch.rsqrt(rows.pow(2).mean(dim=-1) + eps)  # [L, T]
    weight = torch.ones(hidden, dtype=torch.float64) if key_norm_weight is None else key_norm_weight.double()
    query_w = query.double() * weight  # [S, H]
    dots = torch.einsum("sh,lth->stl", query_w, rows)  # <q_s w, x_i>
    p = torch.softmax(scale * dots * r.t(), dim=-1)  # [S, T, L]
    values = rows * r.unsqueeze(-1) if normalize_values else rows
    grad_mixed = _grad_before_output_norm(grad_out.double(), torch.einsum("stl,lth->sth", p, values),
                                          output_norm_weight, output_eps, grad_output_norm_weight)
    a = torch.einsum("sth,lth->stl", grad_mixed, values)  # <gy_s, v_i>
    dz = scale * p * (a - (p * a).sum(dim=-1, keepdim=True))
    mixed_grad = torch.einsum("stl,sth->lth", p, grad_mixed)  # sum_s p gy_s
    value_part = mixed_grad * r.unsqueeze(-1) if normalize_values else mixed_grad
    radial = torch.einsum("stl,stl->lt", dz, dots)  # sum_s dz <q_s w, x_i>
    if normalize_values:
        radial = radial + (p * a).sum(dim=0).t() / r
    grad_rows = (torch.einsum("stl,sh->lth", dz, query_w) * r.unsqueeze(-1) + value_part
                 - rows * (r.pow(3) / hidden * radial).unsqueeze(-1))
    for target, grad in zip(grad_sources, grad_rows, strict=True):
        target.copy_(grad)
    per_query = torch.einsum("stl,lt,lth->sh", dz, r, rows)  # sum over tokens of sum_i dz r_i x_i
    grad_query.copy_(per_query * weight)
    if grad_key_norm_weight is not None:
        grad_key_norm_weight.copy_((per_query * query.double()).sum(dim=0))


def _grad_before_output_norm(grad_out, mixed, gain, output_eps, grad_gain):
    """The gradient of y = sum_i p v_i from that of o = g y rho; writes grad_gain. Without a gain: grad_out."""
    if gain is None:
        return grad_out
    rho = torch.rsqrt(mixed.pow(2).mean(dim=-1, keepdim=True) + output_eps)  # [S, T, 1]
    gain = gain.double().unsqueeze(1)  # [W, 1, H]
    gained = gain * grad_out
    along = (gained * mixed).sum(dim=-1, keepdim=True)
    per_query = (grad_out * mixed * rho).sum(dim=1)  # [S, H]
    grad_gain.copy_(per_query if grad_gain.shape[0] == per_query.shape[0] else per_query.sum(dim=0, keepdim=True))
    return rho * gained - mixed * rho.pow(3) / mixed.shape[-1] * along


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


def _float32_parameter(tensor: torch.Tensor | None, rows: int | None = None) -> torch.Tensor | None:
    """A query or weight as the kernels take it: float32, contiguous, 2-D with `rows` given."""
    if tensor is None:
        return None
    tensor = tensor.to(torch.float32).contiguous()
    return tensor.reshape(1, -1) if rows is not None and tensor.dim() == 1 else tensor


def _kernel_scalars(attrs: dict) -> tuple:
    return float32(attrs["eps"]), float32(attrs["output_eps"]), float32(attrs["scale"]), attrs["normalize_values"]


def _kept(tensor: torch.Tensor) -> torch.Tensor | None:
    """A statistic the kernel writes, or None where it is not kept (an empty output)."""
    return tensor if tuple(tensor.shape) != EMPTY else None


def run_read(inputs: Sequence, attrs: dict, outputs: Sequence, allocate: Callable) -> list:
    """BlockAttnResRead on validated inputs (sources, query, key_norm_weight, output_norm_weight) with bound
    attributes and InferShape's output metas: [hidden_states, inv_norm, probs, output_inv_rms]."""
    sources, query, key_norm_weight, output_norm_weight = inputs
    hidden, inv_norm, probs, inv_rms = (allocate(meta.shape, meta.dtype) for meta in outputs)
    read_forward(gathered_sources(sources), _float32_parameter(query), _float32_parameter(key_norm_weight),
                 _float32_parameter(output_norm_weight, rows=1),
                 hidden, _kept(inv_norm), _kept(probs), _kept(inv_rms), *_kernel_scalars(attrs))
    return [hidden, inv_norm, probs, inv_rms]


def run_read_backward(inputs: Sequence, attrs: dict, outputs: Sequence, allocate: Callable) -> list:
    """BlockAttnResReadGrad likewise: [grad_sources (one per source), grad_query, grad_key_norm_weight,
    grad_output_norm_weight]."""
    grad_hidden_states, sources, query, inv_norm, probs, output_inv_rms, key_norm_weight, output_norm_weight = inputs
    grad_source_meta, *weight_metas = outputs
    grad_sources = [allocate(grad_source_meta.shape, grad_source_meta.dtype) for _ in sources]
    grad_query, grad_key, grad_gain = (allocate(meta.shape, meta.dtype) for meta in weight_metas)
    gain = _float32_parameter(output_norm_weight, rows=1)
    read_backward(grad_hidden_states.contiguous(), gathered_sources(sources), _float32_parameter(query),
                  _float32_parameter(key_norm_weight), gain, inv_norm.contiguous(), probs.contiguous(),
                  output_inv_rms.contiguous() if output_norm_weight is not None else None,
                  grad_sources, grad_query, grad_key if key_norm_weight is not None else None,
                  grad_gain.view(gain.shape) if gain is not None else None, *_kernel_scalars(attrs))
    return [grad_sources, grad_query, grad_key, grad_gain]


READ_KERNEL = TensorKernel(READ, run_read)
READ_GRAD_KERNEL = TensorKernel(READ_GRAD, run_read_backward)
