"""torch ops `attnres::block_attn_res_read` (GE type BlockAttnResRead) and `attnres::block_attn_res_read_backward`
(BlockAttnResReadGrad), and the read's autograd.

    block_attn_res_read(Tensor[] sources, Tensor query, Tensor? key_norm_weight, Tensor? output_norm_weight, *,
                        eps, output_eps, scale, normalize_values, save_statistics)
        -> (hidden_states [S, T, H], inv_norm [T, L], probs [S, T, L], output_inv_rms [S, T])

The schemas come from the prototypes (the ops' entries in ops.TENSOR_OPS). Unlike the registry's fixed-arity ops
(ops.OPS), whose eager calls run through the launcher's per-signature plans and the C++ entry, the read takes a
list of tensors read where they lie, so its eager implementation here validates (the prototype) and calls its
TensorKernel (op_kernel/block_attn_res_read.py), as the local GE does. The derivative needs the statistics: a
forward called without save_statistics whose result needs a gradient raises.
"""

from __future__ import annotations

import torch

from attnres_ge.ge_plugin import cpp_entry
from attnres_ge.ge_plugin.op_common import LIBRARY
from attnres_ge.ge_plugin.ops import NAMESPACE, READ_GRAD_OP, READ_OP
from attnres_ge.ge_plugin.tensor_op_common import checked_call, require_cpu
from attnres_ge.op_kernel.block_attn_res_read import READ_GRAD_KERNEL, READ_KERNEL
from attnres_ge.op_proto.op_def import WHERE_EAGER, WHERE_FAKE, Checker

READ, READ_GRAD = READ_KERNEL.prototype, READ_GRAD_KERNEL.prototype


def read_eager(sources, query, key_norm_weight=None, output_norm_weight=None, **keywords):
    tensors = (sources, query, key_norm_weight, output_norm_weight)
    attrs, outputs = checked_call(READ, tensors, keywords, WHERE_EAGER)
    require_cpu(READ.op_type, sources[0])
    return tuple(READ_KERNEL.run(tensors, attrs, outputs, cpp_entry.empty_output))


def read_fake(sources, query, key_norm_weight=None, output_norm_weight=None, **keywords):
    _, outputs = checked_call(READ, (sources, query, key_norm_weight, output_norm_weight), keywords, WHERE_FAKE)
    return tuple(sources[0].new_empty(meta.shape, dtype=meta.dtype) for meta in outputs)


def read_backward_eager(grad_hidden_states, sources, query, inv_norm, probs, output_inv_rms, key_norm_weight=None,
                        output_norm_weight=None, **keywords):
    tensors = (grad_hidden_states, sources, query, inv_norm, probs, output_inv_rms, key_norm_weight,
               output_norm_weight)
    attrs, outputs = checked_call(READ_GRAD, tensors, keywords, WHERE_EAGER)
    require_cpu(READ_GRAD.op_type, sources[0])
    return tuple(READ_GRAD_KERNEL.run(tensors, attrs, outputs, cpp_entry.empty_output))


def read_backward_fake(grad_hidden_states, sources, query, inv_norm, probs, output_inv_rms, key_norm_weight=None,
                       output_norm_weight=None, **keywords):
    tensors = (grad_hidden_states, sources, query, inv_norm, probs, output_inv_rms, key_norm_weight,
               output_norm_weight)
    _, (grad_source_meta, *weight_metas) = checked_call(READ_GRAD, tensors, keywords, WHERE_FAKE)
    new = sources[0].new_empty
    return ([new(grad_source_meta.shape, dtype=grad_source_meta.dtype) for _ in sources],
            *(new(meta.shape, dtype=meta.dtype) for meta in weight_metas))


def _setup_context(ctx, inputs, keyword_only_inputs, output):
    sources, query, key_norm_weight, output_norm_weight = inputs
    _, inv_norm, probs, inv_rms = output
    ctx.mark_non_differentiable(inv_norm, probs, inv_rms)  # statistics, like torch.sort's indices
    ctx.attrs = READ.bind_attrs(keyword_only_inputs, WHERE_EAGER)
    ctx.source_count = len(sources)
    ctx.save_for_backward(*sources, query, key_norm_weight, output_norm_weight, inv_norm, probs, inv_rms)


def _backward(ctx, grad_hidden_states, *unused_statistics_grads):
    if not ctx.attrs["save_statistics"]:
        Checker(READ.op_type, WHERE_EAGER).fail(
            "a gradient was asked of a read made without save_statistics=True, which the backward needs "
            "(attnres_ge.fused_attnres sets it whenever an input requires grad)")
    # One gradient per argument the call passed: the dispatcher drops trailing arguments left at their default.
    passed = len(ctx.needs_input_grad)
    saved = ctx.saved_tensors
    sources, (query, key, gain, inv_norm, probs, inv_rms) = list(saved[:ctx.source_count]), saved[ctx.source_count:]
    attrs = {name: value for name, value in ctx.attrs.items() if name != "save_statistics"}
    grad_sources, grad_query, grad_key, grad_gain = getattr(torch.ops, NAMESPACE).block_attn_res_read_backward(
        grad_hidden_states.contiguous(), sources, query, inv_norm, probs, inv_rms, key, gain, **attrs)
    grads = (grad_sources, grad_query.to(query.dtype),
             None if key is None else grad_key.to(key.dtype), None if gain is None else grad_gain.to(gain.dtype))
    return grads[:passed]


def define_read_ops() -> None:
    for op, eager, fake in ((READ_OP, read_eager, read_fake), (READ_GRAD_OP, read_backward_eager, read_backward_fake)):
        LIBRARY.define(op.name + op.schema())
        LIBRARY.impl(op.name, eager, "CPU")
        torch.library.register_fake(f"{NAMESPACE}::{op.name}", fake, lib=LIBRARY)
    torch.library.register_autograd(f"{NAMESPACE}::{READ_OP.name}", _backward, setup_context=_setup_context,
                                    lib=LIBRARY)
