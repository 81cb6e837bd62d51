"""Prototype of GE op `BlockAttnResPrepare`: phase 1 of the two-phase Block AttnRes read.

Scores every token's first Nv = min(valid_blocks[0], N) sealed snapshots against S pseudo-queries
at once and keeps each (query, token) softmax as an online-softmax state:

    R[t, n]          = sqrt(mean_d block_res[t, n, d]^2 + eps)
    Z[s, t, n]       = (sum_d pseudo_query[s, d] * block_res[t, n, d]) / R[t, n]
    logit_max[s, t]  = max_n Z[s, t, n]
    exp_sum[s, t]    = sum_n exp(Z[s, t, n] - logit_max[s, t])
    numerator[s, t]  = sum_n exp(Z[s, t, n] - logit_max[s, t]) * block_res[t, n, :]

valid_blocks is a tensor so that a graph need not be rebuilt when the count changes: InferShape sees
only its shape, the kernel reads its value.
"""

from __future__ import annotations

import torch

from attnres_ge.op_proto.op_def import AttrArg, Checker, OpPrototype, TensorArg

OP_TYPE = "BlockAttnResPrepare"
MIN_BLOCKS, MAX_BLOCKS = 1, 64
MIN_HIDDEN, MAX_HIDDEN = 1, 8192
FLOAT32_ONLY = (torch.float32,)
UINT64_ONLY = (torch.uint64,)

BLOCK_RES = TensorArg("block_res", FLOAT32_ONLY, "[T, N, D]")
VALID_BLOCKS = TensorArg("valid_blocks", UINT64_ONLY, "[1]")
PSEUDO_QUERY = TensorArg("pseudo_query", FLOAT32_ONLY, "[S, D]")
INPUTS = (BLOCK_RES, VALID_BLOCKS, PSEUDO_QUERY)


def infer_data_type(inputs, attrs, where):
    check = Checker(OP_TYPE, where)
    for arg in INPUTS:
        check.dtype_in(arg.name, inputs[arg.name], arg.accepted_dtypes)
    return {"numerator": torch.float32, "logit_max": torch.float32, "exp_sum": torch.float32}


def infer_shape(inputs, attrs, where):
    check = Checker(OP_TYPE, where)
    check.same_device(inputs)
    tokens, blocks, hidden = check.shape("block_res", inputs["block_res"], ("T", "N", "D"), (None, None, None))
    check.dim_in_range("block_res", "N", "sealed snapshots", blocks, MIN_BLOCKS, MAX_BLOCKS)
    check.dim_in_range("block_res", "D", "hidden size", hidden, MIN_HIDDEN, MAX_HIDDEN)
    check.shape("valid_blocks", inputs["valid_blocks"], ("1",), (1,))
    queries, _ = check.shape("pseudo_query", inputs["pseudo_query"], ("S", "D"), (None, hidden))
    check.positive_float32("eps", attrs["eps"])
    return {"numerator": (queries, tokens, hidden), "logit_max": (queries, tokens), "exp_sum": (queries, tokens)}


PROTOTYPE = OpPrototype(
    op_type=OP_TYPE,
    summary="Block AttnRes phase 1: S pseudo-queries scored against the first valid_blocks sealed snapshots, "
            "kept as online-softmax states.",
    inputs=INPUTS,
    outputs=(
        TensorArg("numerator", FLOAT32_ONLY, "[S, T, D]"),
        TensorArg("logit_max", FLOAT32_ONLY, "[S, T]"),
        TensorArg("exp_sum", FLOAT32_ONLY, "[S, T]"),
    ),
    attrs=(AttrArg("eps", "Float", 1e-6),),
    infer_data_type=infer_data_type,
    infer_shape=infer_shape,
)
