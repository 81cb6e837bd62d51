"""The general read (block_attn_res_read, called as attnres_ge.fused_attnres) at (T, N, H, S), forward, each
--dtypes, against the code it replaces. L = N + 1 sources: N blocks `block_states` [T, N, H], read in place
(block_states.unbind(-2): views with a row stride of N H), and the partial block [T, H]; S queries.

Inkling2's read (no key weight, normalised values, logits scaled by H**-0.5), at S = 1 (an MLP input) and
S = 3 (a full-attention layer's q, k and v inputs):
  op           fused_attnres(query [S, H], [*block_states.unbind(-2), partial], None, scale=H**-0.5,
               normalize_values=True)
  hf-eager     transformers' own Inkling2BlockAttentionResidual (num_queries=S, its query drawn at random) on
               block_states [1, T, N, H] and partial [1, T, H], the same storage; attention through sdpa, what
               a model loaded with transformers' defaults runs; its outputs are float32 whatever the inputs
  hf-inductor  torch.compile (inductor, the defaults) of that module
FLA's interface (one query [H], a key-norm weight, raw values, an output RMSNorm weight), at S = 1 only (FLA
reads one query), on L separate sources [T, H] (FLA's list of residuals):
  fused        fused_attnres(query, sources, rms_weight, output_rms_weight)
  unfused      fused_attnres(query, sources, rms_weight), then F.rms_norm in float32 and the cast back to the
               sources' dtype, as FLA's naive_attnres applies its output norm
All run without autograd (an inference read: no statistics kept), against a copy of the sources' bytes, over
the read's minimum traffic: the L sources read and the S outputs written once, in the sources' dtype (the same
for every provider: it is the computation's, not a provider's). The hf providers need transformers with
Inkling2 (pyproject's `models` extra); without it they are reported unavailable and the others are timed.
report.read_goal_rows judges the ratios against READ_GOALS there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from attnres_ge.bench.cases.common import NORM_EPS
from attnres_ge.bench.paths import kernel_path

INKLING2_PROVIDERS = ("op", "hf-eager", "hf-inductor")
FLA_PROVIDERS = ("fused", "unfused")
READ_PROVIDERS = (*INKLING2_PROVIDERS, *FLA_PROVIDERS)
OUR_READ_PROVIDERS = ("op", *FLA_PROVIDERS)  # those that run this package's read


def read_traffic(tokens: int, blocks: int, hidden: int, queries: int, element_size: int) -> int:
    """The read's minimum traffic in bytes: N + 1 sources read, S outputs written, in the sources' dtype."""
    return (blocks + 1 + queries) * tokens * hidden * element_size


def timed_providers(shape: tuple[int, int, int, int], providers) -> list[str]:
    """The `providers` a read shape times: FLA's interface only with one query."""
    queries = shape[3]
    return [name for name in providers if name in READ_PROVIDERS and (queries == 1 or name not in FLA_PROVIDERS)]


def _inkling2_module():
    """transformers' Inkling2 modelling module; a RuntimeError saying what to install when it is missing."""
    try:
        from transformers.models.inkling2 import modeling_inkling2
    except ImportError as error:
        raise RuntimeError("needs transformers with Inkling2 (>= 5.25; pip install 'attnres-ge[models]'), "
                           f"not timed: {error}") from error
    return modeling_inkling2


class ReadCase:
    """The read's inputs at one (T, N, H, S) and dtype, and each provider's forward (module docstring)."""

    directions = ("forward",)

    def __init__(self, shape: tuple[int, int, int, int], dtype: torch.dtype, seed: int = 0):
        tokens, blocks, hidden, queries = shape
        generator = torch.Generator().manual_seed(seed)
        self.shape, self.dtype = shape, dtype
        self.block_states = torch.randn(tokens, blocks, hidden, generator=generator).to(dtype)
        self.partial = torch.randn(tokens, hidden, generator=generator).to(dtype)
        self.query = torch.randn(queries, hidden, generator=generator)  # float32, as Inkling2's parameter
        self.generator = generator  # FLA's inputs are drawn when its providers are set up

    def copy_elements(self) -> int:
        tokens, blocks, hidden, _ = self.shape
        return tokens * (blocks + 1) * hidden  # the sources' size

    def provider_traffic(self, direction: str, provider: str) -> int:
        return read_traffic(*self.shape, self.dtype.itemsize)

    def path(self, provider: str) -> str:
        return kernel_path()

    def provider(self, name: str) -> dict[str, Callable[[], object]]:
        return {"forward": getattr(self, "_" + name.replace("-", "_"))()}

    def sources(self) -> list[torch.Tensor]:
        """The N blocks, views into block_states, then the partial block."""
        return [*self.block_states.unbind(-2), self.partial]

    def _op(self):
        from attnres_ge.read import fused_attnres

        hidden = self.shape[2]
        return _no_grad(functools.partial(fused_attnres, self.query, self.sources(), None, scale=hidden**-0.5,
                                          normalize_values=True))

    def inkling2_module(self) -> torch.nn.Module:
        """Inkling2BlockAttentionResidual at this shape, its query this case's."""
        inkling2 = _inkling2_module()
        config = inkling2.Inkling2TextConfig(hidden_size=self.shape[2])
        config._attn_implementation = "sdpa"
        module = inkling2.Inkling2BlockAttentionResidual(config, num_queries=self.shape[3])
        with torch.no_grad():
            module.query.copy_(self.query.reshape(module.query.shape))
        return module

    def _hf_call(self, module: Callable) -> Callable[[], object]:
        return _no_grad(functools.partial(module, self.block_states.unsqueeze(0), self.partial.unsqueeze(0)))

    def _hf_eager(self):
        return self._hf_call(self.inkling2_module())

    def _hf_inductor(self):
        module = self.inkling2_module()
        torch._dynamo.reset()  # a fresh cache per case: dynamo's recompile limit would silently fall back to eager
        return self._hf_call(torch.compile(module))

    def fla_inputs(self) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """(query [H], L sources [T, H], rms_weight [H], output_rms_weight [H]) in the case's dtype, drawn once."""
        if not hasattr(self, "_fla_inputs"):
            tokens, blocks, hidden, _ = self.shape
            draw = functools.partial(torch.randn, generator=self.generator)
            self._fla_inputs = ((draw(hidden) / hidden**0.5).to(self.dtype),
                                [draw(tokens, hidden).to(self.dtype) for _ in range(blocks + 1)],
                                (1 + 0.2 * draw(hidden)).to(self.dtype), (1 + 0.2 * draw(hidden)).to(self.dtype))
        return self._fla_inputs

    def _fused(self):
        from attnres_ge.read import fused_attnres

        return _no_grad(functools.partial(fused_attnres, *self.fla_inputs(), NORM_EPS))

    def _unfused(self):
        from attnres_ge.read import fused_attnres

        query, sources, rms_weight, output_rms_weight = self.fla_inputs()

        def read_then_norm():
            mixed = fused_attnres(query, sources, rms_weight, None, NORM_EPS)
            hidden = mixed.shape[-1]
            return F.rms_norm(mixed.float(), (hidden,), output_rms_weight.float(), NORM_EPS).to(mixed.dtype)

        return _no_grad(read_then_norm)


def _no_grad(call: Callable[[], object]) -> Callable[[], object]:
    """`call` run under torch.no_grad: an inference read, with no autograd graph and no statistics kept."""
    def run():
        with torch.no_grad():
            return call()
    return run
