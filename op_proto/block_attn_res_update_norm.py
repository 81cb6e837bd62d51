"""Prototype of GE op `BlockAttnResUpdateNorm`: BlockAttnResUpdate with the next sublayer's RMSNorm fused.

This package's own op (CANN has none): the two-phase read's update, whose h is normed before it is stored,

    p, h as BlockAttnResUpdate computes them (op_proto/block_attn_res_update.py), h in float32
    h_normed[t, :] = g * h[t, :] * rho[t],  rho[t] = 1 / sqrt(mean_d h[t, d]^2 + output_eps)

rounded once to delta's dtype: what BlockAttnResUpdate followed by an RMSNorm of weight g gives, in one pass
over the rows and without h's own rounding. partial_block is updated in place, as the update's.
"""

from __future__ import annotations

from attnres_ge.op_proto import block_attn_res_update as update
from attnres_ge.op_proto.op_def import FLOAT_DTYPES, AttrArg, Checker, OpPrototype, TensorArg

OP_TYPE = "BlockAttnResUpdateNorm"
OUTPUT_NORM_WEIGHT = TensorArg("output_norm_weight", FLOAT_DTYPES, "[D]")


def infer_data_type(inputs, attrs, where):
    Checker(OP_TYPE, where).dtype_in(OUTPUT_NORM_WEIGHT.name, inputs[OUTPUT_NORM_WEIGHT.name], FLOAT_DTYPES)
    return update.infer_data_type(inputs, attrs, where, OP_TYPE)


def infer_shape(inputs, attrs, where):
    shapes = update.infer_shape(inputs, attrs, where, OP_TYPE)
    check = Checker(OP_TYPE, where)
    check.shape(OUTPUT_NORM_WEIGHT.name, inputs[OUTPUT_NORM_WEIGHT.name], ("D",), (shapes["h"][1],))
    check.positive_float32("output_eps", attrs["output_eps"])
    return shapes


PROTOTYPE = OpPrototype(
    op_type=OP_TYPE,
    summary="Block AttnRes phase 2 with an output RMSNorm: partial_block += delta in place, then h = the read "
            "merging the live stream, normed by output_norm_weight.",
    inputs=(*update.INPUTS, OUTPUT_NORM_WEIGHT),
    outputs=update.PROTOTYPE.outputs,
    attrs=(*update.PROTOTYPE.attrs, AttrArg("output_eps", "Float", 1e-6)),
    infer_data_type=infer_data_type,
    infer_shape=infer_shape,
)
