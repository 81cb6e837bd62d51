"""The generic "op" family: any registry op (ge_plugin/ops.py OPS) that sets `bench_inputs` and has no family of
its own, timed at its named shapes (cases.registry: op_shapes) and each --dtypes its kernel's dtype input takes:
  op-eager   torch.ops.attnres.<op>(*inputs, **attributes), fresh outputs each call
  op-graph   the same through torch.compile(backend="attnres_ge")
against a copy of as many bytes as its inputs, over its minimum traffic: every input read and every output
written once. `bench_inputs(dims, dtype) -> (input tensors, attributes)` makes the inputs of a shape given by
its letters, e.g. {"T": 4096, "H": 2048}. --ops picks among these ops.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from attnres_ge.bench.cases.common import compiled_op
from attnres_ge.bench.cases.registry import op_letters
from attnres_ge.bench.paths import op_path
from attnres_ge.shapes import DTYPES

OP_PROVIDERS = ("op-eager", "op-graph")


def _tensors(outputs) -> list[torch.Tensor]:
    """An op's outputs as a list of tensors (one tensor, or a tuple or list of them)."""
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    return [output for output in outputs if isinstance(output, torch.Tensor)]


def timed_dtypes(op, dtype_names: list[str]) -> list[str]:
    """The --dtypes an op's kernel is compiled for: those its dtype input (OpKernel.dtype_index) accepts."""
    accepted = op.prototype.inputs[op.kernel.dtype_index].accepted_dtypes
    return [name for name in dtype_names if DTYPES[name] in accepted]


class OpCase:
    """One registry op's inputs at one shape and dtype (from its bench_inputs) and its two providers' calls."""

    directions = ("forward",)

    def __init__(self, op, shape: tuple[int, ...], dtype: torch.dtype):
        self.op, self.dtype = op, dtype
        self.dims = dict(zip(op_letters(op), shape, strict=True))
        self.tensors, self.attributes = op.bench_inputs(self.dims, dtype)
        self.torch_op = getattr(torch.ops.attnres, op.name)
        outputs = _tensors(self.torch_op(*self.tensors, **self.attributes))
        self.traffic = sum(t.nbytes for t in self.tensors) + sum(t.nbytes for t in outputs)

    def copy_elements(self) -> int:
        return max(1, sum(t.nbytes for t in self.tensors) // self.dtype.itemsize)  # the inputs' bytes

    def provider_traffic(self, direction: str, provider: str) -> int:
        return self.traffic

    def path(self, provider: str) -> str:
        return op_path(self.op.kernel)

    def provider(self, name: str) -> dict[str, Callable[[], object]]:
        if name == "op-eager":
            call = functools.partial(self.torch_op, **self.attributes)
        else:
            call = compiled_op(self.torch_op, **self.attributes)
        return {"forward": functools.partial(call, *self.tensors)}
