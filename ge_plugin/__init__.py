"""PyTorch and GE side of the Block AttnRes ops: the torch ops and their autograd, the op registry
(ops.py), graph mode (converters, the local GE, the torch.compile backend) and the NPU dispatch.

Importing it defines torch.ops.attnres.<op> for every op of the registry.
"""

from attnres_ge.ge_plugin import (  # noqa: F401  (define the torch ops)
    block_attention_residuals,
    block_attention_residuals_grad,
    block_attn_res_prepare,
    block_attn_res_update,
)
from attnres_ge.ge_plugin.backend import ge_backend, register_dynamo_backend
from attnres_ge.ge_plugin.converters import register_torchair_converters
from attnres_ge.ge_plugin.npu import register_npu_kernels

register_npu_kernels()
register_torchair_converters()
register_dynamo_backend()

__all__ = ["ge_backend"]
