"""torch op `attnres::block_attention_residuals_backward` (GE type BlockAttentionResidualsGrad).

Returns (grad_partial_block [T, H], grad_block_res [T, N, H], grad_proj_weight [1, H],
grad_norm_weight [H]) in the dtype of partial_block, from the forward's saved inv_norm and probs.
"""

from __future__ import annotations

import torch

from ..op_proto import BACKWARD
from .op_common import CPP_ENTRY, LIBRARY, fake_outputs, run_eager

NAME = "block_attention_residuals_backward"
SCHEMA = (
    "(Tensor partial_block, Tensor block_res, Tensor proj_weight, Tensor norm_weight, "
    "Tensor grad_hidden_states, Tensor inv_norm, Tensor probs, *, int valid_block_num=0) "
    "-> (Tensor, Tensor, Tensor, Tensor)"
)

LIBRARY.define(NAME + SCHEMA)


def _cpu(
    partial_block: torch.Tensor,
    block_res: torch.Tensor,
    proj_weight: torch.Tensor,
    norm_weight: torch.Tensor,
    grad_hidden_states: torch.Tensor,
    inv_norm: torch.Tensor,
    probs: torch.Tensor,
    *,
    valid_block_num: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    tensors = (partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm, probs)
    return run_eager(BACKWARD, tensors, {"valid_block_num": valid_block_num})


def _fake(partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm, probs, *,
          valid_block_num=0):
    tensors = (partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm, probs)
    return fake_outputs(BACKWARD, tensors, {"valid_block_num": valid_block_num})


torch.library.register_fake(f"attnres::{NAME}", _fake, lib=LIBRARY)
if not CPP_ENTRY:  # else ge_plugin/csrc registers the CPU kernel in C++
    LIBRARY.impl(NAME, _cpu, "CPU")
