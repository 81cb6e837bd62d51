"""Prototype of GE op `BlockAttentionResiduals` (the forward).

    inv_norm[t, i] = 1 / sqrt(mean_h v[t, i, h]^2 + norm_eps)
    probs[t, :]    = softmax_i(inv_norm[t, i] * sum_h v[t, i, h] * norm_weight[h] * proj_weight[h])
    hidden_states  = sum_i probs[t, i] * v[t, i, :]

where v stacks block_res [T, N, H] and partial_block [T, H] as N+1 rows, partial last.
"""

from __future__ import annotations

import torch

from attnres_ge.op_proto.op_def import FLOAT_DTYPES, AttrArg, Checker, OpPrototype, TensorArg, is_unknown, rows_of

OP_TYPE = "BlockAttentionResiduals"
MIN_BLOCKS, MAX_BLOCKS = 1, 100
FLOAT32_ONLY = (torch.float32,)
# The order of CANN's OpDef for this op (hicann/ops-transformer block_attention_residuals_def.cpp);
# it fixes the dtype columns of the msopgen JSON and the OpDef.
OPDEF_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def infer_data_type(inputs, attrs, where):
    check = Checker(OP_TYPE, where)
    partial = inputs["partial_block"]
    check.dtype_in("partial_block", partial, FLOAT_DTYPES)
    for name in ("block_res", "proj_weight", "norm_weight"):
        check.same_dtype(name, inputs[name], "partial_block", partial)
    return {"hidden_states": partial.dtype, "inv_norm": torch.float32, "probs": torch.float32}


def infer_shape(inputs, attrs, where):
    check = Checker(OP_TYPE, where)
    check.same_device(inputs)
    tokens, hidden = check.shape("partial_block", inputs["partial_block"], ("T", "H"), (None, None))
    check.dim_in_range("partial_block", "H", "hidden size", hidden, 1, None)
    _, blocks, _ = check.shape("block_res", inputs["block_res"], ("T", "N", "H"), (tokens, None, hidden))
    check.dim_in_range("block_res", "N", "completed blocks", blocks, MIN_BLOCKS, MAX_BLOCKS)
    proj = inputs["proj_weight"]
    if len(proj.shape) == 1:
        check.shape("proj_weight", proj, ("H",), (hidden,))
    else:
        check.shape("proj_weight", proj, ("1", "H"), (1, hidden))
    check.shape("norm_weight", inputs["norm_weight"], ("H",), (hidden,))
    check.positive_float32("norm_eps", attrs["norm_eps"])
    valid = attrs["valid_block_num"]
    if valid != -1 and not is_unknown(blocks) and valid != blocks:  # an unknown N is checked at run time
        check.fail(f"attribute valid_block_num is reserved and must be -1 or N = {blocks}, got {valid}")
    saved = (tokens, rows_of(blocks)) if attrs["need_backward"] else (0,)
    return {"hidden_states": (tokens, hidden), "inv_norm": saved, "probs": saved}


PROTOTYPE = OpPrototype(
    op_type=OP_TYPE,
    summary="Block attention residuals: softmax over depth of N completed blocks and the partial block.",
    inputs=(
        TensorArg("partial_block", OPDEF_DTYPES, "[T, H]"),
        TensorArg("block_res", OPDEF_DTYPES, "[T, N, H]"),
        TensorArg("proj_weight", OPDEF_DTYPES, "[1, H] or [H]"),
        TensorArg("norm_weight", OPDEF_DTYPES, "[H]"),
    ),
    outputs=(
        TensorArg("hidden_states", OPDEF_DTYPES, "[T, H]"),
        # Optional, as CANN's OpDef declares them: filled only when need_backward is true; otherwise empty ([0]).
        TensorArg("inv_norm", FLOAT32_ONLY, "[T, N+1] or [0]", presence="optional"),
        TensorArg("probs", FLOAT32_ONLY, "[T, N+1] or [0]", presence="optional"),
    ),
    attrs=(
        AttrArg("valid_block_num", "Int", -1),
        AttrArg("norm_eps", "Float", 1e-6),
        AttrArg("need_backward", "Bool", False),
    ),
    infer_data_type=infer_data_type,
    infer_shape=infer_shape,
)
