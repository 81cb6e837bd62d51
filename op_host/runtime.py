"""The host runtime: the two-phase launch an aclnn call makes, shared by eager ops and the local GE.

    TilingParse once per op type and platform (cached) -> Tiling per shape (cached)
    -> outputs and workspace -> the kernel

The process platform starts empty, as an Ascend runtime's does before its first
launch; Tiling's re-query is what fills it (see tiling_base.resolve_platform).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import torch

from ..op_kernel import KERNELS
from ..op_proto import BACKWARD, FORWARD, TensorMeta
from . import block_attention_residuals_grad_tiling as grad_tiling
from . import block_attention_residuals_tiling as forward_tiling
from .platform import PlatformInfo, host_profile
from .tiling_base import CompileInfo, TilingResult


def _tiling_for(op_type: str, compile_info: CompileInfo, inputs: Mapping[str, TensorMeta], attrs, platform):
    tokens, blocks, hidden = inputs["block_res"].shape
    dtype = inputs["partial_block"].dtype
    if op_type == FORWARD.op_type:
        return forward_tiling.tiling(
            compile_info, tokens, blocks, hidden, dtype, attrs["norm_eps"], attrs["need_backward"], platform
        )
    return grad_tiling.tiling(compile_info, tokens, blocks, hidden, dtype, platform)


PARSERS = {FORWARD.op_type: forward_tiling.parse, BACKWARD.op_type: grad_tiling.parse}
TILING_CACHE_SIZE = 1024  # shapes remembered; a serving loop with ever new T must not grow without bound


class HostRuntime:
    """Owns a platform handle, the TilingParse results and a per-shape Tiling cache."""

    def __init__(self, platform: PlatformInfo):
        self.platform = platform
        self._compile_infos: dict[str, CompileInfo] = {}
        self._tilings: OrderedDict[tuple, TilingResult] = OrderedDict()
        self._lock = threading.Lock()

    def compile_info(self, op_type: str) -> CompileInfo:
        """TilingParse, once per op type."""
        with self._lock:
            if op_type not in self._compile_infos:
                self._compile_infos[op_type] = PARSERS[op_type](self.platform)
            return self._compile_infos[op_type]

    def tiling(self, op_type: str, inputs: Mapping[str, TensorMeta], attrs: Mapping) -> TilingResult:
        """Tiling for these shapes, computed once per (shape, dtype, attrs)."""
        key = (op_type, inputs["block_res"].shape, inputs["partial_block"].dtype, tuple(sorted(attrs.items())))
        with self._lock:
            cached = self._tilings.get(key)
            if cached is not None:
                self._tilings.move_to_end(key)
                return cached
        result = _tiling_for(op_type, self.compile_info(op_type), inputs, attrs, self.platform)
        with self._lock:
            self._tilings[key] = result
            if len(self._tilings) > TILING_CACHE_SIZE:
                self._tilings.popitem(last=False)
        return result

    def launch(
        self,
        op_type: str,
        inputs: Sequence[torch.Tensor],
        attrs: Mapping,
        outputs: Sequence[torch.Tensor],
        workspace: torch.Tensor | None = None,
    ) -> TilingResult:
        """Tile and run the kernel into `outputs` (contiguous, of the inferred shapes)."""
        names = FORWARD.input_names() if op_type == FORWARD.op_type else BACKWARD.input_names()
        metas = {name: TensorMeta.of(tensor) for name, tensor in zip(names, inputs, strict=True)}
        result = self.tiling(op_type, metas, attrs)
        if workspace is None or workspace.numel() < result.workspace_size:
            workspace = torch.empty(result.workspace_size, dtype=torch.uint8, device=inputs[0].device)
        KERNELS[op_type](*inputs, *outputs, workspace, result.data)
        return result


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
