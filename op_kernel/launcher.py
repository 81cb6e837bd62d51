"""The launcher: the two-phase launch an aclnn call makes, shared by eager ops and the local GE.

    TilingParse once per op type (cached)
    -> plan per input signature (cached): InferDataType/InferShape, then Tiling
    -> outputs and workspace -> the kernel

Everything per op comes from the OpKernel the caller passes (its prototype, its tiling,
its kernels); nothing here knows an op by name. The process platform starts empty, as an
Ascend runtime's does before its first launch; Tiling's re-query is what fills it (see
tiling_base.resolve_platform).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from attnres_ge.op_host.platform import PlatformInfo, host_profile
from attnres_ge.op_host.tiling_base import CompileInfo, TilingResult
from attnres_ge.op_kernel import KERNELS, OpKernel
from attnres_ge.op_proto import OpPrototype, TensorMeta
from attnres_ge.op_proto.op_def import Checker

NO_WORKSPACE = torch.empty(0, dtype=torch.uint8)  # what a launch gets when its plan needs none
PLAN_CACHE_SIZE = 1024  # signatures remembered; a serving loop with ever new T must not grow without bound


@dataclass(frozen=True)
class ShapePlan:
    """Everything a launch needs for one input signature but the tensors."""

    op: OpKernel
    dtype: torch.dtype  # what the kernel is compiled for: the dtype of the op's `dtype_input`
    outputs: tuple[TensorMeta, ...]  # shapes and dtypes, in prototype order
    attrs: Mapping  # bound attributes (defaults filled in)
    tiling: TilingResult
    # The kernel launch for this plan, made once per kernel implementation (KERNELS.launch).
    launches: dict = field(default_factory=dict, compare=False, repr=False)

    def launch(self) -> Callable:
        """`launch(inputs, outputs, workspace)` of this plan with the active kernel implementation."""
        launch = self.launches.get(KERNELS.implementation)
        if launch is None:
            implementation, launch = KERNELS.launch(self.op, self.tiling.data, self.dtype)
            self.launches[implementation] = launch
        return launch

    def repeatable_launch(self) -> tuple | None:
        """What the ops' C++ entry needs to repeat this plan without Python: (launch record, workspace
        bytes, [(output shape, dtype), ...], [for each output the index of the input it updates in place
        (a reference output), else -1]); None unless the native kernels run it."""
        record = getattr(self.launch(), "record", None)  # native launches carry one
        if record is None:
            return None
        proto = self.op.prototype
        names = proto.input_names()
        updated = [names.index(arg.name) if proto.is_reference_output(arg.name) else -1 for arg in proto.outputs]
        return record, self.tiling.workspace_size, [(meta.shape, meta.dtype) for meta in self.outputs], updated


def input_signature(proto: OpPrototype, tensors: Sequence, attrs: Mapping) -> tuple:
    """What a validation or a plan depends on: each input's shape, dtype and device (a list's, element by
    element; None for an absent optional input) and the attributes. AttributeError for a non-tensor."""
    # The attribute's type is part of the key: True == 1 must not reuse a plan validated for a bool.
    return (
        proto.op_type,
        *[_tensor_key(value) for value in tensors],
        *[(name, type(value), value) for name, value in attrs.items()],
    )


def _tensor_key(value) -> tuple | None:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return tuple(_tensor_key(item) for item in value) if value else ("empty list",)
    return value.shape, value.dtype, value.device


class HostRuntime:
    """Owns a platform handle, the TilingParse results and a per-signature plan cache."""

    def __init__(self, platform: PlatformInfo):
        self.platform = platform
        self._compile_infos: dict[str, CompileInfo] = {}
        self._plans: OrderedDict[tuple, ShapePlan] = OrderedDict()
        self._lock = threading.Lock()

    def compile_info(self, op: OpKernel) -> CompileInfo:
        """TilingParse, once per op type."""
        with self._lock:
            if op.op_type not in self._compile_infos:
                self._compile_infos[op.op_type] = op.tiling.parse(self.platform)
            return self._compile_infos[op.op_type]

    def tiling(self, op: OpKernel, inputs: Mapping[str, TensorMeta], attrs: Mapping) -> TilingResult:
        """Tiling for these input metas and bound attributes."""
        return op.tiling.tiling(self.compile_info(op), inputs, attrs, self.platform)

    def plan(self, op: OpKernel, tensors: Sequence[torch.Tensor], attrs: Mapping, where: str) -> ShapePlan:
        """Validate (InferDataType/InferShape, errors say `where`) and tile, once per input signature."""
        proto = op.prototype
        try:
            key = input_signature(proto, tensors, attrs)
        except AttributeError:  # not a tensor where one belongs: say which
            proto.check_tensors(tensors, where)
            raise
        with self._lock:
            cached = self._plans.get(key)
            if cached is not None:
                self._plans.move_to_end(key)
                return cached
        metas = proto.input_metas(tensors, where)
        bound, outputs = proto.check(metas, attrs, where)
        first = metas[proto.inputs[0].name]
        if first.device is not None and first.device.type != "cpu":  # the host kernels read the data where it lies
            Checker(proto.op_type, where).fail(f"the host runtime runs CPU tensors only, got tensors on {first.device}")
        dtype = metas[proto.inputs[op.dtype_index].name].dtype
        plan = ShapePlan(op, dtype, tuple(outputs), bound, self.tiling(op, metas, bound))
        with self._lock:
            self._plans[key] = plan
            if len(self._plans) > PLAN_CACHE_SIZE:
                self._plans.popitem(last=False)
        return plan

    def run_kernel(
        self,
        plan: ShapePlan,
        inputs: Sequence[torch.Tensor],
        outputs: Sequence[torch.Tensor],
        workspace: torch.Tensor | None = None,
    ) -> None:
        """Launch the kernel of `plan`. The caller guarantees what the plan was made for: the inputs are
        contiguous with the planned signature, the outputs contiguous of `plan.outputs`' shapes and dtypes,
        the workspace (if given) at least `workspace_size` bytes; the launch checks no tensor again."""
        if workspace is None:
            size = plan.tiling.workspace_size
            workspace = torch.empty(size, dtype=torch.uint8, device=inputs[0].device) if size else NO_WORKSPACE
        plan.launch()(inputs, outputs, workspace)


_default: HostRuntime | None = None
_default_lock = threading.Lock()


def default_runtime() -> HostRuntime:
    """The process runtime on the host CPU. Its platform handle starts empty, as on
    Ascend before the first launch; the first Tiling's re-query measures the host."""
    global _default
    with _default_lock:
        if _default is None:
            _default = HostRuntime(PlatformInfo(host_profile(), filled=False, runtime=host_profile))
        return _default
