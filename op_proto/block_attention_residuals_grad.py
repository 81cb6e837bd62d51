"""Prototype of GE op `BlockAttentionResidualsGrad` (the backward).

Takes the forward's inputs, the gradient of hidden_states and the forward's saved
inv_norm and probs (used as given, not recomputed); returns the gradients of the
four forward inputs in the dtype of partial_block.
"""

from __future__ import annotations

import torch

from attnres_ge.op_proto.op_def import FLOAT_DTYPES, AttrArg, Checker, OpPrototype, TensorArg, rows_of

OP_TYPE = "BlockAttentionResidualsGrad"
MIN_BLOCKS, MAX_BLOCKS = 0, 128
FLOAT32_ONLY = (torch.float32,)


def infer_data_type(inputs, attrs, where):
    check = Checker(OP_TYPE, where)
    partial = inputs["partial_block"]
    check.dtype_in("partial_block", partial, FLOAT_DTYPES)
    for name in ("block_res", "proj_weight", "norm_weight", "grad_hidden_states"):
        check.same_dtype(name, inputs[name], "partial_block", partial)
    for name in ("inv_norm", "probs"):
        check.dtype_in(name, inputs[name], FLOAT32_ONLY)
    dtype = partial.dtype
    return {"grad_partial_block": dtype, "grad_block_res": dtype, "grad_proj_weight": dtype, "grad_norm_weight": dtype}


def infer_shape(inputs, attrs, where):
    check = Checker(OP_TYPE, where)
    check.same_device(inputs)
    tokens, hidden = check.shape("partial_block", inputs["partial_block"], ("T", "H"), (None, None))
    check.dim_in_range("partial_block", "H", "hidden size", hidden, 1, None)
    _, blocks, _ = check.shape("block_res", inputs["block_res"], ("T", "N", "H"), (tokens, None, hidden))
    check.dim_in_range("block_res", "N", "completed blocks", blocks, MIN_BLOCKS, MAX_BLOCKS)
    check.shape("proj_weight", inputs["proj_weight"], ("1", "H"), (1, hidden))
    check.shape("norm_weight", inputs["norm_weight"], ("H",), (hidden,))
    check.shape("grad_hidden_states", inputs["grad_hidden_states"], ("T", "H"), (tokens, hidden))
    rows = rows_of(blocks)
    for name in ("inv_norm", "probs"):
        check.shape(name, inputs[name], ("T", "N+1"), (tokens, rows))
    return {
        "grad_partial_block": (tokens, hidden),
        "grad_block_res": (tokens, blocks, hidden),
        "grad_proj_weight": (1, hidden),
        "grad_norm_weight": (hidden,),
    }


PROTOTYPE = OpPrototype(
    op_type=OP_TYPE,
    summary="Gradient of BlockAttentionResiduals from the saved inv_norm and probs.",
    inputs=(
        TensorArg("partial_block", FLOAT_DTYPES, "[T, H]"),
        TensorArg("block_res", FLOAT_DTYPES, "[T, N, H]"),
        TensorArg("proj_weight", FLOAT_DTYPES, "[1, H]"),
        TensorArg("norm_weight", FLOAT_DTYPES, "[H]"),
        TensorArg("grad_hidden_states", FLOAT_DTYPES, "[T, H]"),
        TensorArg("inv_norm", FLOAT32_ONLY, "[T, N+1]"),
        TensorArg("probs", FLOAT32_ONLY, "[T, N+1]"),
    ),
    outputs=(
        TensorArg("grad_partial_block", FLOAT_DTYPES, "[T, H]"),
        TensorArg("grad_block_res", FLOAT_DTYPES, "[T, N, H]"),
        TensorArg("grad_proj_weight", FLOAT_DTYPES, "[1, H]"),
        TensorArg("grad_norm_weight", FLOAT_DTYPES, "[H]"),
    ),
    attrs=(AttrArg("valid_block_num", "Int", 0),),
    infer_data_type=infer_data_type,
    infer_shape=infer_shape,
)
