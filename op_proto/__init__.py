"""GE op prototypes for Block AttnRes, looked up by op type."""

from attnres_ge.op_proto.block_attention_residuals import PROTOTYPE as FORWARD
from attnres_ge.op_proto.block_attention_residuals_grad import PROTOTYPE as BACKWARD
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

PROTOTYPES: dict[str, OpPrototype] = {proto.op_type: proto for proto in (FORWARD, BACKWARD)}


def get_prototype(op_type: str) -> OpPrototype:
    """The prototype registered for `op_type`; KeyError names the known types."""
    try:
        return PROTOTYPES[op_type]
    except KeyError:
        raise KeyError(f"no prototype registered for op type {op_type!r}; known: {sorted(PROTOTYPES)}") from None


__all__ = [
    "BACKWARD",
    "FLOAT_DTYPES",
    "FORWARD",
    "PROTOTYPES",
    "UNKNOWN_DIM",
    "WHERE_EAGER",
    "WHERE_FAKE",
    "WHERE_GRAPH",
    "WHERE_PROTOTYPE",
    "AttnResInputError",
    "OpPrototype",
    "TensorMeta",
    "get_prototype",
]
