"""`fused_attnres`: the general read with FLA's signature (fla.ops.attnres.fused_attnres), on this package's op.

    o = fused_attnres(query, residuals, rms_weight, output_rms_weight=None, rms_eps=1e-6, scale=1.0,
                      return_weights=False, *, normalize_values=False, output_rms_eps=None)

FLA's semantics for one query ([H], [1, H] or [H, 1]): o [..., H] in the residuals' dtype, the weights
float32 [L, ...]; beyond FLA: a query [S, H] with S > 1 reads S times in the same pass (o [S, ..., H],
weights [S, L, ...]), `rms_weight=None` normalises the keys without a weight, `normalize_values=True` mixes
the normalised sources (Inkling2), `output_rms_eps` gives the output norm its own epsilon (default rms_eps,
as in FLA). docs/contract.md ("The general read") states the math and the rules.

`BlockAttnResReader` is the read as a module (what `ResidualStream.read` takes beside `BlockAttnRes` for several
queries, unweighted keys, normalised values or a logit scale), owning the queries and the key-norm weight.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

import attnres_ge.ge_plugin  # noqa: F401  (defines the torch ops)

_FUNCTION = "fused_attnres"


def _fail(message: str):
    raise ValueError(f"{_FUNCTION}: {message}")


def _queries(query: torch.Tensor, hidden: int) -> tuple[torch.Tensor, bool]:
    """(query as [S, H], whether it was one query given as [H], [1, H] or [H, 1])."""
    shape = tuple(query.shape)
    if shape in ((hidden,), (1, hidden), (hidden, 1)):
        return query.reshape(1, hidden), True
    if query.dim() == 2 and shape[1] == hidden:
        return query, False
    return _fail(f"query must be [H], [1, H], [H, 1] or [S, H] with H = {hidden}, got {list(shape)}")


def _checked_residuals(residuals) -> list[torch.Tensor]:
    if not isinstance(residuals, Sequence) or isinstance(residuals, torch.Tensor) or len(residuals) == 0:
        _fail(f"residuals must be a non-empty list or tuple of tensors [..., H], got {type(residuals).__name__}")
    first = residuals[0]
    for index, residual in enumerate(residuals):
        if not isinstance(residual, torch.Tensor):
            _fail(f"residuals[{index}] must be a tensor, got {type(residual).__name__}")
        if residual.shape != first.shape or residual.dtype != first.dtype:
            _fail(f"residuals[{index}] is {residual.dtype}{list(residual.shape)}; every residual must be "
                  f"{first.dtype}{list(first.shape)}, the first one's dtype and shape")
    if first.dim() == 0:
        _fail("residuals must be [..., H], got 0-d tensors")
    return list(residuals)


def _needs_gradient(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def fused_attnres(
    query: torch.Tensor,
    residuals: Sequence[torch.Tensor],
    rms_weight: torch.Tensor | None,
    output_rms_weight: torch.Tensor | None = None,
    rms_eps: float = 1e-6,
    scale: float = 1.0,
    return_weights: bool = False,
    *,
    normalize_values: bool = False,
    output_rms_eps: float | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The Block AttnRes read of `residuals` (L sources [..., H]) by `query`, with an optional fused output
    RMSNorm; differentiable in every tensor. See the module docstring for shapes."""
    sources = _checked_residuals(residuals)
    lead, hidden = tuple(sources[0].shape[:-1]), sources[0].shape[-1]
    queries, single = _queries(query, hidden)
    gain = output_rms_weight
    if gain is not None and gain.dim() == 2 and single and gain.shape[0] == 1:
        gain = gain.reshape(hidden)
    tensors = (*sources, query, rms_weight, output_rms_weight)
    hidden_states, _, probs, _ = torch.ops.attnres.block_attn_res_read(
        [source.reshape(-1, hidden) for source in sources], queries, rms_weight, gain,
        eps=rms_eps, output_eps=rms_eps if output_rms_eps is None else output_rms_eps, scale=scale,
        normalize_values=normalize_values, save_statistics=return_weights or _needs_gradient(*tensors))
    out = hidden_states.reshape(queries.shape[0], *lead, hidden)
    out = out[0] if single else out
    if not return_weights:
        return out
    weights = probs.transpose(1, 2).reshape(queries.shape[0], len(sources), *lead)
    return out, weights[0] if single else weights


class BlockAttnResReader(nn.Module):
    """A read's parameters: S pseudo-queries `query` [S, H] (zeros: a fresh reader averages its sources) and,
    unless key_norm_weight=False, the key-norm weight `key_norm_weight` [H] (ones).

    forward(residuals, *, output_norm_weight=None, output_norm_eps=None) is `fused_attnres` with them: o [..., H]
    for one query, [S, ..., H] for several. An Inkling2 block residual with three outputs (q, k and v inputs) is
    `BlockAttnResReader(H, queries=3, key_norm_weight=False, normalize_values=True, scale=H**-0.5)`.
    """

    def __init__(self, hidden_size: int, *, queries: int = 1, key_norm_weight: bool = True,
                 normalize_values: bool = False, scale: float = 1.0, norm_eps: float = 1e-6, device=None, dtype=None):
        super().__init__()
        if not isinstance(queries, int) or queries < 1:
            raise ValueError(f"BlockAttnResReader: queries must be a positive int, got {queries!r}")
        factory = {"device": device, "dtype": dtype}
        self.hidden_size, self.queries = hidden_size, queries
        self.normalize_values, self.scale, self.norm_eps = normalize_values, scale, norm_eps
        self.query = nn.Parameter(torch.empty(queries, hidden_size, **factory))
        self.key_norm_weight = nn.Parameter(torch.empty(hidden_size, **factory)) if key_norm_weight else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.query)
        if self.key_norm_weight is not None:
            nn.init.ones_(self.key_norm_weight)

    def forward(self, residuals: Sequence[torch.Tensor], *, output_norm_weight: torch.Tensor | None = None,
                output_norm_eps: float | None = None) -> torch.Tensor:
        """residuals: L tensors [..., H] (the sealed snapshots, then live) -> [..., H] or [S, ..., H]."""
        return fused_attnres(self.query, residuals, self.key_norm_weight, output_norm_weight, self.norm_eps,
                             self.scale, normalize_values=self.normalize_values, output_rms_eps=output_norm_eps)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, queries={self.queries}, key_norm_weight="
                f"{self.key_norm_weight is not None}, normalize_values={self.normalize_values}, scale={self.scale}, "
                f"norm_eps={self.norm_eps}")
