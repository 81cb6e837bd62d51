"""torch op `attnres::block_attn_res_update` (GE type BlockAttnResUpdate): its refusal of gradients; the op
itself is defined from its registry entry (op_common.define_op).

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

from attnres_ge.ge_plugin.op_common import register_inference_only
from attnres_ge.ge_plugin.ops import BLOCK_ATTN_RES_UPDATE as OP

register_inference_only(OP.name, OP.prototype)
