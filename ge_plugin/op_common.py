"""What the torch ops share: their library, their registration, eager and fake implementations.

Every op is defined on one torch.library.Library (namespace `attnres`) by `define_op`, which
registers its fake implementation (register_fake) and its CPU kernel. The CPU kernel is the
C++ one of ge_plugin/csrc when that extension is built (`CPP_ENTRY`): it runs a repeated input
signature without entering Python. Its first call of each signature, and every call when it is
not built, runs `run_eager` here; the local GE's compiled nodes use the same extension.

Eager (the two-phase flow of an aclnn call): the launcher's plan for these inputs
(validation by the prototype's InferDataType/InferShape, then Tiling; cached per
input signature), fresh contiguous outputs (from the C++ entry's huge-page pool when
large: ge_plugin/csrc/huge_page_pool.h), the kernel. Fake: the same validation,
then empty outputs of the inferred shapes, so torch.compile sees exactly what the
graph's InferShape will.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from attnres_ge.ge_plugin import cpp_entry
from attnres_ge.ge_plugin.ops import NAMESPACE, TorchOp
from attnres_ge.op_kernel import KERNELS, OpKernel
from attnres_ge.op_kernel.host_memory import huge_page_min_bytes
from attnres_ge.op_kernel.launcher import PLAN_CACHE_SIZE, default_runtime
from attnres_ge.op_proto import WHERE_EAGER, WHERE_FAKE, OpPrototype
from attnres_ge.op_proto.op_def import Checker

LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")


_eager_ops: dict[str, OpKernel] = {}  # torch op name -> its kernels, for the C++ entry's first calls


def _empty_output(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A fresh output: the C++ entry's (from its huge-page pool when large), else torch's allocator."""
    if cpp_entry.MODULE is not None:
        return cpp_entry.MODULE.empty_output(shape, dtype)
    return torch.empty(shape, dtype=dtype)


def _launch(op: OpKernel, tensors: Sequence[torch.Tensor], attrs: Mapping):
    runtime = default_runtime()
    plan = runtime.plan(op, tensors, attrs, WHERE_EAGER)
    tensors = [tensor.contiguous() for tensor in tensors]
    outputs = tuple(_empty_output(meta.shape, meta.dtype) for meta in plan.outputs)
    runtime.run_kernel(plan, tensors, outputs)
    return outputs, plan


def run_eager(op: OpKernel, tensors: Sequence[torch.Tensor], attrs: Mapping) -> tuple[torch.Tensor, ...]:
    """Validate and tile (once per signature), allocate contiguous outputs, run the kernel."""
    return _launch(op, tensors, attrs)[0]


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


def run_eager_in_place(op: OpKernel, tensors: Sequence[torch.Tensor], attrs: Mapping) -> tuple[torch.Tensor, ...]:
    """run_eager for an op with reference outputs: each is written into its own input tensor (through a
    contiguous copy, then copied back, when that input is not contiguous); returns the other outputs."""
    return _launch_in_place(op, tensors, attrs)[0]


def _launch_in_place(op: OpKernel, tensors: Sequence[torch.Tensor], attrs: Mapping):
    proto = op.prototype
    runtime = default_runtime()
    plan = runtime.plan(op, tensors, attrs, WHERE_EAGER)  # first: it names what is not a tensor
    check_references_not_aliased(proto, tensors, WHERE_EAGER)
    inputs = [tensor.contiguous() for tensor in tensors]
    names = proto.input_names()
    outputs = [inputs[names.index(arg.name)] if proto.is_reference_output(arg.name) else
               _empty_output(meta.shape, meta.dtype) for arg, meta in zip(proto.outputs, plan.outputs, strict=True)]
    runtime.run_kernel(plan, inputs, outputs)
    for name in proto.reference_outputs():
        index = names.index(name)
        publish_reference_update(tensors[index], inputs[index])
    fresh = [out for arg, out in zip(proto.outputs, outputs, strict=True) if not proto.is_reference_output(arg.name)]
    return tuple(fresh), plan


def fake_outputs(proto: OpPrototype, tensors: Sequence[torch.Tensor], attrs: Mapping) -> tuple[torch.Tensor, ...]:
    """The same validation as eager; empty outputs of the inferred shapes and dtypes. A reference output
    (an input updated in place) is no new tensor: it is left out, as the torch op returns only the others."""
    metas = proto.input_metas(tensors, WHERE_FAKE)
    check_references_not_aliased(proto, tensors, WHERE_FAKE)
    _, out_metas = proto.check(metas, attrs, WHERE_FAKE)
    return tuple(tensors[0].new_empty(meta.shape, dtype=meta.dtype)
                 for arg, meta in zip(proto.outputs, out_metas, strict=True) if not proto.is_reference_output(arg.name))


def _first_call(op_name: str, tensors: Sequence[torch.Tensor], attrs: Mapping) -> tuple:
    """The C++ entry's call for an eager input signature it has not cached: the outputs the torch op returns
    (run_eager's, or run_eager_in_place's for an op with reference outputs), and the repeatable launch (None
    while the Python kernels run)."""
    op = _eager_ops[op_name]
    launch = _launch_in_place if op.prototype.reference_outputs() else _launch
    outputs, plan = launch(op, tensors, attrs)
    return outputs, plan.repeatable_launch()


def _install_cpp_entry() -> bool:
    if cpp_entry.MODULE is None:
        return False
    cpp_entry.MODULE.install(_first_call, PLAN_CACHE_SIZE, huge_page_min_bytes())
    KERNELS.switch_listeners.append(cpp_entry.MODULE.forget)
    return True


CPP_ENTRY = _install_cpp_entry()


def define_op(op: TorchOp, schema: str, fake: Callable, python_cpu: Callable) -> None:
    """Define torch.ops.attnres.<op.name> with `schema`, its fake implementation and its CPU kernel:
    the C++ entry's where it is built, else `python_cpu`, which calls run_eager (run_eager_in_place for an
    op with reference outputs)."""
    LIBRARY.define(op.name + schema)
    torch.library.register_fake(f"{NAMESPACE}::{op.name}", fake, lib=LIBRARY)
    _eager_ops[op.name] = op.kernel
    if CPP_ENTRY:
        cpp_entry.MODULE.register_eager(op.name)
    else:
        LIBRARY.impl(op.name, python_cpu, "CPU")


def register_gradient_in_python(op_name: str, on_gradient: Callable) -> None:
    """The Autograd kernel of attnres::<op_name>, whose derivative (or refusal to have one) is Python's: a
    call that needs a gradient (grad mode on, a tensor argument requiring grad) goes to
    on_gradient(*arguments in schema order), which returns the outputs with their autograd history or
    raises; any other call goes on below autograd. The C++ entry's kernel where it is built (no Python for
    a call that needs no gradient), else the same in Python."""
    if CPP_ENTRY:
        cpp_entry.MODULE.register_gradient_in_python(op_name, on_gradient)
        return
    overload = getattr(getattr(torch.ops, NAMESPACE), op_name).default
    keyword_only = [argument for argument in overload._schema.arguments if argument.kwarg_only]

    def autograd(*arguments, **keywords):
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in arguments):
            return on_gradient(*arguments, *(keywords.get(k.name, k.default_value) for k in keyword_only))
        with torch._C._AutoDispatchBelowAutograd():
            return overload(*arguments, **keywords)

    LIBRARY.impl(op_name, autograd, "Autograd")


def forget_cached_launches() -> None:
    """Make the C++ entry ask the Python one again for every signature (e.g. after replacing the process
    runtime); nothing to do without it."""
    if CPP_ENTRY:
        cpp_entry.MODULE.forget()


__all__ = [
    "CPP_ENTRY",
    "LIBRARY",
    "check_references_not_aliased",
    "define_op",
    "fake_outputs",
    "forget_cached_launches",
    "publish_reference_update",
    "register_gradient_in_python",
    "run_eager",
    "run_eager_in_place",
]
