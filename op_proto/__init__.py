"""GE op prototypes for Block AttnRes (the op registry, ge_plugin/ops.py, lists them with the rest of each op)."""

from attnres_ge.op_proto.block_attention_residuals import PROTOTYPE as FORWARD
from attnres_ge.op_proto.block_attention_residuals_grad import PROTOTYPE as BACKWARD
from attnres_ge.op_proto.block_attn_res_prepare import PROTOTYPE as PREPARE
from attnres_ge.op_proto.block_attn_res_update import PROTOTYPE as UPDATE
from attnres_ge.op_proto.op_def import (
    FLOAT_DTYPES,
    UNKNOWN_DIM,
    WHERE_EAGER,
    WHERE_FAKE,
    WHERE_GRAPH,
    WHERE_PROTOTYPE,
    AttnResInputError,
    OpPrototype,
    TensorMeta,
)

__all__ = [
    "BACKWARD",
    "FLOAT_DTYPES",
    "FORWARD",
    "PREPARE",
    "UNKNOWN_DIM",
    "UPDATE",
    "WHERE_EAGER",
    "WHERE_FAKE",
    "WHERE_GRAPH",
    "WHERE_PROTOTYPE",
    "AttnResInputError",
    "OpPrototype",
    "TensorMeta",
]
