"""GE converter of `attnres::block_attn_res_prepare` -> GE op BlockAttnResPrepare.

torch schema:
    block_attn_res_prepare(Tensor block_res, Tensor valid_blocks, Tensor pseudo_query, *, float eps=1e-06)
        -> (Tensor numerator, Tensor logit_max, Tensor exp_sum)

Written once against a `ge` namespace (`custom_op`, `attr.Float`): this package's local `ge`
module, or `torchair.ge` on an Ascend machine. `valid_blocks` is a graph tensor, not an
attribute: the node reads the count when it runs, so a new count needs no new graph.
CANN's eager op `cann_ops_transformer::block_attn_res_prepare` has the same schema.
"""

from __future__ import annotations

from types import ModuleType

from attnres_ge.ge_plugin import ge as local_ge
from attnres_ge.op_proto import PREPARE

OP_TYPE = PREPARE.op_type
INPUTS = tuple(arg.name for arg in PREPARE.inputs)
OUTPUTS = [arg.name for arg in PREPARE.outputs]


def make_converter(ge: ModuleType):
    """The converter of the prepare op, emitting through `ge`."""

    def convert_block_attn_res_prepare(block_res, valid_blocks, pseudo_query, *, eps: float = 1e-6,
                                       meta_outputs=None):
        """Graph tensors block_res [T, N, D] f32, valid_blocks [1] u64, pseudo_query [S, D] f32
        -> (numerator [S, T, D], logit_max [S, T], exp_sum [S, T]), all f32."""
        return ge.custom_op(
            OP_TYPE,
            inputs=dict(zip(INPUTS, (block_res, valid_blocks, pseudo_query), strict=True)),
            outputs=OUTPUTS,
            attrs={"eps": ge.attr.Float(float(eps))},
        )

    return convert_block_attn_res_prepare


make_cann_converter = make_converter  # same schema and attribute name in cann_ops_transformer

convert_block_attn_res_prepare = make_converter(local_ge)
