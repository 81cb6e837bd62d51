"""The general read under torchair: CANN's GE has no BlockAttnResRead, so its converters for torchair emit CANN's
own ops where the read is CANN's case, and refuse every other case by name (never a graph GE cannot load).

CANN's case: one query, a key-norm weight, raw values (normalize_values false), scale 1, 2 to 101 sources and
every tensor of the sources' dtype. Its forward

    sources[:-1] --Pack(axis=1)--> block_res [T, N, H];  sources[-1] is partial_block [T, H]
    BlockAttentionResiduals(partial_block, block_res, query [1, H], key_norm_weight) -> hidden [T, H], inv_norm, probs
    with an output norm: RmsNorm(hidden, output_norm_weight, epsilon=output_eps) -> hidden, rstd [T, 1]
    Unsqueeze to the read's [1, T, H] and [1, T, L]; a statistic not kept is an empty Const ([0], float32)

and its backward (no output norm: the fused output norm's gradient would need the unnormalised output, which the
read does not save)

    BlockAttentionResidualsGrad(partial_block, block_res, query, key_norm_weight, grad [T, H], inv_norm, probs)
    grad_block_res --Split(axis=1)--> Squeeze(axis=1) each: grad_sources[:-1]; grad_partial_block the last
    the weight gradients Cast to float32 (the read's dtype for them); no output norm: an empty Const

The two-phase update with a fused output norm (BlockAttnResUpdateNorm, also this package's own) becomes CANN's
update and RmsNorm: BlockAttnResUpdate(...) -> h, RmsNorm(h, output_norm_weight, epsilon=output_eps) -> normed h
(h rounded to delta's dtype between the two, where the fused op rounds once); the weight must be in delta's dtype.

The nodes of CANN's ops come through the registry's converters (make_converter, bound to torchair.ge); the
others (Pack, Split, Squeeze, Unsqueeze, RmsNorm, Cast, Const) are torchair's own GE op builders, `raw` here
(torchair._ge_concrete_graph.ge_apis), which `raw_ops()` gives at conversion time, so that this module never
imports torchair.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from attnres_ge.op_proto.block_attention_residuals import MAX_BLOCKS, MIN_BLOCKS

READ_TYPE, READ_GRAD_TYPE = "BlockAttnResRead", "BlockAttnResReadGrad"
UPDATE_NORM_TYPE = "BlockAttnResUpdateNorm"
CANN_CASE = (f"one query, a key-norm weight, raw values, scale 1, {MIN_BLOCKS + 1} to {MAX_BLOCKS + 1} sources, "
             "every tensor in the sources' dtype")


class TorchairReadError(NotImplementedError):
    """A read that is not CANN's case reached torchair, which has no op to run it."""


def _refuse(op_type: str, reason: str) -> None:
    raise TorchairReadError(
        f"{op_type} under torchair: CANN's GE runs a read only as BlockAttentionResiduals ({CANN_CASE}); this one "
        f"has {reason}. Compile it with backend='attnres_ge', or call it eagerly")


def _not_cann_case(sources, query_rows: int, key, others, normalize_values: bool, scale: float) -> str | None:
    """Why a read is not CANN's case (the first reason found), or None."""
    dtype = sources[0].dtype
    if query_rows != 1:
        return f"{query_rows} queries"
    if key is None:
        return "no key-norm weight"
    if normalize_values:
        return "normalize_values=True"
    if scale != 1.0:
        return f"scale={scale!r}"
    if not MIN_BLOCKS + 1 <= len(sources) <= MAX_BLOCKS + 1:
        return f"{len(sources)} sources"
    mixed = [name for name, tensor in (("key_norm_weight", key), *others) if tensor is not None and
             tensor.dtype != dtype]
    return f"{', '.join(mixed)} in another dtype than the sources" if mixed else None


def _stacked_blocks(raw: ModuleType, sources) -> tuple:
    """(partial_block, block_res [T, N, H]): the last source, and the others stacked on a new axis 1."""
    return sources[-1], raw.Pack(list(sources[:-1]), N=len(sources) - 1, axis=1)


def _empty(raw: ModuleType):
    """An output not produced: float32 [0] (a list, not a torch tensor: converters run under fake mode)."""
    return raw.Const([], dtype=raw.DataType.DT_FLOAT)


def make_read_converter(raw_ops: Callable[[], ModuleType], forward: Callable) -> Callable:
    """The torchair converter of attnres.block_attn_res_read; `forward` is BlockAttentionResiduals' converter."""

    def convert_block_attn_res_read(sources, query, key_norm_weight=None, output_norm_weight=None, *, eps=1e-6,
                                    output_eps=1e-6, scale=1.0, normalize_values=False, save_statistics=False,
                                    meta_outputs=None):
        query_rows = meta_outputs[0].size[0]  # torchair's TensorSpec of hidden_states [S, T, H]
        reason = _not_cann_case(sources, query_rows, key_norm_weight,
                                (("query", query), ("output_norm_weight", output_norm_weight)), normalize_values,
                                scale)
        if reason is not None:
            _refuse(READ_TYPE, reason)
        raw = raw_ops()
        partial_block, block_res = _stacked_blocks(raw, sources)
        hidden, inv_norm, probs = forward(partial_block, block_res, query, key_norm_weight, -1, eps, save_statistics)
        inv_rms = _empty(raw)
        if output_norm_weight is not None:  # RmsNorm normalises over as many trailing dims as gamma has: [H]
            gamma = raw.Squeeze(output_norm_weight, axis=[0]) if output_norm_weight.rank == 2 else output_norm_weight
            hidden, rstd = raw.RmsNorm(hidden, gamma, epsilon=output_eps)
            if save_statistics:
                inv_rms = raw.Squeeze(rstd, axis=[1])
        if save_statistics:
            probs = raw.Unsqueeze(probs, axes=[0])
            inv_rms = inv_rms if output_norm_weight is None else raw.Unsqueeze(inv_rms, axes=[0])
        return raw.Unsqueeze(hidden, axes=[0]), inv_norm, probs, inv_rms

    return convert_block_attn_res_read


def make_read_grad_converter(raw_ops: Callable[[], ModuleType], backward: Callable) -> Callable:
    """The torchair converter of attnres.block_attn_res_read_backward; `backward` is BlockAttentionResidualsGrad's."""

    def convert_block_attn_res_read_backward(grad_hidden_states, sources, query, inv_norm, probs, output_inv_rms,
                                             key_norm_weight=None, output_norm_weight=None, *, eps=1e-6,
                                             output_eps=1e-6, scale=1.0, normalize_values=False, meta_outputs=None):
        query_rows = meta_outputs[1].size[0]  # grad_query [S, H]
        reason = _not_cann_case(sources, query_rows, key_norm_weight, (("query", query),), normalize_values, scale)
        if reason is None and output_norm_weight is not None:
            reason = "an output-norm weight (its gradient needs the unnormalised output, which the read does not save)"
        if reason is not None:
            _refuse(READ_GRAD_TYPE, reason)
        raw = raw_ops()
        partial_block, block_res = _stacked_blocks(raw, sources)
        grads = backward(partial_block, block_res, query, key_norm_weight, raw.Squeeze(grad_hidden_states, axis=[0]),
                         inv_norm, raw.Squeeze(probs, axis=[0]), valid_block_num=0)
        grad_partial, grad_blocks, grad_query, grad_key = grads
        blocks = len(sources) - 1
        split = raw.Split(raw.Const(1, dtype=raw.DataType.DT_INT32), grad_blocks, num_split=blocks)
        split = split if isinstance(split, (list, tuple)) else [split]
        grad_sources = [raw.Squeeze(grad, axis=[1]) for grad in split] + [grad_partial]
        as_float32 = [raw.Cast(grad, dst_type=raw.DataType.DT_FLOAT) for grad in (grad_query, grad_key)]
        return grad_sources, *as_float32, _empty(raw)

    return convert_block_attn_res_read_backward


def make_update_norm_converter(raw_ops: Callable[[], ModuleType], update: Callable) -> Callable:
    """The torchair converter of attnres.block_attn_res_update_norm; `update` is BlockAttnResUpdate's."""

    def convert_block_attn_res_update_norm(partial_block, delta, pseudo_query, numerator, logit_max, exp_sum,
                                           output_norm_weight, *, eps=1e-6, output_eps=1e-6, meta_outputs=None):
        if output_norm_weight.dtype != delta.dtype:  # RmsNorm takes gamma in x's dtype
            raise TorchairReadError(
                f"{UPDATE_NORM_TYPE} under torchair: CANN's RmsNorm needs output_norm_weight in delta's dtype "
                f"({delta.dtype}), got {output_norm_weight.dtype}. Cast the weight, or compile with "
                "backend='attnres_ge'")
        h = update(partial_block, delta, pseudo_query, numerator, logit_max, exp_sum, eps=eps)
        normed, _ = raw_ops().RmsNorm(h, output_norm_weight, epsilon=output_eps)
        return normed

    return convert_block_attn_res_update_norm
