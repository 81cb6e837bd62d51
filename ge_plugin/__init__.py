"""PyTorch side of the Block AttnRes ops: torch ops, autograd, the public entry points and graph mode."""

from attnres_ge.ge_plugin.api import BlockAttnRes, block_attention_residuals
from attnres_ge.ge_plugin.backend import ge_backend, register_dynamo_backend
from attnres_ge.ge_plugin.converters import register_torchair_converters
from attnres_ge.ge_plugin.npu import register_npu_kernels

register_npu_kernels()
register_torchair_converters()
register_dynamo_backend()

__all__ = ["BlockAttnRes", "block_attention_residuals", "ge_backend"]
