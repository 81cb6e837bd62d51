"""On an Ascend NPU, route the torch ops to CANN's own fused kernels, first call of a process included.

Active only when the user has already imported torch_npu and the package
cann_ops_transformer (which carries CANN's eager-only torch ops) imports. The kernels forward
arguments unchanged (CANN's forward names its attributes validBlockNum, normEps, needBackward;
the positional order is the same).

The first call on each device runs one small op there before CANN's: on CANN releases whose
backward TilingParse reads the vector-core count before the runtime has filled the platform in,
the first backward of a fresh process fails with "coreNum is 0"; any op that has run on the
device first fills it (6 of 6 fresh processes in the measurement that found the bug). The
warm-up costs one tiny op per device and process, and is harmless where the bug is fixed or
where the attnres OPP package (docs/ascend.md) overrides the tiling.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Callable

import torch

_warmed_devices: set[torch.device] = set()
_warm_lock = threading.Lock()


def _run_small_op(device: torch.device) -> None:
    # Copied back to the host so the op has finished before CANN's Tiling runs.
    torch.ones(1, device=device).add_(1).cpu()


def warm_up_device(device: torch.device) -> None:
    """Run one small op on `device`, once per process and device, before the first CANN op there."""
    if device in _warmed_devices:
        return
    with _warm_lock:
        if device in _warmed_devices:
            return
        _run_small_op(device)
        _warmed_devices.add(device)


def make_npu_kernels(cann_forward: Callable, cann_backward: Callable) -> tuple[Callable, Callable]:
    """The NPU kernels of both torch ops: warm the device up once, then call CANN's op."""

    def forward(partial_block, block_res, proj_weight, norm_weight, valid_block_num=-1, norm_eps=1e-6,
                need_backward=False):
        warm_up_device(partial_block.device)
        return cann_forward(partial_block, block_res, proj_weight, norm_weight, valid_block_num, norm_eps,
                            need_backward)

    def backward(partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm, probs, *,
                 valid_block_num=0):
        warm_up_device(partial_block.device)
        return cann_backward(partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm,
                             probs, valid_block_num=valid_block_num)

    return forward, backward


def register_npu_kernels() -> bool:
    """Register NPU kernels for both torch ops; False (and nothing done) off Ascend."""
    if "torch_npu" not in sys.modules:
        return False
    try:
        importlib.import_module("cann_ops_transformer")
        cann = torch.ops.cann_ops_transformer
        cann_forward, cann_backward = cann.block_attention_residuals, cann.block_attention_residuals_backward
    except (ImportError, AttributeError, RuntimeError):
        return False
    forward, backward = make_npu_kernels(cann_forward, cann_backward)
    torch.library.register_kernel("attnres::block_attention_residuals", "npu", forward)
    torch.library.register_kernel("attnres::block_attention_residuals_backward", "npu", backward)
    return True
