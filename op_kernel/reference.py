"""The float64 reference of Block AttnRes, in plain torch ops: the oracle for every test.

Differentiable, so its autograd is the gradient oracle for the backward op.
"""

from __future__ import annotations

import torch


def value_rows(partial_block: torch.Tensor, block_res: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[T, N+1, H] in `dtype`: the N blocks, then the partial block."""
    return torch.cat([block_res, partial_block.unsqueeze(-2)], dim=-2).to(dtype)


def forward_math(partial_block, block_res, proj_weight, norm_weight, norm_eps: float, dtype: torch.dtype):
    """The forward's formulas (docs/contract.md) in differentiable torch ops, computed in `dtype`:
    (hidden_states [T, H], inv_norm [T, N+1], probs [T, N+1])."""
    values = value_rows(partial_block, block_res, dtype)
    inv_norm = torch.rsqrt(values.pow(2).mean(dim=-1) + norm_eps)
    score_weight = norm_weight.to(dtype) * proj_weight.reshape(-1).to(dtype)
    scores = inv_norm * (values * score_weight).sum(dim=-1)
    probs = torch.softmax(scores, dim=-1)
    hidden_states = (probs.unsqueeze(-1) * values).sum(dim=-2)
    return hidden_states, inv_norm, probs


def backward_math(partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm, probs,
                  dtype: torch.dtype):
    """The backward op's formulas (docs/contract.md) in differentiable torch ops, computed in `dtype`, with
    `inv_norm` and `probs` used as given: (grad_partial_block [T, H], grad_block_res [T, N, H],
    grad_proj_weight [H], grad_norm_weight [H])."""
    values = value_rows(partial_block, block_res, dtype)
    go = grad_hidden_states.to(dtype).unsqueeze(-2)  # [T, 1, H]
    p, r = probs.to(dtype), inv_norm.to(dtype)  # [T, N+1]
    proj, norm = proj_weight.reshape(-1).to(dtype), norm_weight.to(dtype)
    score_weight = norm * proj
    g = (go * values).sum(dim=-1)
    gs = p * (g - (p * g).sum(dim=-1, keepdim=True))
    gsw = ((gs * r).unsqueeze(-1) * values).sum(dim=(-3, -2))
    gr = gs * (values * score_weight).sum(dim=-1)
    a, c = gs * r, gr * r**3 / values.shape[-1]
    grads = go * p.unsqueeze(-1) + a.unsqueeze(-1) * score_weight - c.unsqueeze(-1) * values
    return grads[..., -1, :], grads[..., :-1, :], gsw * norm, gsw * proj


def block_attention_residuals_reference(
    partial_block: torch.Tensor,  # [T, H]
    block_res: torch.Tensor,  # [T, N, H]
    proj_weight: torch.Tensor,  # [1, H] or [H]
    norm_weight: torch.Tensor,  # [H]
    norm_eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hidden_states [T, H], inv_norm [T, N+1], probs [T, N+1]), all float64."""
    return forward_math(partial_block, block_res, proj_weight, norm_weight, norm_eps, torch.float64)


def block_attention_residuals_grad_reference(
    partial_block: torch.Tensor,  # [T, H]
    block_res: torch.Tensor,  # [T, N, H]
    proj_weight: torch.Tensor,  # [1, H] or [H]
    norm_weight: torch.Tensor,  # [H]
    grad_hidden_states: torch.Tensor,  # [T, H]
    inv_norm: torch.Tensor,  # [T, N+1]
    probs: torch.Tensor,  # [T, N+1]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward op's formulas in float64, with `inv_norm` and `probs` used as given.

    The oracle of the backward op on its own: the op receives float32 statistics, so its reference
    starts from those same rounded values rather than from the exact ones autograd would use.
    (grad_partial_block [T, H], grad_block_res [T, N, H], grad_proj_weight [H], grad_norm_weight [H]),
    all float64.
    """
    return backward_math(partial_block, block_res, proj_weight, norm_weight, grad_hidden_states, inv_norm, probs,
                         torch.float64)


def gradient_term_scale(
    partial_block: torch.Tensor,  # [T, H]
    block_res: torch.Tensor,  # [T, N, H]
    proj_weight: torch.Tensor,  # [1, H] or [H]
    norm_weight: torch.Tensor,  # [H]
    grad_hidden_states: torch.Tensor,  # [T, H]
    inv_norm: torch.Tensor,  # [T, N+1]
    probs: torch.Tensor,  # [T, N+1]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The size S of the terms of the input gradients before they cancel: (partial [T, H], blocks [T, N, H]).

    Input gradients computed through float32 statistics (forward, then backward: docs/contract.md) get
    STATISTICS_ALLOWANCE * S on top of the contract's tolerance. To first order, a relative error u in
    every p and r moves gs = p (g - sum_j p_j g_j) by at most u * G with
    G = p * (|g - sum_j p_j g_j| + sum_j p_j |g_j|), and gv by at most 3u * S with
        S = |go| p + G r |w| + G |sum_h w v| r^3 / H |v|,
    which can be far larger than |gv| itself when the terms cancel.
    """
    values = value_rows(partial_block, block_res, torch.float64)  # [T, N+1, H]
    go = grad_hidden_states.double().unsqueeze(1)
    p, r = probs.double(), inv_norm.double()
    score_weight = norm_weight.double() * proj_weight.reshape(-1).double()
    g = (go * values).sum(dim=-1)
    spread = (g - (p * g).sum(dim=-1, keepdim=True)).abs() + (p * g.abs()).sum(dim=-1, keepdim=True)
    big_g = p * spread
    wv = (values * score_weight).sum(dim=-1)
    scale = (go.abs() * p.unsqueeze(-1) + (big_g * r).unsqueeze(-1) * score_weight.abs()
             + (big_g * wv.abs() * r**3 / values.shape[-1]).unsqueeze(-1) * values.abs())
    blocks = block_res.shape[1]
    return scale[:, blocks], scale[:, :blocks]


# Allowance per unit of gradient_term_scale for gradients computed through the forward's float32
# statistics: 3u from their rounding (u = 2^-24) and u more for the forward's own error and second-order
# terms (measured: at most 3.4u at H = 4096-16384, unit-scale weights).
STATISTICS_ALLOWANCE = 4 * 2.0**-24

# The tolerances of docs/contract.md against the float64 reference: dtype -> (rtol, atol).
TOLERANCES = {
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
}


def max_violation(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, *, whole_tensor: bool = False,
                  allowance: torch.Tensor | None = None):
    """(max |actual - expected|, how far past the tolerance it is: <= 0 means within).

    Elementwise |a - e| <= atol + rtol * |e|; with `whole_tensor` (the weight
    gradients, sums that cancel) the relative part is taken against max |e|.
    `allowance` (same shape as e, or None) is added to the bound elementwise
    (composed gradients: STATISTICS_ALLOWANCE * gradient_term_scale).
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
    extra = 0.0 if allowance is None else allowance.double()[finite]
    actual, expected = actual[finite], expected[finite]
    if actual.numel() == 0:
        return 0.0, -1.0
    error = (actual - expected).abs()
    scale = expected.abs().max() if whole_tensor else expected.abs()
    return error.max().item(), (error - (atol + rtol * scale + extra)).max().item()


# ---------------------------------------------------------------------------------------- the two-phase ops

# logit_max of the empty state (no sealed snapshot): the lowest finite float32, so that the update's
# alpha = exp(logit_max - m) is 0 without an infinity in the arithmetic.
LOWEST_FLOAT32 = -3.4028234663852886e38


def valid_count(valid_blocks: torch.Tensor, blocks: int) -> int:
    """Nv = min(valid_blocks[0], N): the sealed snapshots prepare reads (valid_blocks [1] uint64)."""
    return min(int(valid_blocks.reshape(-1)[0].item()), blocks)


def prepare_math(block_res, valid: int, pseudo_query, eps: float, dtype: torch.dtype):
    """BlockAttnResPrepare's formulas (docs/contract.md) on the first `valid` snapshots, in differentiable
    torch ops computed in `dtype`: (numerator [S, T, D], logit_max [S, T], exp_sum [S, T])."""
    tokens, _, hidden = block_res.shape
    queries = pseudo_query.shape[0]
    if valid == 0:  # the empty state
        return (block_res.new_zeros((queries, tokens, hidden), dtype=dtype),
                block_res.new_full((queries, tokens), LOWEST_FLOAT32, dtype=dtype),
                block_res.new_zeros((queries, tokens), dtype=dtype))
    rows = block_res[:, :valid].to(dtype)  # [T, Nv, D]
    norm = torch.sqrt(rows.pow(2).mean(dim=-1) + eps)  # [T, Nv]
    logits = torch.einsum("sd,tnd->stn", pseudo_query.to(dtype), rows) / norm  # [S, T, Nv]
    logit_max = logits.amax(dim=-1)
    weights = torch.exp(logits - logit_max.unsqueeze(-1))
    return torch.einsum("stn,tnd->std", weights, rows), logit_max, weights.sum(dim=-1)


def update_math(partial_block, delta, pseudo_query, numerator, logit_max, exp_sum, eps: float, dtype: torch.dtype):
    """BlockAttnResUpdate's formulas (docs/contract.md) in torch ops computed in `dtype`:
    (p = partial_block + delta [T, D], the value stored back into partial_block; h [T, D])."""
    p = partial_block.to(dtype) + delta.to(dtype)
    columns = max(p.shape[-1], 1)  # D = 0: no column, so nothing to normalise (and no 0 / 0)
    norm = torch.sqrt(p.pow(2).sum(dim=-1) / columns + eps)  # [T]
    score = (p * pseudo_query.to(dtype)).sum(dim=-1) / norm
    prior = logit_max.to(dtype)
    top = torch.maximum(prior, score)
    alpha, beta = torch.exp(prior - top), torch.exp(score - top)  # [T]
    mixed = numerator.to(dtype) * alpha.unsqueeze(-1) + p * beta.unsqueeze(-1)
    return p, mixed / (exp_sum.to(dtype) * alpha + beta).unsqueeze(-1)


def block_attn_res_prepare_reference(
    block_res: torch.Tensor,  # [T, N, D]
    valid_blocks: torch.Tensor,  # [1] uint64
    pseudo_query: torch.Tensor,  # [S, D]
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(numerator [S, T, D], logit_max [S, T], exp_sum [S, T]), all float64."""
    valid = valid_count(valid_blocks, block_res.shape[1])
    return prepare_math(block_res, valid, pseudo_query, eps, torch.float64)


def block_attn_res_update_reference(
    partial_block: torch.Tensor,  # [T, D]
    delta: torch.Tensor,  # [T, D]
    pseudo_query: torch.Tensor,  # [D]
    numerator: torch.Tensor,  # [T, D]
    logit_max: torch.Tensor,  # [T]
    exp_sum: torch.Tensor,  # [T]
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the updated partial_block [T, D], h [T, D]), both float64; `partial_block` itself is not changed."""
    return update_math(partial_block, delta, pseudo_query, numerator, logit_max, exp_sum, eps, torch.float64)


# ------------------------------------------------------------------------------------ the general read

def general_read_reference(
    query: torch.Tensor,  # [S, H]
    sources: list[torch.Tensor] | tuple[torch.Tensor, ...],  # L tensors [..., H], L = N+1 >= 1
    key_norm_weight: torch.Tensor | None = None,  # [H]; None: unweighted RMS norm
    output_norm_weight: torch.Tensor | None = None,  # [H] or [S, H]; None: no output norm
    eps: float = 1e-6,
    scale: float = 1.0,
    normalize_values: bool = False,
    return_weights: bool = False,
    output_eps: float | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The general read of Block AttnRes, in float64: S queries over the same L sources, per token.

    With v_i [H] source i of a token (i < L), q_s [H] query s (s < S), w the key-norm weight
    (1 when None) and g the output-norm weight (of query s when given as [S, H]):
        r_i   = 1 / sqrt(mean_h v_i^2 + eps)
        k_i   = w * v_i * r_i                                  (RMSNorm, weight w)
        p_s,i = softmax_i(scale * <q_s, k_i>)
        o_s   = sum_i p_s,i u_i,   u_i = v_i * r_i if normalize_values else v_i
        o_s   = g * o_s / sqrt(mean_h o_s^2 + output_eps)       (only with output_norm_weight)
    The values are mixed raw (the paper, FLA's naive_attnres/fused_attnres) or normalised without w
    (Inkling2, whose keys carry no weight and whose scale is H**-0.5). output_eps None: eps, as in FLA.
    The op computes in float32 and rounds o once to the sources' dtype; this oracle returns float64.

    Returns o [S, ..., H] and, with `return_weights`, also p [S, L, ...], both float64.
    """
    if query.dim() != 2:
        raise ValueError(f"query must be [S, H], got {list(query.shape)}")
    if len(sources) == 0:
        raise ValueError("sources must hold at least one tensor")
    shape = sources[0].shape
    if any(source.shape != shape for source in sources):
        raise ValueError(f"every source must have the shape {list(shape)}")
    hidden = shape[-1]
    if query.shape[-1] != hidden:
        raise ValueError(f"query's last dimension is {query.shape[-1]}, the sources' is {hidden}")
    rows = torch.stack([source.to(torch.float64) for source in sources])  # [L, ..., H]
    inv_rms = torch.rsqrt(rows.pow(2).mean(dim=-1, keepdim=True) + eps)  # [L, ..., 1]
    normed = rows * inv_rms
    keys = normed if key_norm_weight is None else normed * key_norm_weight.to(torch.float64).reshape(hidden)
    q = query.to(torch.float64)  # [S, H]
    logits = scale * torch.einsum("sh,l...h->sl...", q, keys)  # [S, L, ...]
    weights = torch.softmax(logits, dim=1)
    values = normed if normalize_values else rows
    out = torch.einsum("sl...,l...h->s...h", weights, values)  # [S, ..., H]
    if output_norm_weight is not None:
        gain = output_norm_weight.to(torch.float64)
        if gain.dim() == 2:  # one weight per query: [S, 1, ..., 1, H]
            gain = gain.reshape(gain.shape[0], *([1] * (len(shape) - 1)), hidden)
        out_eps = eps if output_eps is None else output_eps
        out = gain * out * torch.rsqrt(out.pow(2).mean(dim=-1, keepdim=True) + out_eps)
    return (out, weights) if return_weights else out
