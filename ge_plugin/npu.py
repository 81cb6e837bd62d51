"""On an Ascend NPU, route the torch ops to CANN's own fused kernels.

Active only when the user has already imported torch_npu and the package
cann_ops_transformer (which carries CANN's eager-only torch ops) imports. This
path cannot be exercised without Ascend hardware and is kept deliberately thin:
it forwards arguments unchanged (CANN's forward names its attributes
validBlockNum, normEps, needBackward; the positional order is the same).
"""

from __future__ import annotations

import importlib
import sys

import torch


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

    @torch.library.register_kernel("attnres::block_attention_residuals", "npu")
    def _forward(partial_block, block_res, proj_weight, norm_weight, valid_block_num=-1, norm_eps=1e-6,
                 need_backward=False):
        return cann_forward(partial_block, block_res, proj_weight, norm_weight, valid_block_num, norm_eps,
                            need_backward)

    @torch.library.register_kernel("attnres::block_attention_residuals_backward", "npu")
    def _backward(partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm, probs, *,
                  valid_block_num=0):
        return cann_backward(partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm,
                             probs, valid_block_num=valid_block_num)

    return True
