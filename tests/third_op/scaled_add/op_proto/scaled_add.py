"""Prototype of the toy GE op ScaledAdd: z = x + alpha * y on [T, H] float32 tensors (tests/test_third_op.py
copies it into op_proto/ of a copy of the repository)."""

from __future__ import annotations

import torch

from attnres_ge.op_proto.op_def import AttrArg, Checker, OpPrototype, TensorArg

OP_TYPE = "ScaledAdd"
FLOAT32 = (torch.float32,)


def infer_data_type(inputs, attrs, where):
    check = Checker(OP_TYPE, where)
    check.dtype_in("x", inputs["x"], FLOAT32)
    check.same_dtype("y", inputs["y"], "x", inputs["x"])
    return {"z": torch.float32}


def infer_shape(inputs, attrs, where):
    check = Checker(OP_TYPE, where)
    tokens, hidden = check.shape("x", inputs["x"], ("T", "H"), (None, None))
    check.shape("y", inputs["y"], ("T", "H"), (tokens, hidden))
    return {"z": (tokens, hidden)}


PROTOTYPE = OpPrototype(
    op_type=OP_TYPE,
    summary="z = x + alpha * y",
    inputs=(TensorArg("x", FLOAT32, "[T, H]"), TensorArg("y", FLOAT32, "[T, H]")),
    outputs=(TensorArg("z", FLOAT32, "[T, H]"),),
    attrs=(AttrArg("alpha", "Float", 1.0),),
    infer_data_type=infer_data_type,
    infer_shape=infer_shape,
)
