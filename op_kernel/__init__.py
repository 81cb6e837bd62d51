"""Kernels of the Block AttnRes ops, by GE op type, and the float64 reference."""

from .block_attention_residuals import block_attention_residuals_kernel
from .block_attention_residuals_grad import block_attention_residuals_grad_kernel

KERNELS = {
    "BlockAttentionResiduals": block_attention_residuals_kernel,
    "BlockAttentionResidualsGrad": block_attention_residuals_grad_kernel,
}

__all__ = ["KERNELS", "block_attention_residuals_grad_kernel", "block_attention_residuals_kernel"]
