"""What the eager and fake implementations of both torch ops share.

Both ops are defined on one torch.library.Library (namespace `attnres`), their eager
implementation registered for the CPU dispatch key, the fake one with register_fake and
the forward's autograd with register_autograd: the public API without custom_op's extra
per-call Python layers (about 20 us a call, which a decode step would notice).

Eager (the two-phase flow of an aclnn call): the runtime's plan for these inputs
(validation by the prototype's InferDataType/InferShape, then Tiling; cached per
input signature), fresh contiguous outputs (huge-page backed when large: see
op_host/host_memory), the kernel. Fake: the same validation,
then empty outputs of the inferred shapes, so torch.compile sees exactly what the
graph's InferShape will.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..op_host.host_memory import empty_output
from ..op_host.runtime import default_runtime
from ..op_proto import WHERE_EAGER, WHERE_FAKE, OpPrototype

LIBRARY = torch.library.Library("attnres", "FRAGMENT")


def run_eager(proto: OpPrototype, tensors: Sequence[torch.Tensor], attrs: Mapping) -> tuple[torch.Tensor, ...]:
    """Validate and tile (once per signature), allocate contiguous outputs, run the kernel."""
    runtime = default_runtime()
    plan = runtime.plan(proto, tensors, attrs, WHERE_EAGER)
    tensors = [tensor.contiguous() for tensor in tensors]
    outputs = [empty_output(meta.shape, meta.dtype) for meta in plan.outputs]
    runtime.run_kernel(plan, tensors, outputs)
    return tuple(outputs)


def fake_outputs(proto: OpPrototype, tensors: Sequence[torch.Tensor], attrs: Mapping) -> tuple[torch.Tensor, ...]:
    """The same validation as eager; empty outputs of the inferred shapes and dtypes."""
    _, out_metas = proto.check(proto.input_metas(tensors), attrs, WHERE_FAKE)
    return tuple(tensors[0].new_empty(meta.shape, dtype=meta.dtype) for meta in out_metas)
