"""torch op `attnres::block_attn_res_update_norm` (GE type BlockAttnResUpdateNorm): the two-phase update with the
next sublayer's RMSNorm fused (op_proto/block_attn_res_update_norm.py).

    block_attn_res_update_norm(partial_block [T, D] float32 (updated in place), delta [T, D], pseudo_query [D],
                               numerator [T, D], logit_max [T], exp_sum [T], output_norm_weight [D], *,
                               eps, output_eps) -> h [T, D], normed

As block_attn_res_update: partial_block is `Tensor(a!)` and shares no memory with another argument, and the op
is inference-only (a call whose result would need a gradient raises). Its eager implementation validates by
the prototype (kept per input signature) and calls its TensorKernel, as the local GE does.
"""

from __future__ import annotations

import torch

from attnres_ge.ge_plugin import cpp_entry
from attnres_ge.ge_plugin.op_common import LIBRARY, register_inference_only
from attnres_ge.ge_plugin.ops import NAMESPACE, UPDATE_NORM_OP
from attnres_ge.ge_plugin.references import check_references_not_aliased, publish_reference_update
from attnres_ge.ge_plugin.tensor_op_common import checked_call, require_cpu
from attnres_ge.op_proto.op_def import WHERE_EAGER, WHERE_FAKE

PROTOTYPE = UPDATE_NORM_OP.prototype


def update_norm_eager(*tensors: torch.Tensor, **keywords) -> torch.Tensor:
    attrs, outputs = checked_call(PROTOTYPE, tensors, keywords, WHERE_EAGER)
    require_cpu(PROTOTYPE.op_type, tensors[0])
    check_references_not_aliased(PROTOTYPE, tensors, WHERE_EAGER)
    partial_block, h = UPDATE_NORM_OP.kernel.run(tensors, attrs, outputs, cpp_entry.empty_output)
    publish_reference_update(tensors[0], partial_block)  # written in place: autograd must see the new version
    return h


def update_norm_fake(*tensors: torch.Tensor, **keywords) -> torch.Tensor:
    _, (_, h) = checked_call(PROTOTYPE, tensors, keywords, WHERE_FAKE)
    check_references_not_aliased(PROTOTYPE, tensors, WHERE_FAKE)
    return tensors[0].new_empty(h.shape, dtype=h.dtype)


def define_update_norm_op() -> None:
    LIBRARY.define(UPDATE_NORM_OP.name + UPDATE_NORM_OP.schema())
    LIBRARY.impl(UPDATE_NORM_OP.name, update_norm_eager, "CPU")
    torch.library.register_fake(f"{NAMESPACE}::{UPDATE_NORM_OP.name}", update_norm_fake, lib=LIBRARY)
    register_inference_only(UPDATE_NORM_OP.name, PROTOTYPE)
