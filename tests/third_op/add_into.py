"""A stand-in op with a reference output, for the graph path's in-place support before (and apart from)
BlockAttnResUpdate: AddInto, x += y in place, z = alpha * x (the new x), on [T, H] float32 tensors.
Its torch schema, derived from the prototype, is `add_into(Tensor(a!) x, Tensor y, float alpha=1.0) -> Tensor`;
its GE outputs are (x, z), x being the reference tensor. Each layer's piece is here in one file, its registry
entry added from outside, and the torch op defined as ge_plugin/__init__.py defines every op of the registry;
run by tests/test_graph_reference_output.py in a fresh process with the Python kernels."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnres_ge.ge_plugin import ops
from attnres_ge.ge_plugin.op_common import define_op
from attnres_ge.op_host.tiling_base import OpTiling, TilingRecord, TilingResult, tiling_parse
from attnres_ge.op_kernel import OpKernel
from attnres_ge.op_proto.op_def import AttrArg, Checker, OpPrototype, TensorArg

OP_TYPE = "AddInto"
NAME = "add_into"
FLOAT32 = (torch.float32,)


def infer_data_type(inputs, attrs, where):
    check = Checker(OP_TYPE, where)
    check.dtype_in("x", inputs["x"], FLOAT32)
    check.same_dtype("y", inputs["y"], "x", inputs["x"])
    return {"x": torch.float32, "z": torch.float32}


def infer_shape(inputs, attrs, where):
    check = Checker(OP_TYPE, where)
    tokens, hidden = check.shape("x", inputs["x"], ("T", "H"), (None, None))
    check.shape("y", inputs["y"], ("T", "H"), (tokens, hidden))
    return {"x": (tokens, hidden), "z": (tokens, hidden)}


PROTOTYPE = OpPrototype(
    op_type=OP_TYPE,
    summary="x += y in place; z = alpha * x",
    inputs=(TensorArg("x", FLOAT32, "[T, H]"), TensorArg("y", FLOAT32, "[T, H]")),
    outputs=(TensorArg("x", FLOAT32, "[T, H]"), TensorArg("z", FLOAT32, "[T, H]")),
    attrs=(AttrArg("alpha", "Float", 1.0),),
    infer_data_type=infer_data_type,
    infer_shape=infer_shape,
)


@dataclass(frozen=True)
class AddIntoTilingData(TilingRecord):
    alpha: float


def tiling(compile_info, inputs, attrs, platform) -> TilingResult:
    return TilingResult(tiling_key=0, block_dim=1, data=AddIntoTilingData(attrs["alpha"]), workspace_size=0)


TILING = OpTiling(PROTOTYPE, AddIntoTilingData, lambda platform: tiling_parse(OP_TYPE, platform), tiling)


def add_into_kernel(x, y, x_out, z, workspace, tiling_data):
    torch.add(x, y, out=x_out)
    torch.mul(x_out, tiling_data.alpha, out=z)


KERNEL = OpKernel(TILING, add_into_kernel)


OP = ops.TorchOp(KERNEL, NAME)
ops.OPS = (*ops.OPS, OP)
define_op(OP)
