"""Prototype of GE op `BlockAttnResUpdate`: phase 2 of the two-phase Block AttnRes read.

Adds a sublayer's output to the live stream and merges the live stream into one query's
online-softmax state from BlockAttnResPrepare (one slot s of its outputs):

    p[t, :]   = partial_block[t, :] + float32(delta[t, :])          (written back into partial_block)
    score[t]  = (sum_d p[t, d] * pseudo_query[d]) / sqrt(mean_d p[t, d]^2 + eps)
    m = max(logit_max, score);  alpha = exp(logit_max - m);  beta = exp(score - m)
    h[t, :]   = (numerator[t, :] * alpha + p[t, :] * beta) / (exp_sum * alpha + beta)

partial_block is a reference tensor: the output of that name is the input's memory, updated in place.
CANN's OpDef takes a bfloat16 delta (h in bfloat16); the CPU kernels also take float32 and float16
(h in delta's dtype).
"""

from __future__ import annotations

import torch

from attnres_ge.op_proto.op_def import FLOAT_DTYPES, AttrArg, Checker, OpPrototype, TensorArg

OP_TYPE = "BlockAttnResUpdate"
MIN_HIDDEN, MAX_HIDDEN = 0, 8192
FLOAT32_ONLY = (torch.float32,)
BFLOAT16_ONLY = (torch.bfloat16,)

PARTIAL_BLOCK = TensorArg("partial_block", FLOAT32_ONLY, "[T, D]")
DELTA = TensorArg("delta", BFLOAT16_ONLY, "[T, D]", cpu_dtypes=FLOAT_DTYPES)
PSEUDO_QUERY = TensorArg("pseudo_query", FLOAT32_ONLY, "[D]")
NUMERATOR = TensorArg("numerator", FLOAT32_ONLY, "[T, D]")
LOGIT_MAX = TensorArg("logit_max", FLOAT32_ONLY, "[T]")
EXP_SUM = TensorArg("exp_sum", FLOAT32_ONLY, "[T]")
INPUTS = (PARTIAL_BLOCK, DELTA, PSEUDO_QUERY, NUMERATOR, LOGIT_MAX, EXP_SUM)


def infer_data_type(inputs, attrs, where, op_type=OP_TYPE):
    """The update's outputs' dtypes; `op_type` names the op in errors (BlockAttnResUpdateNorm checks the same)."""
    check = Checker(op_type, where)
    for arg in INPUTS:
        check.dtype_in(arg.name, inputs[arg.name], arg.accepted_dtypes)
    return {"partial_block": inputs["partial_block"].dtype, "h": inputs["delta"].dtype}


def infer_shape(inputs, attrs, where, op_type=OP_TYPE):
    check = Checker(op_type, where)
    check.same_device(inputs)
    tokens, hidden = check.shape("partial_block", inputs["partial_block"], ("T", "D"), (None, None))
    check.dim_in_range("partial_block", "D", "hidden size", hidden, MIN_HIDDEN, MAX_HIDDEN)
    for name in ("delta", "numerator"):
        check.shape(name, inputs[name], ("T", "D"), (tokens, hidden))
    check.shape("pseudo_query", inputs["pseudo_query"], ("D",), (hidden,))
    for name in ("logit_max", "exp_sum"):
        check.shape(name, inputs[name], ("T",), (tokens,))
    check.positive_float32("eps", attrs["eps"])
    return {"partial_block": (tokens, hidden), "h": (tokens, hidden)}


PROTOTYPE = OpPrototype(
    op_type=OP_TYPE,
    summary="Block AttnRes phase 2: partial_block += delta in place, then h = the read merging the live stream "
            "into one query's online-softmax state.",
    inputs=INPUTS,
    outputs=(
        TensorArg("partial_block", FLOAT32_ONLY, "[T, D]"),  # the reference output: the input, updated
        TensorArg("h", BFLOAT16_ONLY, "[T, D]", cpu_dtypes=FLOAT_DTYPES),
    ),
    attrs=(AttrArg("eps", "Float", 1e-6),),
    infer_data_type=infer_data_type,
    infer_shape=infer_shape,
)
