"""Kernels of BlockAttnResUpdateNorm (op_proto/block_attn_res_update_norm.py): BlockAttnResUpdate's, on its plan
for the same inputs (its tiling, made and kept per signature by the host runtime), with h normed before it is
stored.

The native kernel is the update's (op_kernel/csrc/update_kernel.h) given the norm's weight: h stays in a float32
row of the task's and is stored normed, one pass over the rows. The Python one, the oracle, runs the update's
Python kernel into a float64 h, then the norm in float64, rounded once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from attnres_ge.op_kernel import active_implementation, native_module
from attnres_ge.op_kernel.block_attn_res_update import KERNEL as UPDATE_KERNEL
from attnres_ge.op_kernel.block_attn_res_update import block_attn_res_update_kernel
from attnres_ge.op_kernel.kernel_spec import TensorKernel
from attnres_ge.op_kernel.launcher import default_runtime
from attnres_ge.op_proto.block_attn_res_update_norm import PROTOTYPE
from attnres_ge.op_proto.op_def import WHERE_EAGER, float32


def python_update_norm(inputs: Sequence[torch.Tensor], partial_out: torch.Tensor, h: torch.Tensor,
                       output_norm_weight: torch.Tensor, output_eps: float, tiling) -> None:
    mixed = torch.empty(h.shape, dtype=torch.float64)
    block_attn_res_update_kernel(*inputs, partial_out, mixed, None, tiling)
    inv_rms = torch.rsqrt(mixed.pow(2).mean(dim=-1, keepdim=True) + output_eps)
    h.copy_(mixed * inv_rms * output_norm_weight.double())


def run_update_norm(inputs: Sequence, attrs: dict, outputs: Sequence, allocate: Callable) -> list:
    """BlockAttnResUpdateNorm on validated inputs (the update's six, then output_norm_weight) with bound attributes
    and InferShape's output metas: [partial_block (the input, updated in place), h]."""
    partial_block, *others, output_norm_weight = inputs
    h = allocate(outputs[1].shape, outputs[1].dtype)
    if h.numel() == 0:  # no token or no column: nothing to add, nothing to write
        return [partial_block, h]
    update_inputs = [partial_block.contiguous(), *(tensor.contiguous() for tensor in others)]
    work = update_inputs[0]  # partial_block itself when contiguous: the kernel writes p where it reads it
    plan = default_runtime().plan(UPDATE_KERNEL, update_inputs, {"eps": attrs["eps"]}, WHERE_EAGER)
    weight = output_norm_weight.to(torch.float32).contiguous()
    output_eps = float32(attrs["output_eps"])
    if active_implementation() == "native":
        native_module().update_norm(plan.launch(), update_inputs, [work, h], weight, output_eps)
    else:
        python_update_norm(update_inputs, work, h, weight, output_eps, plan.tiling.data)
    if work is not partial_block:
        partial_block.copy_(work)
    return [partial_block, h]


UPDATE_NORM_KERNEL = TensorKernel(PROTOTYPE, run_update_norm)
