"""A third op written the way docs/architecture.md's "How to add an op" says, to show that shared code needs
no edit: ScaledAdd, z = x + alpha * y on [T, H] float32 tensors. Every layer's piece is here in one
file for the test's sake (in the package each is its own file); run by tests/test_third_op.py in
a fresh process with the Python kernels (it has no native kernel)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from attnres_ge.ge_plugin import ops
from attnres_ge.ge_plugin.op_common import define_op, fake_outputs, run_eager
from attnres_ge.op_host.tiling_base import OpTiling, TilingRecord, TilingResult, tiling_parse
from attnres_ge.op_kernel import OpKernel
from attnres_ge.op_proto.op_def import AttrArg, Checker, OpPrototype, TensorArg

OP_TYPE = "ScaledAdd"
FLOAT32 = (torch.float32,)


# op_proto/scaled_add.py
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


# op_host/scaled_add_tiling.py
@dataclass(frozen=True)
class ScaledAddTilingData(TilingRecord):
    tokens: int
    hidden: int
    alpha: float


def tiling(compile_info, inputs, attrs, platform) -> TilingResult:
    tokens, hidden = inputs["x"].shape
    return TilingResult(tiling_key=0, block_dim=1, data=ScaledAddTilingData(tokens, hidden, attrs["alpha"]),
                        workspace_size=0)


TILING = OpTiling(PROTOTYPE, ScaledAddTilingData, lambda platform: tiling_parse(OP_TYPE, platform), tiling)


# op_kernel/scaled_add.py
def scaled_add_kernel(x, y, z, workspace, tiling_data):
    torch.add(x, y, alpha=tiling_data.alpha, out=z)


KERNEL = OpKernel(TILING, scaled_add_kernel)


# ge_plugin/scaled_add_converter.py
def make_converter(ge):
    def convert_scaled_add(x, y, alpha: float = 1.0, meta_outputs=None):
        return ge.custom_op(OP_TYPE, inputs={"x": x, "y": y}, outputs=["z"], attrs={"alpha": ge.attr.Float(alpha)})

    return convert_scaled_add


# the registry entry (ge_plugin/ops.py), here added from outside
OP = ops.TorchOp(KERNEL, "scaled_add", SimpleNamespace(make_converter=make_converter))
ops.OPS = (*ops.OPS, OP)


# ge_plugin/scaled_add.py: the torch op
def _cpu(x, y, alpha=1.0):
    return run_eager(KERNEL, (x, y), {"alpha": alpha})[0]


def _fake(x, y, alpha=1.0):
    return fake_outputs(PROTOTYPE, (x, y), {"alpha": alpha})[0]


define_op(OP, "(Tensor x, Tensor y, float alpha=1.0) -> Tensor", _fake, _cpu)
