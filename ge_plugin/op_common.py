"""What the eager and fake implementations of both torch ops share.

Eager (the two-phase flow of an aclnn call): validate with the prototype's
InferDataType/InferShape, allocate the outputs, tile and launch through the
host runtime. Fake: the same validation, then empty outputs of the inferred
shapes, so torch.compile sees exactly what the graph's InferShape will.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..op_host.runtime import default_runtime
from ..op_proto import WHERE_EAGER, WHERE_FAKE, OpPrototype, TensorMeta


def _metas(proto: OpPrototype, tensors: Sequence[torch.Tensor]) -> dict[str, TensorMeta]:
    return {name: TensorMeta.of(tensor) for name, tensor in zip(proto.input_names(), tensors, strict=True)}


def run_eager(proto: OpPrototype, tensors: Sequence[torch.Tensor], attrs: Mapping) -> tuple[torch.Tensor, ...]:
    """Validate, allocate contiguous outputs, tile and run the kernel."""
    bound = proto.bind_attrs(attrs, WHERE_EAGER)
    out_metas = proto.infer(_metas(proto, tensors), bound, WHERE_EAGER)
    tensors = [tensor.contiguous() for tensor in tensors]
    device = tensors[0].device
    outputs = [torch.empty(meta.shape, dtype=meta.dtype, device=device) for meta in out_metas]
    default_runtime().launch(proto.op_type, tensors, bound, outputs)
    return tuple(outputs)


def fake_outputs(proto: OpPrototype, tensors: Sequence[torch.Tensor], attrs: Mapping) -> tuple[torch.Tensor, ...]:
    """The same validation as eager; empty outputs of the inferred shapes and dtypes."""
    bound = proto.bind_attrs(attrs, WHERE_FAKE)
    out_metas = proto.infer(_metas(proto, tensors), bound, WHERE_FAKE)
    return tuple(tensors[0].new_empty(meta.shape, dtype=meta.dtype) for meta in out_metas)
