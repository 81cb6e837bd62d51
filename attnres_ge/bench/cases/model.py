"""A tiny random Inkling2 causal LM (transformers' Inkling2ForCausalLM) at (P, T, D, L, B): one no-grad forward
that feeds T tokens after P tokens already in its cache; float32, batch 1. Stock against patched:
  stock    the model as transformers builds it, its depth reads transformers' Inkling2BlockAttentionResidual
  patched  a deep copy of that model after attnres_ge.integrations.transformers.apply: every depth read on
           attnres_ge.fused_attnres, the same weights
P = 0 is a prefill: model(ids, use_cache=True), a fresh cache filled and the logits of every position. P > 0 is
a step on the cache of a P-token prefill (T = 1: a decode step), each provider's model prefilled once at setup.
A step changes its cache (keys and values appended, the convolutions' states updated in place), so each timed
call runs on a copy of the prefilled cache that CachedStep.prepare makes before the call's paired copy, outside
the timed region (the harness runs a call's `prepare` before each call): every call starts from the same
P-token state. A copy inside the call would add its time to both providers and pull their ratio toward 1;
DynamicCache.crop would cut the keys and values back but not undo the convolutions' states.

The model is tiny but not trivial (MODEL_CONFIG): D hidden, L layers, a full-attention layer (its q, k and v
inputs one 3-query read) every 4th from the second, the others sliding-window (a window shorter than the named
prompt), a seal every B layers, 8 routed experts of D, 2 per token; its read queries drawn at random (they start
at zero, where every depth weight is equal). Against a copy of the weights' size; nominal traffic: every float32
parameter once (a decode step reads only its routed experts: a yardstick, not a bound). It needs transformers
with Inkling2 (pyproject's `models` extra); without it both providers are reported unavailable.
report.model_rows gives patched's speedup over stock from the run's medians; no goal is set for it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from attnres_ge.bench.cases.read import _inkling2_module
from attnres_ge.bench.paths import kernel_path

MODEL_PROVIDERS = ("stock", "patched")
MODEL_ROUNDS = 11  # a model's call lasts 10-1000 times a read's: fewer rounds keep the run short
VOCAB = 1024
# The sizes the shape leaves fixed (transformers' Inkling2TextConfig names).
MODEL_CONFIG = dict(vocab_size=VOCAB, unpadded_vocab_size=VOCAB, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=64, swa_num_attention_heads=4, swa_num_key_value_heads=2, swa_head_dim=64,
                    sliding_window_size=64, d_rel=16, rel_extent=128, n_routed_experts=8, num_experts_per_tok=2,
                    eos_token_id=None)
FULL_ATTENTION_EVERY = 4  # layers 1, 5, ...: layer 0 has no attention input read


def tiny_inkling2(shape: tuple[int, int, int, int, int], seed: int = 0) -> torch.nn.Module:
    """The stock Inkling2ForCausalLM at this shape, in eval mode, drawn from `seed` (the caller's random state
    left as it was); RuntimeError saying what to install without transformers' Inkling2."""
    inkling2 = _inkling2_module()
    _, _, hidden, layers, block_size = shape
    layer_types = ["hybrid" if layer % FULL_ATTENTION_EVERY == 1 else "hybrid_sliding" for layer in range(layers)]
    config = inkling2.Inkling2TextConfig(**MODEL_CONFIG, hidden_size=hidden, moe_intermediate_size=hidden,
                                         num_hidden_layers=layers, n_layers_per_attn_res_block=block_size,
                                         layer_types=layer_types)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = inkling2.Inkling2ForCausalLM(config).eval()
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, inkling2.Inkling2BlockAttentionResidual):
                    module.query.normal_()
    return model


def forward_logits(model: torch.nn.Module, ids: torch.Tensor, cache=None) -> torch.Tensor:
    """model's logits for `ids` after `cache` (None: a fresh one, filled by this call), without autograd."""
    with torch.no_grad():
        return model(ids, cache=cache, use_cache=True).logits


class CachedStep:
    """`ids` fed to `model` after a prefill of `past_ids`. prepare() copies the prefilled cache; the call uses
    that copy up, so every call starts from the prefill's state and one without prepare() is refused."""

    def __init__(self, model: torch.nn.Module, past_ids: torch.Tensor, ids: torch.Tensor):
        self.model, self.ids = model, ids
        with torch.no_grad():
            self.prefilled = model(past_ids, use_cache=True).cache
        self.cache = None

    def prepare(self) -> None:
        self.cache = copy.deepcopy(self.prefilled)

    def __call__(self) -> torch.Tensor:
        if self.cache is None:
            raise RuntimeError("bench inkling2-model: CachedStep called without prepare(); its last cache was "
                               "used up by the previous call")
        cache, self.cache = self.cache, None
        return forward_logits(self.model, self.ids, cache)


class ModelCase:
    """The tiny Inkling2 model at one (P, T, D, L, B), its token ids, and each provider's call (module docstring)."""

    directions = ("forward",)
    dtype = torch.float32

    def __init__(self, shape: tuple[int, int, int, int, int], seed: int = 0):
        past, tokens, _, _, _ = shape
        generator = torch.Generator().manual_seed(seed)
        self.shape, self.seed = shape, seed
        self.past_ids = torch.randint(0, VOCAB, (1, past), generator=generator)
        self.ids = torch.randint(0, VOCAB, (1, tokens), generator=generator)
        self._stock = None

    def stock_model(self) -> torch.nn.Module:
        """The stock model, built once: patched is a copy of it."""
        if self._stock is None:
            self._stock = tiny_inkling2(self.shape, self.seed)
        return self._stock

    def copy_elements(self) -> int:
        """The weights' size; 1 without transformers' Inkling2 (no provider is timed then)."""
        try:
            return sum(parameter.numel() for parameter in self.stock_model().parameters())
        except RuntimeError:
            return 1

    def provider_traffic(self, direction: str, provider: str) -> int:
        return self.copy_elements() * self.dtype.itemsize

    def path(self, provider: str) -> str:
        """What runs the patched model's reads (the native kernels' path), for both providers: their rows pair
        up per path."""
        return kernel_path()

    def provider(self, name: str) -> dict[str, Callable[[], torch.Tensor]]:
        if name not in MODEL_PROVIDERS:
            raise ValueError(f"bench inkling2-model: provider must be one of {', '.join(MODEL_PROVIDERS)}, "
                             f"got {name!r}")
        model = self.stock_model()
        if name == "patched":
            from attnres_ge.integrations import transformers as integration

            model = copy.deepcopy(model)
            integration.apply(model)
        return {"forward": self.call(model)}

    def call(self, model: torch.nn.Module) -> Callable[[], torch.Tensor]:
        """A prefill (P = 0) or a step on the cache of a P-token prefill."""
        if self.past_ids.shape[1] == 0:
            return lambda: forward_logits(model, self.ids)
        return CachedStep(model, self.past_ids, self.ids)
