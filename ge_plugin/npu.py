"""On an Ascend NPU, route the torch ops to CANN's own fused kernels, first call of a process included.

Active only when the user has already imported torch_npu and the package
cann_ops_transformer (which carries CANN's eager-only torch ops, of the same names as ours) imports.
The kernels forward arguments unchanged (CANN's forward names its attributes validBlockNum,
normEps, needBackward; the positional order is the same).

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

from attnres_ge.ge_plugin.ops import BLOCK_ATTN_RES_UPDATE, CANN_NAMESPACE, NAMESPACE, OPS, UPDATE_NORM_OP

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


def make_npu_kernel(cann_op: Callable) -> Callable:
    """An NPU kernel of a torch op: warm the device up once, then call CANN's op with the same arguments."""

    def kernel(*args, **kwargs):
        warm_up_device(args[0].device)
        return cann_op(*args, **kwargs)

    return kernel


def update_then_norm(cann_update: Callable) -> Callable:
    """BlockAttnResUpdateNorm on an NPU, where CANN has no fused kernel: CANN's update, then the RMSNorm in float32
    of its h (rounded once more than on the CPU, as torchair's graph of the op is)."""

    def update_norm(partial_block, delta, pseudo_query, numerator, logit_max, exp_sum, output_norm_weight, *,
                    eps=1e-6, output_eps=1e-6):
        h = cann_update(partial_block, delta, pseudo_query, numerator, logit_max, exp_sum, eps=eps)
        normed = torch.nn.functional.rms_norm(h.float(), (h.shape[-1],), output_norm_weight.float(), output_eps)
        return normed.to(h.dtype)

    return update_norm


def register_npu_kernels() -> bool:
    """Register an NPU kernel for every op of the registry that CANN ships (and for the update with a fused norm, on
    CANN's update); False when none was (off Ascend)."""
    if "torch_npu" not in sys.modules:
        return False
    try:
        importlib.import_module(CANN_NAMESPACE)
        cann = getattr(torch.ops, CANN_NAMESPACE)
        cann_ops = {op.name: getattr(cann, op.name) for op in OPS if hasattr(cann, op.name)}
    except (ImportError, AttributeError, RuntimeError):
        return False
    if BLOCK_ATTN_RES_UPDATE.name in cann_ops:
        cann_ops[UPDATE_NORM_OP.name] = update_then_norm(cann_ops[BLOCK_ATTN_RES_UPDATE.name])
    for name, cann_op in cann_ops.items():
        torch.library.register_kernel(f"{NAMESPACE}::{name}", "npu", make_npu_kernel(cann_op))
    return bool(cann_ops)
