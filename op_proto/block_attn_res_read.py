"""Prototype of GE op `BlockAttnResRead`: the general read of Block AttnRes, S queries over L sources.

Per token, with x_i source i's row (i < L), q_s query s, w the key-norm weight (1 when absent) and g_s the
output-norm weight of query s (shared when given as [H] or [1, H]):

    r_i     = 1 / sqrt(mean_h x_i^2 + eps)                       inv_norm [T, L]
    p_s,i   = softmax_i(scale * r_i * <q_s * w, x_i>)            probs [S, T, L]
    y_s     = sum_i p_s,i v_i,   v_i = x_i * r_i if normalize_values else x_i
    o_s     = g_s * y_s * rho_s, rho_s = 1 / sqrt(mean_h y_s^2 + output_eps)   output_inv_rms [S, T]
              (y_s itself when there is no output-norm weight); hidden_states [S, T, H] is o in the sources' dtype

The sources are a list read where they lie (each [T, H], any row stride); the statistics are written only
with save_statistics (what the backward needs, and the weights a caller asks for), else they are empty.
"""

from __future__ import annotations

import math

import torch

from attnres_ge.op_proto.op_def import FLOAT_DTYPES, AttrArg, Checker, OpPrototype, TensorArg, float32, is_unknown

OP_TYPE = "BlockAttnResRead"
FLOAT32_ONLY = (torch.float32,)


def check_sources(check: Checker, sources) -> tuple:
    """Every source [T, H] of one dtype and shape: (T, H, L, dtype)."""
    first = sources[0]
    check.dtype_in("sources[0]", first, FLOAT_DTYPES)
    tokens, hidden = check.shape("sources[0]", first, ("T", "H"), (None, None))
    check.dim_in_range("sources[0]", "H", "hidden size", hidden, 1, None)
    for index, source in enumerate(sources[1:], start=1):
        check.same_dtype(f"sources[{index}]", source, "sources[0]", first)
        check.shape(f"sources[{index}]", source, ("T", "H"), (tokens, hidden))
    return tokens, hidden, len(sources), first.dtype


def check_parameters(check: Checker, inputs, hidden) -> int:
    """query [S, H], key_norm_weight [H], output_norm_weight [H] or [W, H] with W 1 or S: returns S."""
    query = inputs["query"]
    check.dtype_in("query", query, FLOAT_DTYPES)
    queries, _ = check.shape("query", query, ("S", "H"), (None, hidden))
    check.dim_in_range("query", "S", "queries", queries, 1, None)
    key = inputs["key_norm_weight"]
    if key is not None:
        check.dtype_in("key_norm_weight", key, FLOAT_DTYPES)
        check.shape("key_norm_weight", key, ("H",), (hidden,))
    gain = inputs["output_norm_weight"]
    if gain is not None:
        check.dtype_in("output_norm_weight", gain, FLOAT_DTYPES)
        if len(gain.shape) == 1:
            check.shape("output_norm_weight", gain, ("H",), (hidden,))
        else:
            rows, _ = check.shape("output_norm_weight", gain, ("W", "H"), (None, hidden))
            if not (is_unknown(rows) or is_unknown(queries)) and rows not in (1, queries):
                check.fail(f"output_norm_weight must be [H], [1, H] or [S, H] with S = {queries}, got W = {rows}")
    return queries


def check_attrs(check: Checker, attrs) -> None:
    check.positive_float32("eps", attrs["eps"])
    check.positive_float32("output_eps", attrs["output_eps"])
    if not math.isfinite(float32(attrs["scale"])):
        check.fail(f"attribute scale must be finite as a float32, got {attrs['scale']!r}")


def infer_data_type(inputs, attrs, where):
    check = Checker(OP_TYPE, where)
    dtype = check_sources(check, inputs["sources"])[3]
    return {"hidden_states": dtype, "inv_norm": torch.float32, "probs": torch.float32, "output_inv_rms": torch.float32}


def infer_shape(inputs, attrs, where):
    check = Checker(OP_TYPE, where)
    check.same_device({f"sources[{i}]": meta for i, meta in enumerate(inputs["sources"])}
                      | {name: meta for name, meta in inputs.items() if name != "sources" and meta is not None})
    tokens, hidden, rows, _ = check_sources(check, inputs["sources"])
    queries = check_parameters(check, inputs, hidden)
    check_attrs(check, attrs)
    saved = attrs["save_statistics"]
    normed = saved and inputs["output_norm_weight"] is not None
    return {"hidden_states": (queries, tokens, hidden),
            "inv_norm": (tokens, rows) if saved else (0,),
            "probs": (queries, tokens, rows) if saved else (0,),
            "output_inv_rms": (queries, tokens) if normed else (0,)}


SOURCE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# The attributes of the math, which the gradient op takes too.
MATH_ATTRS = (
    AttrArg("eps", "Float", 1e-6),
    AttrArg("output_eps", "Float", 1e-6),
    AttrArg("scale", "Float", 1.0),
    AttrArg("normalize_values", "Bool", False),
)

PROTOTYPE = OpPrototype(
    op_type=OP_TYPE,
    summary="The general Block AttnRes read: S queries over L sources, optional key and output RMSNorm.",
    inputs=(
        TensorArg("sources", SOURCE_DTYPES, "[T, H]", presence="dynamic"),
        TensorArg("query", SOURCE_DTYPES, "[S, H]"),
        TensorArg("key_norm_weight", SOURCE_DTYPES, "[H]", presence="optional"),
        TensorArg("output_norm_weight", SOURCE_DTYPES, "[H] or [W, H]", presence="optional"),
    ),
    outputs=(
        TensorArg("hidden_states", SOURCE_DTYPES, "[S, T, H]"),
        TensorArg("inv_norm", FLOAT32_ONLY, "[T, L] or [0]", presence="optional"),
        TensorArg("probs", FLOAT32_ONLY, "[S, T, L] or [0]", presence="optional"),
        TensorArg("output_inv_rms", FLOAT32_ONLY, "[S, T] or [0]", presence="optional"),
    ),
    attrs=(*MATH_ATTRS, AttrArg("save_statistics", "Bool", False)),
    infer_data_type=infer_data_type,
    infer_shape=infer_shape,
)
