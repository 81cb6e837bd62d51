"""PyTorch side of the Block AttnRes ops: torch ops, autograd and the public entry points."""

from .api import BlockAttnRes, block_attention_residuals
from .npu import register_npu_kernels

register_npu_kernels()

__all__ = ["BlockAttnRes", "block_attention_residuals"]
