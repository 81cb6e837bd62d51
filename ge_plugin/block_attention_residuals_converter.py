"""GE converter of `attnres::block_attention_residuals` -> GE op BlockAttentionResiduals.

torch schema:
    block_attention_residuals(Tensor partial_block, Tensor block_res, Tensor proj_weight, Tensor norm_weight,
                              int valid_block_num=-1, float norm_eps=1e-06, bool need_backward=False)
        -> (Tensor hidden_states, Tensor inv_norm, Tensor probs)

Written once against a `ge` namespace (`custom_op`, `attr.Int/Float/Bool`): this package's
local `ge` module, or `torchair.ge` on an Ascend machine. CANN's own eager op
`cann_ops_transformer::block_attention_residuals` has the same schema with the attributes
spelled validBlockNum, normEps, needBackward; its converter renames and emits the same node.
"""

from __future__ import annotations

from types import ModuleType

from attnres_ge.ge_plugin import ge as local_ge
from attnres_ge.op_proto import FORWARD

OP_TYPE = FORWARD.op_type
INPUTS = tuple(arg.name for arg in FORWARD.inputs)
OUTPUTS = [arg.name for arg in FORWARD.outputs]


def make_converter(ge: ModuleType):
    """The converter of the attnres op, emitting through `ge`."""

    def convert_block_attention_residuals(
        partial_block, block_res, proj_weight, norm_weight,
        valid_block_num: int = -1, norm_eps: float = 1e-6, need_backward: bool = False, meta_outputs=None,
    ):
        """Graph tensors partial_block [T, H], block_res [T, N, H], proj_weight [1, H] or [H],
        norm_weight [H] -> (hidden_states [T, H], inv_norm [T, N+1] | [0], probs [T, N+1] | [0])."""
        return ge.custom_op(
            OP_TYPE,
            inputs=dict(zip(INPUTS, (partial_block, block_res, proj_weight, norm_weight), strict=True)),
            outputs=OUTPUTS,
            attrs={
                "valid_block_num": ge.attr.Int(int(valid_block_num)),
                "norm_eps": ge.attr.Float(float(norm_eps)),
                "need_backward": ge.attr.Bool(bool(need_backward)),
            },
        )

    return convert_block_attention_residuals


def make_cann_converter(ge: ModuleType):
    """The converter of `cann_ops_transformer::block_attention_residuals` (camelCase attributes)."""
    convert = make_converter(ge)

    def convert_cann_block_attention_residuals(
        partial_block, block_res, proj_weight, norm_weight,
        validBlockNum: int = -1, normEps: float = 1e-6, needBackward: bool = False, meta_outputs=None,  # noqa: N803
    ):
        return convert(partial_block, block_res, proj_weight, norm_weight, validBlockNum, normEps, needBackward,
                       meta_outputs=meta_outputs)

    return convert_cann_block_attention_residuals


convert_block_attention_residuals = make_converter(local_ge)
