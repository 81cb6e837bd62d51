"""What the launcher needs of one op's kernels (each op's kernel module defines its `KERNEL`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from attnres_ge.op_host.tiling_base import OpTiling
from attnres_ge.op_proto import OpPrototype


@dataclass(frozen=True)
class OpKernel:
    """One op's kernels: its host side (prototype, tiling) and its Python kernel, the oracle, called as
    `python(*inputs, *outputs, workspace, tiling_record)`. Its native kernel is the one the native
    module registers under the same op type (op_kernel/csrc/native_op_list.h); an op without one
    (`has_native` false) runs its Python kernel whichever implementation is in use. The native kernel
    is compiled per dtype of one input, `dtype_input` (None: the first)."""

    tiling: OpTiling
    python: Callable[..., None]
    has_native: bool = True
    dtype_input: str | None = None

    @property
    def op_type(self) -> str:
        return self.tiling.op_type

    @property
    def prototype(self) -> OpPrototype:
        return self.tiling.prototype

    @property
    def dtype_index(self) -> int:
        """The position of `dtype_input` among the inputs."""
        return 0 if self.dtype_input is None else self.prototype.input_names().index(self.dtype_input)


@dataclass(frozen=True)
class TensorKernel:
    """An op whose kernels take its tensors where they lie rather than a tiling record (the general read, whose
    list input has one row stride per tensor), so the launcher plans nothing for it. Eager and the local GE
    both call `run(inputs, attrs, outputs, allocate)`: the inputs in prototype order (a list for a dynamic
    input, None for an absent optional one), the attributes bound by the prototype, the output metas its
    InferShape gave, and `allocate(shape, dtype)` for fresh outputs (the caller's allocator: the C++ entry's
    huge-page pool); it returns the outputs in prototype order (a list for a dynamic output)."""

    prototype: OpPrototype
    run: Callable[..., list]

    @property
    def op_type(self) -> str:
        return self.prototype.op_type
