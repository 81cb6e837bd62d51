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


# The tolerances of docs/contract.md against the float64 reference: dtype -> (rtol, atol).
TOLERANCES = {
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
}


def max_violation(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, *, whole_tensor: bool = False):
    """(max |actual - expected|, how far past the tolerance it is: <= 0 means within).

    Elementwise |a - e| <= atol + rtol * |e|; with `whole_tensor` (the weight
    gradients, sums that cancel) the relative part is taken against max |e|.
    NaN must sit where the reference has NaN; infinities must match exactly.
    """
    rtol, atol = TOLERANCES[dtype]
    actual, expected = actual.double(), expected.double()
    if actual.shape != expected.shape:
        raise ValueError(f"shape {list(actual.shape)} differs from the reference's {list(expected.shape)}")
    if not torch.equal(torch.isnan(actual), torch.isnan(expected)):
        return float("nan"), float("inf")
    finite = torch.isfinite(expected)
    if not torch.equal(actual[~finite].nan_to_num(), expected[~finite].nan_to_num()):
        return float("inf"), float("inf")
    actual, expected = actual[finite], expected[finite]
    if actual.numel() == 0:
        return 0.0, -1.0
    error = (actual - expected).abs()
    scale = expected.abs().max() if whole_tensor else expected.abs()
    return error.max().item(), (error - (atol + rtol * scale)).max().item()
