"""PyTorch side of the Block AttnRes ops: torch ops, autograd, the public entry points and graph mode."""

from .api import BlockAttnRes, block_attention_residuals
from .backend import ge_backend, register_dynamo_backend
from .converters import register_torchair_converters
from .npu import register_npu_kernels

register_npu_kernels()
register_torchair_converters()
register_dynamo_backend()

__all__ = ["BlockAttnRes", "block_attention_residuals", "ge_backend"]
