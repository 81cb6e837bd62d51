"""GE converter of `attnres::block_attention_residuals_backward` -> GE op BlockAttentionResidualsGrad.

torch schema:
    block_attention_residuals_backward(Tensor partial_block, Tensor block_res, Tensor proj_weight,
                                       Tensor norm_weight, Tensor grad_hidden_states, Tensor inv_norm,
                                       Tensor probs, *, int valid_block_num=0)
        -> (Tensor grad_partial_block, Tensor grad_block_res, Tensor grad_proj_weight, Tensor grad_norm_weight)

Written once against a `ge` namespace (this package's local `ge`, or `torchair.ge`).
`cann_ops_transformer::block_attention_residuals_backward` has the same schema.
"""

from __future__ import annotations

from types import ModuleType

from attnres_ge.ge_plugin import ge as local_ge
from attnres_ge.op_proto import BACKWARD

OP_TYPE = BACKWARD.op_type
INPUTS = tuple(arg.name for arg in BACKWARD.inputs)
OUTPUTS = [arg.name for arg in BACKWARD.outputs]


def make_converter(ge: ModuleType):
    """The converter of the backward op, emitting through `ge`."""

    def convert_block_attention_residuals_backward(
        partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm, probs,
        *, valid_block_num: int = 0, meta_outputs=None,
    ):
        """Graph tensors [T, H], [T, N, H], [1, H], [H], [T, H], [T, N+1] f32, [T, N+1] f32
        -> (grad_partial_block [T, H], grad_block_res [T, N, H], grad_proj_weight [1, H], grad_norm_weight [H])."""
        tensors = (partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm, probs)
        return ge.custom_op(
            OP_TYPE,
            inputs=dict(zip(INPUTS, tensors, strict=True)),
            outputs=OUTPUTS,
            attrs={"valid_block_num": ge.attr.Int(int(valid_block_num))},
        )

    return convert_block_attention_residuals_backward


make_cann_converter = make_converter  # same schema and attribute names in cann_ops_transformer

convert_block_attention_residuals_backward = make_converter(local_ge)
