"""The float64 reference of Block AttnRes, in plain torch ops: the oracle for every test.

Differentiable, so its autograd is the gradient oracle for the backward op.
"""

from __future__ import annotations

import torch


def block_attention_residuals_reference(
    partial_block: torch.Tensor,  # [T, H]
    block_res: torch.Tensor,  # [T, N, H]
    proj_weight: torch.Tensor,  # [1, H] or [H]
    norm_weight: torch.Tensor,  # [H]
    norm_eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hidden_states [T, H], inv_norm [T, N+1], probs [T, N+1]), all float64."""
    values = torch.cat([block_res, partial_block.unsqueeze(1)], dim=1).double()  # [T, N+1, H]
    inv_norm = torch.rsqrt(values.pow(2).mean(dim=-1) + norm_eps)
    score_weight = norm_weight.double() * proj_weight.reshape(-1).double()
    scores = inv_norm * (values * score_weight).sum(dim=-1)
    probs = torch.softmax(scores, dim=-1)
    hidden_states = (probs.unsqueeze(-1) * values).sum(dim=1)
    return hidden_states, inv_norm, probs
