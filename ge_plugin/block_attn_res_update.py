"""torch op `attnres::block_attn_res_update` (GE type BlockAttnResUpdate).

    block_attn_res_update(partial_block [T, D] float32 (updated in place), delta [T, D],
                          pseudo_query [D], numerator [T, D], logit_max [T], exp_sum [T], *, eps) -> h [T, D]

partial_block is `Tensor(a!)`: the op writes partial_block + delta into it (GE's reference tensor) and
returns h in delta's dtype. It must share no memory with another argument. Inference-only, like CANN's
op: a call whose result would need a gradient raises instead of silently returning none. The CPU
kernel is the C++ entry's where it is built: a repeated signature whose partial_block is contiguous and
shares no memory with another argument is written in place without entering Python; any other call goes
to ge_plugin/op_common.run_eager_in_place (which copies a non-contiguous partial_block back, or names the
overlap).
"""

from __future__ import annotations

import torch

from attnres_ge.ge_plugin.op_common import define_op, fake_outputs, register_gradient_in_python, run_eager_in_place
from attnres_ge.ge_plugin.ops import BLOCK_ATTN_RES_UPDATE as OP
from attnres_ge.op_proto.op_def import WHERE_EAGER, Checker

NAME = OP.name
SCHEMA = (
    "(Tensor(a!) partial_block, Tensor delta, Tensor pseudo_query, Tensor numerator, Tensor logit_max, "
    "Tensor exp_sum, *, float eps=1e-06) -> Tensor"
)


def _cpu(partial_block, delta, pseudo_query, numerator, logit_max, exp_sum, *, eps=1e-6):
    tensors = (partial_block, delta, pseudo_query, numerator, logit_max, exp_sum)
    (h,) = run_eager_in_place(OP.kernel, tensors, {"eps": eps})
    return h


def _fake(partial_block, delta, pseudo_query, numerator, logit_max, exp_sum, *, eps=1e-6):
    tensors = (partial_block, delta, pseudo_query, numerator, logit_max, exp_sum)
    (h,) = fake_outputs(OP.prototype, tensors, {"eps": eps})
    return h


def refuse_gradients(*arguments) -> None:
    """The op has no derivative (CANN's has none either): a call that would need one (the op's arguments,
    in schema order) fails, naming the inputs that require a gradient."""
    needing = [name for name, value in zip(OP.prototype.input_names(), arguments)
               if isinstance(value, torch.Tensor) and value.requires_grad]
    Checker(OP.op_type, WHERE_EAGER).fail(
        f"the op is inference-only (no gradient), but {', '.join(needing)} "
        f"{'requires' if len(needing) == 1 else 'require'} grad; call it under "
        "torch.no_grad() or on detached tensors")


define_op(OP, SCHEMA, _fake, _cpu)
register_gradient_in_python(NAME, refuse_gradients)
