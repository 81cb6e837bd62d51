"""The friendly entry points: a differentiable function and a per-layer nn.Module."""

from __future__ import annotations

import torch
from torch import nn

from . import block_attention_residuals as _ops  # noqa: F401  (registers both torch ops)
from . import block_attention_residuals_grad as _grad_ops  # noqa: F401


def block_attention_residuals(
    partial_block: torch.Tensor,
    block_res: torch.Tensor,
    proj_weight: torch.Tensor,
    norm_weight: torch.Tensor,
    *,
    norm_eps: float = 1e-6,
) -> torch.Tensor:
    """Mix N completed blocks and the partial block with a learned softmax over depth.

    Args:
        partial_block: [T, H] the running sum inside the current block.
        block_res: [T, N, H] the N completed block representations.
        proj_weight: [1, H] or [H] the layer's pseudo-query.
        norm_weight: [H] the RMS-norm weight applied to the keys.
        norm_eps: RMS-norm epsilon, finite and > 0.

    Returns:
        hidden_states [T, H] in the dtype of partial_block; differentiable in all four tensors.
    """
    tensors = (partial_block, block_res, proj_weight, norm_weight)
    need_backward = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    # The overload itself: resolving the packet costs every call several microseconds.
    hidden_states, _, _ = torch.ops.attnres.block_attention_residuals.default(
        partial_block, block_res, proj_weight, norm_weight, -1, norm_eps, need_backward
    )
    return hidden_states


class BlockAttnRes(nn.Module):
    """One layer's Block AttnRes: owns the pseudo-query `proj_weight` [1, H] and key-norm `norm_weight` [H].

    The pseudo-query starts at zero, so a fresh layer averages its inputs uniformly.
    """

    def __init__(self, hidden_size: int, *, norm_eps: float = 1e-6, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.hidden_size = hidden_size
        self.norm_eps = norm_eps
        self.proj_weight = nn.Parameter(torch.zeros(1, hidden_size, **factory))
        self.norm_weight = nn.Parameter(torch.ones(hidden_size, **factory))

    def forward(self, partial_block: torch.Tensor, block_res: torch.Tensor) -> torch.Tensor:
        """partial_block [T, H], block_res [T, N, H] -> hidden_states [T, H]."""
        return block_attention_residuals(
            partial_block, block_res, self.proj_weight, self.norm_weight, norm_eps=self.norm_eps
        )

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, norm_eps={self.norm_eps}"
