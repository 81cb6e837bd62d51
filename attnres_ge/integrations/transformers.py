"""HF transformers' Inkling2 and Inkling2Loop models with their depth reads on attnres_ge.fused_attnres.

    from attnres_ge.integrations import transformers as attnres_transformers
    swapped = attnres_transformers.apply(model)  # in place; returns how many reads it swapped

Inkling2BlockAttentionResidual (and Inkling2LoopBlockAttentionResidual, its copy in inkling2_loop) reads
the N sealed blocks and the partial block by 1 or 3 learned queries: an unweighted RMSNorm of every source
(its `norm`, eps `norm.variance_epsilon`), softmax over depth of <q, k> * H**-0.5, a mix of the normalised
sources, all in float32. That is fused_attnres(query, sources, None, scale=H**-0.5, normalize_values=True).
`apply` changes each such module's class to a subclass whose forward calls it: the module keeps its
parameters (the same Parameter objects, so the state_dict and an optimizer's references are unchanged), and
isinstance checks against the stock class still hold. A module already swapped is skipped, so a second
`apply` returns 0; subclasses of the stock class are left alone (their forward may differ).
"""

from __future__ import annotations

import torch

from attnres_ge.read import fused_attnres

_FUNCTION = "attnres_ge.integrations.transformers.apply"
# (module, class) of every transformers class computing this read; inkling2_loop is optional.
_STOCK_READS = (
    ("transformers.models.inkling2.modeling_inkling2", "Inkling2BlockAttentionResidual"),
    ("transformers.models.inkling2_loop.modeling_inkling2_loop", "Inkling2LoopBlockAttentionResidual"),
)
_FUSED_PREFIX = "Fused"
_fused_classes: dict[type, type] = {}


class _FusedRead:
    """The forward of the swapped modules; the stock class provides __init__, `query` and `norm`."""

    def forward(self, block_states: torch.Tensor, partial_block_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden = partial_block_states.shape[-1]
        # The stock forward reads in float32; .float() is the tensor itself when it is float32 already, and
        # unbind gives views of block_states: no source is copied.
        sources = (*block_states.float().unbind(-2), partial_block_states.float())
        queries = self.query.float().view(-1, hidden)
        mixed = fused_attnres(queries, sources, None, rms_eps=self.norm.variance_epsilon, scale=hidden**-0.5,
                              normalize_values=True)
        # fused_attnres returns one query's read as [..., H], several as [S, ..., H]; the stock one a tuple.
        return (mixed,) if queries.shape[0] == 1 else mixed.unbind(0)


def _stock_classes() -> tuple[type, ...]:
    """The installed transformers' read classes (ImportError, saying what to install, without Inkling2)."""
    import importlib

    classes = []
    for module_name, class_name in _STOCK_READS:
        try:
            classes.append(getattr(importlib.import_module(module_name), class_name))
        except (ImportError, AttributeError):
            continue
    if not classes:
        raise ImportError(f"{_FUNCTION} needs transformers >= 5.25 (its Inkling2 models): "
                          "pip install attnres-ge[models]")
    return tuple(classes)


def _fused_class(stock: type) -> type:
    """The subclass of `stock` whose forward is _FusedRead's, one per stock class, named at this module's
    level (see __getattr__) so that a swapped model pickles and unpickles."""
    if stock not in _fused_classes:
        name = _FUSED_PREFIX + stock.__name__
        fused = type(name, (_FusedRead, stock), {"__module__": __name__, "__qualname__": name})
        _fused_classes[stock] = fused
    return _fused_classes[stock]


def __getattr__(name: str) -> type:
    """FusedInkling2BlockAttentionResidual and the like, built on first use (unpickling asks for them)."""
    for stock in _stock_classes() if name.startswith(_FUSED_PREFIX) else ():
        if name == _FUSED_PREFIX + stock.__name__:
            return _fused_class(stock)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def apply(model: torch.nn.Module) -> int:
    """Swap, in place, every Inkling2(Loop)BlockAttentionResidual of `model` for the fused read; returns the
    number swapped by this call (0 when all were swapped before). Raises ValueError when `model` has none."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{_FUNCTION}: model must be a torch.nn.Module, got {type(model).__name__}")
    stock_classes = _stock_classes()
    reads = [module for module in model.modules() if type(module) in stock_classes or isinstance(module, _FusedRead)]
    if not reads:
        names = " or ".join(stock.__name__ for stock in stock_classes)
        raise ValueError(f"{_FUNCTION}: {type(model).__name__} has no {names} module; it applies to "
                         "transformers' Inkling2 and Inkling2Loop models")
    stock_reads = [module for module in reads if not isinstance(module, _FusedRead)]
    for module in stock_reads:
        module.__class__ = _fused_class(type(module))
    return len(stock_reads)
