"""PyTorch and GE side of the Block AttnRes ops: the torch ops and their autograd, the op registry
(ops.py), graph mode (converters, the local GE, the torch.compile backend) and the NPU dispatch.

Importing it defines torch.ops.attnres.<op> for every op of the registry, then registers each op's
autograd (the module its entry names), its NPU kernel and its converters.
"""

import importlib

from attnres_ge.ge_plugin.backend import ge_backend, register_dynamo_backend
from attnres_ge.ge_plugin.block_attn_res_read import define_read_ops
from attnres_ge.ge_plugin.block_attn_res_update_norm import define_update_norm_op
from attnres_ge.ge_plugin.converters import register_torchair_converters
from attnres_ge.ge_plugin.npu import register_npu_kernels
from attnres_ge.ge_plugin.op_common import define_op
from attnres_ge.ge_plugin.ops import OPS

for _op in OPS:
    define_op(_op)
for _op in OPS:  # after every op is defined: an op's derivative may call another op
    if _op.autograd is not None:
        importlib.import_module(_op.autograd)
define_read_ops()
define_update_norm_op()

register_npu_kernels()
register_torchair_converters()
register_dynamo_backend()

__all__ = ["ge_backend"]
