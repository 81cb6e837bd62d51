"""What the eager and fake implementations of both torch ops share.

Both ops are defined on one torch.library.Library (namespace `attnres`); the fake
implementation is registered with register_fake. The eager entry (the CPU kernels and
the forward's autograd) is the C++ one of ge_plugin/csrc when that extension is built
(`CPP_ENTRY`): it runs a repeated input signature without entering Python. Its first call
of each signature, and every call when it is not built, runs `run_eager` here; the local
GE's compiled nodes use the same extension (`repeatable_launch`).

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

from attnres_ge.op_host.host_memory import empty_output, from_huge_page_pool
from attnres_ge.op_host.runtime import ShapePlan, default_runtime
from attnres_ge.op_kernel import KERNELS
from attnres_ge.op_proto import BACKWARD, FORWARD, WHERE_EAGER, WHERE_FAKE, OpPrototype

LIBRARY = torch.library.Library("attnres", "FRAGMENT")
CPP_ENTRY_PROTOTYPES = (FORWARD, BACKWARD)  # by the op index the C++ entry passes


def _launch(proto: OpPrototype, tensors: Sequence[torch.Tensor], attrs: Mapping):
    runtime = default_runtime()
    plan = runtime.plan(proto, tensors, attrs, WHERE_EAGER)
    tensors = [tensor.contiguous() for tensor in tensors]
    outputs = tuple(empty_output(meta.shape, meta.dtype) for meta in plan.outputs)
    runtime.run_kernel(plan, tensors, outputs)
    return outputs, plan


def run_eager(proto: OpPrototype, tensors: Sequence[torch.Tensor], attrs: Mapping) -> tuple[torch.Tensor, ...]:
    """Validate and tile (once per signature), allocate contiguous outputs, run the kernel."""
    return _launch(proto, tensors, attrs)[0]


def fake_outputs(proto: OpPrototype, tensors: Sequence[torch.Tensor], attrs: Mapping) -> tuple[torch.Tensor, ...]:
    """The same validation as eager; empty outputs of the inferred shapes and dtypes."""
    _, out_metas = proto.check(proto.input_metas(tensors, WHERE_FAKE), attrs, WHERE_FAKE)
    return tuple(tensors[0].new_empty(meta.shape, dtype=meta.dtype) for meta in out_metas)


def repeatable_launch(plan: ShapePlan) -> tuple | None:
    """What the C++ entry needs to repeat `plan` without Python: (launch record, whether the forward keeps its
    statistics, workspace bytes, [(output shape, dtype), ...]); None unless the native kernels run it."""
    record = getattr(plan.launch(), "record", None)  # native launches carry one
    if record is None:
        return None
    keep_stats = plan.op_type == FORWARD.op_type and bool(plan.tiling.data.need_backward)
    return record, keep_stats, plan.tiling.workspace_size, [(meta.shape, meta.dtype) for meta in plan.outputs]


def _first_call(op_index: int, tensors: Sequence[torch.Tensor], attrs: Mapping) -> tuple:
    """The C++ entry's call for an eager input signature it has not cached: run_eager's outputs, and the
    repeatable launch (None when outputs come from the huge-page pool, whose mappings Python hands out)."""
    outputs, plan = _launch(CPP_ENTRY_PROTOTYPES[op_index], tensors, attrs)
    if any(from_huge_page_pool(meta.shape, meta.dtype) for meta in plan.outputs):
        return outputs, None
    return outputs, repeatable_launch(plan)


def _install_cpp_entry() -> bool:
    try:
        from attnres_ge.ge_plugin import _cpp_entry
        from attnres_ge.op_kernel.native import KERNEL_TABLE
    except ImportError:  # not built (or no native kernels to launch): the Python registrations stand in
        return False
    _cpp_entry.install(KERNEL_TABLE, _first_call)
    KERNELS.switch_listeners.append(_cpp_entry.forget)
    return True


CPP_ENTRY = _install_cpp_entry()


def forget_cached_launches() -> None:
    """Make the C++ entry ask the Python one again for every signature (e.g. after replacing the process
    runtime); nothing to do without it."""
    if CPP_ENTRY:
        from attnres_ge.ge_plugin import _cpp_entry

        _cpp_entry.forget()
