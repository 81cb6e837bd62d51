"""Reference outputs (GE's name for an input the op updates in place): the rules that the eager op and
the local GE's node share. An updated input must share no memory with another input, and after the
kernel wrote it autograd must see the change."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attnres_ge.op_proto import OpPrototype
from attnres_ge.op_proto.op_def import Checker


def _byte_span(tensor: torch.Tensor) -> tuple[int, int]:
    """[first, last) bytes of its storage that `tensor` may touch; (0, 0) for an empty tensor."""
    if tensor.numel() == 0:
        return 0, 0
    extent = 1 + sum((size - 1) * abs(stride) for size, stride in zip(tensor.shape, tensor.stride(), strict=True))
    first = tensor.storage_offset() * tensor.element_size()
    return first, first + extent * tensor.element_size()


def _overlap(first: torch.Tensor, second: torch.Tensor) -> bool:
    """Whether two tensors may share memory (the same storage, intersecting byte ranges)."""
    if first.untyped_storage()._cdata != second.untyped_storage()._cdata:
        return False
    (a0, a1), (b0, b1) = _byte_span(first), _byte_span(second)
    return a0 < b1 and b0 < a1


def check_references_not_aliased(proto: OpPrototype, tensors: Sequence[torch.Tensor], where: str) -> None:
    """An input the op updates in place (a reference output) must share no memory with another input:
    the kernel would read values it has already overwritten."""
    names = proto.input_names()
    checker = Checker(proto.op_type, where)
    for reference in proto.reference_outputs():
        updated = tensors[names.index(reference)]
        for name, other in zip(names, tensors, strict=True):
            if name != reference and isinstance(other, torch.Tensor) and _overlap(updated, other):
                checker.fail(f"{reference} is updated in place and must not share memory with {name}, but both "
                             f"view one storage ({reference} {list(updated.shape)}, {name} {list(other.shape)})")


def publish_reference_update(fed: torch.Tensor, written: torch.Tensor) -> None:
    """After a kernel wrote a reference output into `written` (the tensor fed as its input, or that tensor's
    contiguous copy): copy it into the fed tensor, or, written in place through its data pointer, bump the
    fed tensor's version, so that autograd sees the change either way."""
    if written is not fed:
        fed.copy_(written)
    else:
        torch.autograd.graph.increment_version(fed)
