"""HF transformers' Inkling2 and Inkling2Loop models with their depth reads on attnres_ge.fused_attnres.

    from attnres_ge.integrations import transformers as attnres_transformers
    swapped = attnres_transformers.apply(model)  # in place; returns how many reads it swapped

Inkling2BlockAttentionResidual (and Inkling2LoopBlockAttentionResidual, its copy in inkling2_loop) reads
the N sealed blocks and the partial block by 1 or 3 learned queries: an unweighted RMSNorm of every source
(its `norm`, eps `norm.variance_epsilon`), softmax over depth of <q, k> * H**-0.5, a mix of the normalised
sources, all in float32. That is fused_attnres(query, sources, None, scale=H**-0.5, normalize_values=True).
Inkling2LoopMessageAttentionResidual is the same read of the previous loop pass's blocks and output by the
4 queries of a loop layer (`query[loop_layer_idx]`, [4, H]: the messages to its q, k, v and mlp inputs),
returned stacked as [..., 4, H] float32 (a view of fused_attnres's [4, ..., H]).
`apply` changes each such module's class to a subclass whose forward calls it: the module keeps its
parameters (the same Parameter objects, so the state_dict and an optimizer's references are unchanged), and
isinstance checks against the stock class still hold. A module already swapped is skipped, so a second
`apply` returns 0; subclasses of the stock class are left alone (their forward may differ).
"""

from __future__ import annotations

import torch

from attnres_ge.read import fused_attnres

_FUNCTION = "attnres_ge.integrations.transformers.apply"
_FUSED_PREFIX = "Fused"
_fused_classes: dict[type, type] = {}


class _FusedRead:
    """What every swapped module shares; the stock class provides __init__, `query` and `norm`."""

    def _read(self, queries: torch.Tensor, block_states: torch.Tensor,
              partial_block_states: torch.Tensor) -> torch.Tensor:
        """The read of the N blocks [..., N, H] and the partial block [..., H] by queries [S, H] as the stock
        modules do it (unweighted keys with the module norm's eps, normalised values, scale H**-0.5, float32):
        [..., H] for S = 1, [S, ..., H] otherwise."""
        hidden = partial_block_states.shape[-1]
        # The stock forward reads in float32; .float() is the tensor itself when it is float32 already, and
        # unbind gives views of block_states: no source is copied.
        sources = (*block_states.float().unbind(-2), partial_block_states.float())
        return fused_attnres(queries.float(), sources, None, rms_eps=self.norm.variance_epsilon,
                             scale=hidden**-0.5, normalize_values=True)


class _FusedBlockRead(_FusedRead):
    """Inkling2(Loop)BlockAttentionResidual's forward: S reads (query [S, H] or [H]), a tuple of S outputs."""

    def forward(self, block_states: torch.Tensor, partial_block_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        queries = self.query.view(-1, partial_block_states.shape[-1])
        mixed = self._read(queries, block_states, partial_block_states)
        # fused_attnres returns one query's read as [..., H], several as [S, ..., H]; the stock one a tuple.
        return (mixed,) if queries.shape[0] == 1 else mixed.unbind(0)


class _FusedMessageRead(_FusedRead):
    """Inkling2LoopMessageAttentionResidual's forward: loop layer `loop_layer_idx`'s 4 messages (query, key,
    value and mlp inputs; query [loop layers, 4, H]) from the previous pass, stacked as [..., 4, H]."""

    def forward(self, block_states: torch.Tensor, partial_block_states: torch.Tensor,
                loop_layer_idx: int) -> torch.Tensor:
        messages = self._read(self.query[loop_layer_idx], block_states, partial_block_states)
        # The stock module runs an attention whose heads are the leading dims and whose 4 queries are the
        # messages; it returns them at dim -2. movedim is a view: the decoder layer unbinds dim -2 anyway.
        return messages.movedim(0, -2)


# (module, class, forward) of every transformers class computing this read; inkling2_loop is optional.
_STOCK_READS = (
    ("transformers.models.inkling2.modeling_inkling2", "Inkling2BlockAttentionResidual", _FusedBlockRead),
    ("transformers.models.inkling2_loop.modeling_inkling2_loop", "Inkling2LoopBlockAttentionResidual",
     _FusedBlockRead),
    ("transformers.models.inkling2_loop.modeling_inkling2_loop", "Inkling2LoopMessageAttentionResidual",
     _FusedMessageRead),
)


def _stock_reads() -> dict[type, type]:
    """The installed transformers' read classes, each with its fused forward (ImportError, saying what to
    install, without Inkling2)."""
    import importlib

    reads = {}
    for module_name, class_name, forward in _STOCK_READS:
        try:
            reads[getattr(importlib.import_module(module_name), class_name)] = forward
        except (ImportError, AttributeError):
            continue
    if not reads:
        raise ImportError(f"{_FUNCTION} needs transformers >= 5.25 (its Inkling2 models): "
                          "pip install attnres-ge[models]")
    return reads


def _fused_class(stock: type, forward: type) -> type:
    """The subclass of `stock` with `forward` (a _FusedRead), one per stock class, named at this module's
    level (see __getattr__) so that a swapped model pickles and unpickles."""
    if stock not in _fused_classes:
        name = _FUSED_PREFIX + stock.__name__
        fused = type(name, (forward, stock), {"__module__": __name__, "__qualname__": name})
        _fused_classes[stock] = fused
    return _fused_classes[stock]


def __getattr__(name: str) -> type:
    """FusedInkling2BlockAttentionResidual and the like, built on first use (unpickling asks for them)."""
    for stock, forward in _stock_reads().items() if name.startswith(_FUSED_PREFIX) else ():
        if name == _FUSED_PREFIX + stock.__name__:
            return _fused_class(stock, forward)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def apply(model: torch.nn.Module) -> int:
    """Swap, in place, every Inkling2(Loop)BlockAttentionResidual and Inkling2LoopMessageAttentionResidual of
    `model` for the fused read; returns the number swapped by this call (0 when all were swapped before).
    Raises ValueError when `model` has none."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{_FUNCTION}: model must be a torch.nn.Module, got {type(model).__name__}")
    forwards = _stock_reads()
    reads = [module for module in model.modules() if type(module) in forwards or isinstance(module, _FusedRead)]
    if not reads:
        names = " or ".join(stock.__name__ for stock in forwards)
        raise ValueError(f"{_FUNCTION}: {type(model).__name__} has no {names} module; it applies to "
                         "transformers' Inkling2 and Inkling2Loop models")
    stock_reads = [module for module in reads if not isinstance(module, _FusedRead)]
    for module in stock_reads:
        module.__class__ = _fused_class(type(module), forwards[type(module)])
    return len(stock_reads)
