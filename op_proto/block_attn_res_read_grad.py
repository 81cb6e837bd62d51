"""Prototype of GE op `BlockAttnResReadGrad`: the gradients of BlockAttnResRead (op_proto/block_attn_res_read.py)
for every input, from the output's gradient and the statistics the forward saved (inv_norm, probs and, with an
output norm, output_inv_rms). A gradient of an absent weight is empty ([0])."""

from __future__ import annotations

import torch

from attnres_ge.op_proto.block_attn_res_read import (
    FLOAT32_ONLY,
    MATH_ATTRS,
    SOURCE_DTYPES,
    check_attrs,
    check_parameters,
    check_sources,
)
from attnres_ge.op_proto.op_def import Checker, OpPrototype, TensorArg

OP_TYPE = "BlockAttnResReadGrad"


def infer_data_type(inputs, attrs, where):
    check = Checker(OP_TYPE, where)
    dtype = check_sources(check, inputs["sources"])[3]
    check.same_dtype("grad_hidden_states", inputs["grad_hidden_states"], "sources[0]", inputs["sources"][0])
    for name in ("inv_norm", "probs", "output_inv_rms"):
        check.dtype_in(name, inputs[name], FLOAT32_ONLY)
    return {"grad_sources": dtype, "grad_query": torch.float32, "grad_key_norm_weight": torch.float32,
            "grad_output_norm_weight": torch.float32}


def infer_shape(inputs, attrs, where):
    check = Checker(OP_TYPE, where)
    tokens, hidden, rows, _ = check_sources(check, inputs["sources"])
    queries = check_parameters(check, inputs, hidden)
    check_attrs(check, attrs)
    check.shape("grad_hidden_states", inputs["grad_hidden_states"], ("S", "T", "H"), (queries, tokens, hidden))
    check.shape("inv_norm", inputs["inv_norm"], ("T", "L"), (tokens, rows))
    check.shape("probs", inputs["probs"], ("S", "T", "L"), (queries, tokens, rows))
    key, gain = inputs["key_norm_weight"], inputs["output_norm_weight"]
    if gain is not None:
        check.shape("output_inv_rms", inputs["output_inv_rms"], ("S", "T"), (queries, tokens))
    return {"grad_sources": (tokens, hidden), "grad_query": (queries, hidden),
            "grad_key_norm_weight": (hidden,) if key is not None else (0,),
            "grad_output_norm_weight": tuple(gain.shape) if gain is not None else (0,)}


PROTOTYPE = OpPrototype(
    op_type=OP_TYPE,
    summary="Gradients of the general Block AttnRes read for its sources, queries and both norm weights.",
    inputs=(
        TensorArg("grad_hidden_states", SOURCE_DTYPES, "[S, T, H]"),
        TensorArg("sources", SOURCE_DTYPES, "[T, H]", presence="dynamic"),
        TensorArg("query", SOURCE_DTYPES, "[S, H]"),
        TensorArg("inv_norm", FLOAT32_ONLY, "[T, L]"),
        TensorArg("probs", FLOAT32_ONLY, "[S, T, L]"),
        TensorArg("output_inv_rms", FLOAT32_ONLY, "[S, T] or [0]"),
        TensorArg("key_norm_weight", SOURCE_DTYPES, "[H]", presence="optional"),
        TensorArg("output_norm_weight", SOURCE_DTYPES, "[H] or [W, H]", presence="optional"),
    ),
    outputs=(
        TensorArg("grad_sources", SOURCE_DTYPES, "[T, H]", presence="dynamic"),  # one per source
        TensorArg("grad_query", FLOAT32_ONLY, "[S, H]"),
        TensorArg("grad_key_norm_weight", FLOAT32_ONLY, "[H] or [0]", presence="optional"),
        TensorArg("grad_output_norm_weight", FLOAT32_ONLY, "[H], [W, H] or [0]", presence="optional"),
    ),
    attrs=MATH_ATTRS,
    infer_data_type=infer_data_type,
    infer_shape=infer_shape,
)
