"""GE converter of `attnres::block_attn_res_update` -> GE op BlockAttnResUpdate.

torch schema:
    block_attn_res_update(Tensor(a!) partial_block, Tensor delta, Tensor pseudo_query, Tensor numerator,
                          Tensor logit_max, Tensor exp_sum, *, float eps=1e-06) -> Tensor

`partial_block` is a reference tensor: the node's input and its first output share the name, and
GE writes the updated stream into the input's memory. So the converter returns only `h`, as the
torch op does; the node's `partial_block` output is the mutation, which the graph runtime applies
to the tensor fed to the node (the local GE: ge_plugin/local_ge.py, "Reference outputs").
Written once against a `ge` namespace (this package's local `ge`, or `torchair.ge`).
CANN's eager op `cann_ops_transformer::block_attn_res_update` has the same schema.
"""

from __future__ import annotations

from types import ModuleType

from attnres_ge.ge_plugin import ge as local_ge
from attnres_ge.op_proto import UPDATE

OP_TYPE = UPDATE.op_type
INPUTS = tuple(arg.name for arg in UPDATE.inputs)
OUTPUTS = [arg.name for arg in UPDATE.outputs]
H_OUTPUT = OUTPUTS.index("h")


def make_converter(ge: ModuleType):
    """The converter of the update op, emitting through `ge`."""

    def convert_block_attn_res_update(partial_block, delta, pseudo_query, numerator, logit_max, exp_sum, *,
                                      eps: float = 1e-6, meta_outputs=None):
        """Graph tensors partial_block [T, D] f32 (updated in place), delta [T, D], pseudo_query [D] f32,
        numerator [T, D] f32, logit_max [T] f32, exp_sum [T] f32 -> h [T, D] in delta's dtype."""
        tensors = (partial_block, delta, pseudo_query, numerator, logit_max, exp_sum)
        outputs = ge.custom_op(
            OP_TYPE,
            inputs=dict(zip(INPUTS, tensors, strict=True)),
            outputs=OUTPUTS,
            attrs={"eps": ge.attr.Float(float(eps))},
        )
        return outputs[H_OUTPUT]

    return convert_block_attn_res_update


make_cann_converter = make_converter  # same schema and attribute name in cann_ops_transformer

convert_block_attn_res_update = make_converter(local_ge)
