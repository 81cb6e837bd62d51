"""What the torch ops share: their library, their registration, eager and fake implementations.

Every op of the registry is defined on one torch.library.Library (namespace `attnres`) by
`define_op`, which derives its schema from the prototype (ops.TorchOp.schema) and registers its fake
implementation (register_fake) and its CPU kernel, both taking the schema's arguments generically.
The CPU kernel is the C++ one of ge_plugin/csrc when that extension is built (`CPP_ENTRY`): it runs a
repeated input signature without entering Python. Its first call of each signature, and every call
when it is not built, runs `run_eager` here; the local GE's compiled nodes use the same extension.

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
from attnres_ge.ge_plugin.references import check_references_not_aliased, publish_reference_update
from attnres_ge.op_kernel import KERNELS, OpKernel
from attnres_ge.op_kernel.host_memory import huge_page_min_bytes
from attnres_ge.op_kernel.launcher import PLAN_CACHE_SIZE, default_runtime
from attnres_ge.op_proto import WHERE_EAGER, WHERE_FAKE, OpPrototype
from attnres_ge.op_proto.op_def import Checker

LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")


_eager_ops: dict[str, OpKernel] = {}  # torch op name -> its kernels, for the C++ entry's first calls


def _launch(op: OpKernel, tensors: Sequence[torch.Tensor], attrs: Mapping):
    runtime = default_runtime()
    plan = runtime.plan(op, tensors, attrs, WHERE_EAGER)
    tensors = [tensor.contiguous() for tensor in tensors]
    outputs = tuple(cpp_entry.empty_output(meta.shape, meta.dtype) for meta in plan.outputs)
    runtime.run_kernel(plan, tensors, outputs)
    return outputs, plan


def run_eager(op: OpKernel, tensors: Sequence[torch.Tensor], attrs: Mapping) -> tuple[torch.Tensor, ...]:
    """Validate and tile (once per signature), allocate contiguous outputs, run the kernel."""
    return _launch(op, tensors, attrs)[0]


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
               cpp_entry.empty_output(meta.shape, meta.dtype)
               for arg, meta in zip(proto.outputs, plan.outputs, strict=True)]
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


def define_op(op: TorchOp) -> None:
    """Define torch.ops.attnres.<op.name> from its entry: the schema its prototype gives, the fake
    implementation (the prototype's validation, empty outputs) and the CPU kernel: the C++ entry's where
    it is built, else the Python one (run_eager, or run_eager_in_place for an op with reference outputs)."""
    LIBRARY.define(op.name + op.schema())
    eager, fake = _implementations(op)
    torch.library.register_fake(f"{NAMESPACE}::{op.name}", fake, lib=LIBRARY)
    _eager_ops[op.name] = op.kernel
    if CPP_ENTRY:
        cpp_entry.MODULE.register_eager(op.name)
    else:
        LIBRARY.impl(op.name, eager, "CPU")


def _implementations(op: TorchOp) -> tuple[Callable, Callable]:
    """(eager, fake) implementations of the torch op, taking its arguments as the schema orders them.

    The dispatcher may leave out arguments at their defaults; binding the attributes fills them in from
    the prototype, whose defaults the schema was written from."""
    proto = op.prototype
    tensor_count = len(proto.inputs)
    attr_names = [attr.name for attr in proto.attrs]
    run = run_eager_in_place if proto.reference_outputs() else run_eager
    single = len(op.returned_outputs()) == 1

    def split(arguments: tuple, keywords: dict) -> tuple[tuple, dict]:
        attrs = dict(zip(attr_names, arguments[tensor_count:], strict=False))
        attrs.update(keywords)
        return arguments[:tensor_count], attrs

    def returned(outputs: tuple) -> torch.Tensor | tuple[torch.Tensor, ...]:
        return outputs[0] if single else outputs

    def eager(*arguments, **keywords):
        tensors, attrs = split(arguments, keywords)
        return returned(run(op.kernel, tensors, attrs))

    def fake(*arguments, **keywords):
        tensors, attrs = split(arguments, keywords)
        return returned(fake_outputs(proto, tensors, attrs))

    return eager, fake


def register_inference_only(op_name: str, proto: OpPrototype) -> None:
    """The Autograd kernel of attnres::<op_name>, an op with no derivative (CANN's update has none either): a call
    that would need one fails, naming the inputs that require a gradient, instead of silently returning none."""

    def refuse_gradients(*arguments) -> None:
        needing = [name for name, value in zip(proto.input_names(), arguments, strict=False)
                   if isinstance(value, torch.Tensor) and value.requires_grad]
        Checker(proto.op_type, WHERE_EAGER).fail(
            f"the op is inference-only (no gradient), but {', '.join(needing)} "
            f"{'requires' if len(needing) == 1 else 'require'} grad; call it under "
            "torch.no_grad() or on detached tensors")

    register_gradient_in_python(op_name, refuse_gradients)


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
    "define_op",
    "fake_outputs",
    "forget_cached_launches",
    "register_gradient_in_python",
    "run_eager",
    "run_eager_in_place",
]
