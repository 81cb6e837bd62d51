"""Building blocks of the Python kernels: fixed-order sums and an exp with no hidden order.

The Python kernels accumulate in float64. A product of two float32 values is
exact in float64, and every sum here runs in index order (a cumulative sum, which
torch evaluates sequentially along its dimension), carried across tiles and
loops. Elementwise float64 arithmetic is exact IEEE rounding whatever the
vector width, so a kernel built from these pieces gives the same bits for every
core count, loop size and hidden tile that Tiling can choose.
"""

from __future__ import annotations

import math

import torch

_LN2_HI = 6.93147180369123816490e-01  # ln 2 split so that k * _LN2_HI is exact
_LN2_LO = 1.90821492927058770002e-10
_EXP_FLOOR = -120.0  # exp below this is 0 once rounded to float32
_EXP_TERMS = 14  # Taylor terms for |r| <= ln2 / 2: error below 1e-17


def core_range(core: int, former_num: int, former_len: int, tail_len: int) -> tuple[int, int]:
    """[start, stop) of the items dealt to `core` (the first `former_num` cores take `former_len`)."""
    if core < former_num:
        start = core * former_len
        return start, start + former_len
    start = former_num * former_len + (core - former_num) * tail_len
    return start, start + tail_len


def sequential_sum(x: torch.Tensor, dim: int, start: torch.Tensor | None = None) -> torch.Tensor:
    """Sum of x along `dim` in index order, beginning from `start` (same shape as the result)."""
    if start is not None:
        x = torch.cat([start.unsqueeze(dim), x], dim=dim)
    if x.shape[dim] == 0:
        return x.sum(dim)  # zeros; nothing to order
    return x.cumsum(dim).select(dim, -1)


def exp_nonpositive(x: torch.Tensor) -> torch.Tensor:
    """exp(x) for float64 x <= 0 (NaN propagates) from exact elementwise steps only.

    torch.exp may take a vector or a scalar code path depending on where an
    element sits in memory, and the two can differ in the last bit. Here
    exp(x) = 2^k * exp(r) with r = x - k ln2, exp(r) a Taylor polynomial by
    Horner's rule and 2^k built from its bits.
    """
    nan = torch.isnan(x)
    x = torch.clamp(torch.nan_to_num(x, nan=0.0), min=_EXP_FLOOR)
    k = torch.round(x / math.log(2.0))
    r = (x - k * _LN2_HI) - k * _LN2_LO
    poly = torch.ones_like(r)
    for n in range(_EXP_TERMS, 0, -1):
        poly = poly * (r / n) + 1.0
    two_to_k = ((k.to(torch.int64) + 1023) << 52).view(torch.float64)
    return torch.where(nan, torch.full_like(x, math.nan), poly * two_to_k)


def softmax_rows(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim of float64 [B, R] scores, summed in row order."""
    shifted = scores - scores.amax(dim=-1, keepdim=True)
    exps = exp_nonpositive(shifted)
    return exps / sequential_sum(exps, dim=-1).unsqueeze(-1)


def hidden_tiles(h_tile: int, h_tile_num: int, h_last_tile: int):
    """(start, stop) of each hidden tile in order."""
    for tile in range(h_tile_num):
        start = tile * h_tile
        yield start, start + (h_last_tile if tile == h_tile_num - 1 else h_tile)


def value_rows(partial_block: torch.Tensor, block_res: torch.Tensor, t0: int, t1: int, h0: int, h1: int):
    """v[t0:t1, :, h0:h1] in float64: the N block rows then the partial block, [B, N+1, h]."""
    rows = torch.cat([block_res[t0:t1, :, h0:h1], partial_block[t0:t1, h0:h1].unsqueeze(1)], dim=1)
    return rows.to(torch.float64)
