"""`ResidualStream`: the residual stream of a Block AttnRes model, scheduled as the paper and Kimi K3 do.

The stream holds one live tensor and write-once sealed snapshots (docs/using.md, "The residual stream"):

- it starts with live = the embeddings and nothing sealed;
- `read(mixer, *, output_norm=None)` mixes the sealed snapshots and live with `mixer`'s pseudo-query (live
  alone while nothing is sealed: no op call unless there is an output norm or a reader): the live stream is
  always a candidate, nothing else is, so no read sees an all-zero row;
- `seal(readers=None)` appends live to the snapshots and leaves no live tensor;
- `accumulate(out)` makes `out` the live tensor right after a seal and adds it to live otherwise.

A Kimi K3 layer `l` on the stream (block_size layers per block):

    h = stream.read(layer.attn_res, output_norm=layer.attn_norm)   # the attention's normed input
    if l % block_size == 0:
        stream.seal(readers=...)           # l = 0 seals the embeddings: they are block 0
    stream.accumulate(layer.attn(h))
    h = stream.read(layer.mlp_res, output_norm=layer.mlp_norm)
    stream.accumulate(layer.mlp(h))
    ...
    h = stream.read(final_res, output_norm=final_norm)

The read's options:

- `output_norm`: the RMSNorm that the sublayer would apply to the read, fused into it: a `torch.nn.RMSNorm`
  (its weight and eps), a sequence of them (one per query of a several-query mixer, one eps), or a weight
  tensor [H] or [S, H] (eps: the mixer's norm_eps, as FLA's fused_attnres). The read returns the normed input.
- the mixer: a `BlockAttnRes` (one query, weighted keys, raw values: the paper's read) or a
  `BlockAttnResReader` (attnres_ge/read.py) for S queries (the read returns [S, ..., H]), unweighted keys,
  normalised values or a logit scale (Inkling2). A reader's read always runs the general read op (also with
  nothing sealed, where normalised values make it differ from live), and a span naming one among its readers
  does not take the two-phase path.

Three paths compute a read, with the same results within docs/contract.md's tolerances:

- general (`torch.ops.attnres.block_attn_res_read`, through `attnres_ge.fused_attnres` or a reader): every
  read of a stream built with grad mode on, and every read with an output norm or a reader that the
  two-phase path does not take; the sources are a list read where they lie.
- per-layer (inference): `torch.ops.attnres.block_attention_residuals` through `BlockAttnRes`, for the other
  reads without grad.
- two-phase (inference): when a seal names the readers that will read before the next seal, one
  `torch.ops.attnres.block_attn_res_prepare` scores the snapshots for all of them, and each read is one
  `torch.ops.attnres.block_attn_res_update` whose delta is what was accumulated since the previous read; with
  an output norm, `torch.ops.attnres.block_attn_res_update_norm`, the update that stores h normed (one pass).

Storage, and why it differs with grad mode:

- When a gradient may be needed (grad mode on at construction) the snapshots are a Python list of the sealed
  [..., H] tensors, each the live tensor it was (no copy, no `torch.cat`): the general read takes the list as
  it is, and its backward saves these tensors, which every later read shares, so the saved memory is linear in
  the blocks. Nothing is written in place, so no tensor a backward saved changes under it.
- Without grad (`torch.no_grad()`, `torch.inference_mode()`) the snapshots live in one preallocated
  `[..., max_blocks, H]` buffer: a seal writes its slot in place. The two-phase path hands prepare the whole
  buffer and `valid_blocks = n`, so prepare reads the n sealed slots where they are, with no copy; the general
  read gets the slots as a list of views, also without a copy. The per-layer op needs a contiguous
  `[..., n, H]` input, which the view of the first n slots is not while
  n < max_blocks: the first per-layer read after a seal makes that copy once, and the reads until the next
  seal share it (n more slots of memory while the span lasts). The live stream's adds (live + out) go into
  one [..., H] tensor the stream owns, in place, rather than a fresh tensor per add (in eager mode; a compiler
  plans its own memory). `max_blocks=None` lets the buffer double when full (one copy each time); give the
  model's number of seals to allocate once.
- The two-phase path needs float32 snapshots and keeps the live stream in float32 (CANN's update adds each
  delta to a float32 `partial_block` in place), so a stream that may take it stores both in float32; its reads
  return the dtype of the last accumulated output (the update's `h` is in delta's dtype).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

import attnres_ge.ge_plugin  # noqa: F401  (defines the torch ops)
from attnres_ge.api import BlockAttnRes
from attnres_ge.op_kernel.host_memory import empty_planned
from attnres_ge.read import BlockAttnResReader, fused_attnres

_NAME = "ResidualStream"
_PREPARE_MAX_BLOCKS = 64  # block_attn_res_prepare's limit on N (docs/contract.md)
_TWO_PHASE_MAX_HIDDEN = 8192  # the two-phase ops' limit on D
_FIRST_CAPACITY = 8  # slots of a growable buffer (max_blocks=None) before its first doubling


def two_phase_ops_available() -> bool:
    """Whether torch.ops.attnres defines block_attn_res_prepare and block_attn_res_update."""
    return hasattr(torch.ops.attnres, "block_attn_res_prepare") and hasattr(torch.ops.attnres, "block_attn_res_update")


_MIXERS = (BlockAttnRes, BlockAttnResReader)


def _require_mixer(method: str, name: str, value) -> BlockAttnRes | BlockAttnResReader:
    if not isinstance(value, _MIXERS):
        raise TypeError(f"{_NAME}.{method}: {name} must be a BlockAttnRes or a BlockAttnResReader, got "
                        f"{type(value).__name__}")
    return value


class _OutputNorm:
    """An output RMSNorm fused into a read: its weight [H] or [S, H] and eps (None: torch.nn.RMSNorm's default,
    the machine epsilon of the read's dtype)."""

    def __init__(self, weight: torch.Tensor, eps: float | None):
        self.weight, self.eps = weight, eps

    def eps_for(self, dtype: torch.dtype) -> float:
        return torch.finfo(dtype).eps if self.eps is None else self.eps


def _output_norm(value, hidden: int, mixer_eps: float, device: torch.device) -> _OutputNorm | None:
    """read()'s output_norm as a weight and an eps, or a clear error naming what was received."""
    if value is None:
        return None
    if isinstance(value, torch.nn.RMSNorm):
        value = [value]
    if isinstance(value, Sequence) and value and all(isinstance(norm, torch.nn.RMSNorm) for norm in value):
        shapes = {tuple(norm.normalized_shape) for norm in value}
        if shapes != {(hidden,)}:
            raise ValueError(f"{_NAME}.read: output_norm must normalise the hidden size ({hidden},), got "
                             f"normalized_shape {sorted(shapes)}")
        if len({norm.eps for norm in value}) > 1:
            raise ValueError(f"{_NAME}.read: the output_norm modules' eps differ ({[norm.eps for norm in value]}); "
                             "one read takes one eps")
        weights = [torch.ones(hidden, device=device) if norm.weight is None else norm.weight for norm in value]
        return _OutputNorm(weights[0] if len(weights) == 1 else torch.stack(weights), value[0].eps)
    if isinstance(value, torch.Tensor):
        if value.shape[-1:] != (hidden,) or value.dim() > 2:
            raise ValueError(f"{_NAME}.read: output_norm must be a weight [{hidden}] or [S, {hidden}], got "
                             f"{list(value.shape)}")
        return _OutputNorm(value, mixer_eps)
    raise TypeError(f"{_NAME}.read: output_norm must be None, a torch.nn.RMSNorm, a sequence of them or a weight "
                    f"tensor [H], got {type(value).__name__}")


def _pseudo_queries(readers: list[BlockAttnRes]) -> torch.Tensor:
    """The readers' folded queries norm_weight * proj_weight [S, H], float32 products (docs/contract.md, two-phase)."""
    norm_weights = torch.stack([mixer.norm_weight for mixer in readers]).float()  # each [H]
    proj_weights = torch.cat([mixer.proj_weight for mixer in readers]).float()  # each [1, H]
    return norm_weights * proj_weights


def _empty_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised contiguous buffer of the stream (snapshots, the float32 live stream, a contiguous copy of
    the sealed slots); on the CPU in eager mode advised to use huge pages when large, as planned graph buffers
    are, since the stream writes it right away: with 4 KiB pages the faults cost more than the copy."""
    if device.type == "cpu" and not torch.compiler.is_compiling():
        return empty_planned(shape, dtype)
    return torch.empty(shape, dtype=dtype, device=device)


def _own_copy(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous copy of `tensor` in `dtype`, in a buffer of the stream's own (_empty_buffer)."""
    return _empty_buffer(tuple(tensor.shape), dtype, tensor.device).copy_(tensor)


class _OneCandidateRead(torch.autograd.Function):
    """A read with nothing sealed: live itself, and zero gradients for the mixer's parameters.

    A one-candidate softmax is 1 whatever the score, so the parameters' gradient is exactly zero. Handing autograd
    that zero (rather than leaving the parameters out of the graph) keeps them "used" for DDP and FSDP, as the
    paper's code does by running the softmax over the one candidate.
    """

    @staticmethod
    def forward(ctx, live, proj_weight, norm_weight):
        ctx.weight_metas = [(weight.shape, weight.dtype, weight.device) for weight in (proj_weight, norm_weight)]
        return live.view_as(live)

    @staticmethod
    def backward(ctx, grad):
        zeros = [torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.weight_metas]
        return grad, *zeros


class _Span:
    """The two-phase state between two seals: the declared readers and, per reader, the update's state: its
    pseudo-query and its rows of prepare's outputs (split once, not indexed per read: decode reads are short)."""

    def __init__(self, readers: list[BlockAttnRes], pseudo_query, numerator, logit_max, exp_sum):
        self.readers = readers
        self.reader_states = list(zip(*(tensor.unbind(0) for tensor in (pseudo_query, numerator, logit_max, exp_sum)),
                                      strict=True))
        self.next_reader = 0


class ResidualStream:
    """The residual stream a Block AttnRes model's forward drives (see the module docstring for the schedule).

    Args:
        embeddings: [..., H] the token embeddings, the first live tensor.
        max_blocks: how many seals the stream will take (the snapshot buffer's slots on the no-grad paths);
            None grows the buffer as needed. A seal beyond max_blocks raises.
        two_phase: None picks the two-phase ops for a span between seals when no gradient is needed (grad mode
            off at construction), the seal declared its readers and the ops exist; True requires them (a clear
            error when impossible); False uses the per-layer op only.
    """

    def __init__(self, embeddings: torch.Tensor, *, max_blocks: int | None = None, two_phase: bool | None = None):
        if not isinstance(embeddings, torch.Tensor):
            raise TypeError(f"{_NAME}: embeddings must be a torch.Tensor [..., H], got {type(embeddings).__name__}")
        if embeddings.dim() < 1:
            raise ValueError(f"{_NAME}: embeddings must be [..., H] (at least one dim), got a 0-d tensor")
        if two_phase not in (None, True, False):
            raise ValueError(f"{_NAME}: two_phase must be None, True or False, got {two_phase!r}")
        if max_blocks is not None and (not isinstance(max_blocks, int) or max_blocks < 1):
            raise ValueError(f"{_NAME}: max_blocks must be a positive int or None, got {max_blocks!r}")
        self.shape = embeddings.shape
        self.max_blocks = max_blocks
        self.two_phase = two_phase
        self.grad_mode = torch.is_grad_enabled()
        self.uses_two_phase_storage = self._check_two_phase_possible()
        # Reads return the dtype of the last accumulated tensor (the embeddings' at first).
        self.activation_dtype = embeddings.dtype
        self.num_sealed = 0
        self.sealed: list[torch.Tensor] = []  # grad path: the n sealed [..., H] tensors themselves
        self.snapshots: torch.Tensor | None = None  # no-grad paths: [..., capacity, H]
        self.contiguous_sealed: torch.Tensor | None = None  # no-grad per-layer reads: [..., n, H] until a seal
        self.own_live: torch.Tensor | None = None  # no-grad per-layer storage: where live + out is written
        self.span: _Span | None = None
        self.pending: torch.Tensor | None = None  # two-phase: accumulated since the last read, not yet in live
        self.has_live = True  # False from a seal to the next accumulate
        if self.uses_two_phase_storage:
            # The update op writes the live stream in place: it must be this stream's own float32 tensor.
            self.live: torch.Tensor | None = _own_copy(embeddings, torch.float32)
            self.flat_live = self._flat(self.live, self.shape[-1])  # the update's partial_block, [T, H]
        else:
            self.live = embeddings

    @property
    def two_phase_active(self) -> bool:
        """Whether the reads until the next seal go through the two-phase ops."""
        return self.span is not None

    # --- the schedule ------------------------------------------------------------------------------------------

    def read(self, mixer: BlockAttnRes | BlockAttnResReader, *, output_norm=None) -> torch.Tensor:
        """The mix of the sealed snapshots and live by `mixer` -> [..., H] ([S, ..., H] for a reader of S queries),
        normed by `output_norm` when given (see the module docstring)."""
        _require_mixer("read", "mixer", mixer)
        if not self.has_live:
            raise RuntimeError(f"{_NAME}.read: there is no live tensor since the last seal; accumulate a sublayer's "
                               "output before reading (a seal leaves no live tensor, and no read sees a zero row)")
        norm = _output_norm(output_norm, self.shape[-1], mixer.norm_eps, self.live.device)
        if self.span is not None:
            return self._read_two_phase(mixer, norm)
        if norm is None and isinstance(mixer, BlockAttnRes):
            if self.num_sealed == 0:
                return self._read_live_alone(mixer)
            if not self.grad_mode:
                return mixer(self.live, self._sealed_view()).to(self.activation_dtype)
        return self._read_general(mixer, norm)

    def _read_general(self, mixer: BlockAttnRes | BlockAttnResReader, norm: _OutputNorm | None) -> torch.Tensor:
        """One general read op over the sealed snapshots, where they lie, and live."""
        sources = [*self._sealed_sources(), self.live]
        dtype = sources[0].dtype
        if sources[-1].dtype != dtype:  # the per-layer op's rule: the promoted dtype of the blocks and live
            dtype = torch.promote_types(dtype, sources[-1].dtype)
            sources = [source.to(dtype) for source in sources]
        weight, eps = (None, None) if norm is None else (norm.weight, norm.eps_for(self.activation_dtype))
        if isinstance(mixer, BlockAttnResReader):
            hidden = mixer(sources, output_norm_weight=weight, output_norm_eps=eps)
        else:
            hidden = fused_attnres(mixer.proj_weight, sources, mixer.norm_weight, weight, mixer.norm_eps,
                                   output_rms_eps=eps)
        return hidden.to(self.activation_dtype)

    def accumulate(self, out: torch.Tensor) -> None:
        """live = out right after a seal (or at the start), else live + out; `out` is [..., H] like the embeddings."""
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"{_NAME}.accumulate: out must be a torch.Tensor, got {type(out).__name__}")
        if out.shape != self.shape:
            raise ValueError(f"{_NAME}.accumulate: out must have the embeddings' shape {list(self.shape)}, "
                             f"got {list(out.shape)}")
        if self.uses_two_phase_storage and torch.is_grad_enabled() and out.requires_grad:
            raise RuntimeError(f"{_NAME}.accumulate: this stream was built without grad (its live stream is updated "
                               "in place) but out requires grad; build the stream with grad mode on to train")
        self.activation_dtype = out.dtype
        if self.span is not None:
            self._fold_pending()
            self.pending = out  # the next read's delta
        elif self.uses_two_phase_storage:
            self.live.add_(out)  # after a seal live is zero, and 0 + out == out exactly
        elif not self.has_live:
            self.live = out
        elif self.grad_mode or torch.is_grad_enabled() or torch.compiler.is_compiling():
            self.live = self.live + out  # functional: autograd may need both; a compiler plans the memory
        else:
            self.live = self._add_into_own_live(out)
        self.has_live = True

    def _add_into_own_live(self, out: torch.Tensor) -> torch.Tensor:
        """live + out without grad, written into the stream's own [..., H] tensor (in place once live is it): a
        fresh tensor per add would cost more in page faults than the add itself."""
        dtype = torch.result_type(self.live, out)
        if self.own_live is None or self.own_live.dtype != dtype:
            self.own_live = _empty_buffer(tuple(self.shape), dtype, out.device)
        return torch.add(self.live, out, out=self.own_live)

    def seal(self, readers=None) -> None:
        """live becomes a snapshot; `readers` lists, in order, the mixers that read before the next seal, so that
        the two-phase path scores the snapshots once for all of them."""
        if readers is not None:
            readers = [_require_mixer("seal", f"readers[{index}]", mixer) for index, mixer in enumerate(readers)]
        if not self.has_live:
            raise RuntimeError(f"{_NAME}.seal: there is no live tensor to seal (the previous seal took it); "
                               "accumulate a sublayer's output first")
        if self.max_blocks is not None and self.num_sealed >= self.max_blocks:
            raise RuntimeError(f"{_NAME}.seal: seal {self.num_sealed + 1} exceeds max_blocks={self.max_blocks} "
                               "(the snapshot buffer's slots); build the stream with the model's number of seals")
        reason = self._two_phase_refusal(readers, self.num_sealed + 1)
        if reason is not None and self.two_phase:
            raise RuntimeError(f"{_NAME}.seal: two_phase=True but the two-phase path cannot run: {reason}")
        if self.span is not None:
            self._fold_pending()
            self.span = None
        self._append_snapshot()
        self.num_sealed += 1
        if reason is None:
            self.span = self._prepare(readers)

    def _read_live_alone(self, mixer: BlockAttnRes) -> torch.Tensor:
        if self.uses_two_phase_storage:  # no grad here; live is updated in place later: hand out a copy
            return _own_copy(self.live, self.activation_dtype)
        if self.live is self.own_live:  # added to in place later: hand out a copy
            live = _own_copy(self.live, self.activation_dtype)
        else:
            live = self.live.to(self.activation_dtype)
        if torch.is_grad_enabled() and (mixer.proj_weight.requires_grad or mixer.norm_weight.requires_grad):
            return _OneCandidateRead.apply(live, mixer.proj_weight, mixer.norm_weight)
        return live

    # --- storage -------------------------------------------------------------------------------------------------

    def _sealed_sources(self) -> list[torch.Tensor]:
        """The sealed snapshots as the general read takes them: a list of [..., H], where they lie."""
        if self.grad_mode:
            return self.sealed
        return [self.snapshots[..., slot, :] for slot in range(self.num_sealed)]

    def _sealed_view(self) -> torch.Tensor:
        """The sealed snapshots [..., n, H], contiguous, for the per-layer op (no-grad paths): the first n slots
        of the buffer, copied once per seal while they are not contiguous (the op would copy them per read)."""
        if self.contiguous_sealed is None:
            sealed = self.snapshots[..., : self.num_sealed, :]
            if not sealed.is_contiguous():
                sealed = _own_copy(sealed, sealed.dtype)
            self.contiguous_sealed = sealed
        return self.contiguous_sealed

    def _append_snapshot(self) -> None:
        live, self.has_live = self.live, False
        if self.grad_mode:
            # The tensor itself, kept once (see the module docstring); in the first snapshot's dtype.
            self.sealed.append(live.to(self.sealed[0].dtype) if self.sealed else live)
            self.live = None
            return
        self._ensure_capacity(live.dtype, live.device)
        self.snapshots[..., self.num_sealed, :].copy_(live)
        self.contiguous_sealed = None
        if self.uses_two_phase_storage:
            # The same float32 tensor is the next live stream, zeroed: the next delta lands on 0 exactly.
            live.zero_()
        else:
            self.live = None

    def _ensure_capacity(self, dtype: torch.dtype, device: torch.device) -> None:
        if self.snapshots is None:
            self.snapshots = self._snapshot_buffer(self.max_blocks or _FIRST_CAPACITY, dtype, device)
        elif self.num_sealed == self.snapshots.shape[-2]:  # only with max_blocks=None
            grown = self._snapshot_buffer(2 * self.num_sealed, dtype, device)
            grown[..., : self.num_sealed, :].copy_(self.snapshots)
            self.snapshots = grown

    def _snapshot_buffer(self, slots: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """[..., slots, H]. Prepare gets the whole buffer and reads only the sealed slots (valid_blocks), as our
        kernels do; on other devices, whose kernel (CANN's) this project cannot run, the slots not sealed yet
        are zeros rather than whatever the memory held."""
        shape = (*self.shape[:-1], slots, self.shape[-1])
        if device.type == "cpu":
            return _empty_buffer(shape, dtype, device)
        return torch.zeros(shape, dtype=dtype, device=device)

    # --- the two-phase path --------------------------------------------------------------------------------------

    def _check_two_phase_possible(self) -> bool:
        """Whether this stream may take the two-phase path (decides its storage); raises for an impossible True."""
        if self.two_phase is False:
            return False
        reason = None
        if not two_phase_ops_available():
            reason = ("torch.ops.attnres.block_attn_res_prepare/block_attn_res_update are not available in this "
                      "build of attnres_ge")
        elif self.grad_mode:
            reason = ("grad mode is on (the two-phase ops have no backward); build the stream under "
                      "torch.no_grad() or torch.inference_mode()")
        elif self.shape[-1] > _TWO_PHASE_MAX_HIDDEN:
            reason = f"hidden size {self.shape[-1]} exceeds the two-phase ops' limit {_TWO_PHASE_MAX_HIDDEN}"
        if reason is not None and self.two_phase:
            raise RuntimeError(f"{_NAME}: two_phase=True but the two-phase path cannot run: {reason}")
        return reason is None

    def _two_phase_refusal(self, readers, num_sealed: int) -> str | None:
        """Why the span a seal opens (with num_sealed snapshots) cannot run two-phase, or None when it can."""
        if not self.uses_two_phase_storage:
            return "the stream was built with two_phase=False, with grad mode on, or without the ops"
        if readers is None:
            return "seal() was not given the readers of the span (readers=[...])"
        if not readers:  # an empty span: nothing reads before the next seal, so there is nothing to prepare
            return None
        if num_sealed > _PREPARE_MAX_BLOCKS:
            return f"{num_sealed} snapshots exceed block_attn_res_prepare's limit of {_PREPARE_MAX_BLOCKS}"
        readers_of_the_general_read = [index for index, mixer in enumerate(readers)
                                       if not isinstance(mixer, BlockAttnRes)]
        if readers_of_the_general_read:
            return (f"readers{readers_of_the_general_read} are BlockAttnResReader modules, which only the general "
                    "read op computes")
        if len({mixer.norm_eps for mixer in readers}) > 1:
            return "the readers' norm_eps differ (one prepare takes one eps)"
        return None

    def _flat(self, tensor: torch.Tensor, *trailing: int) -> torch.Tensor:
        return tensor if tensor.dim() == 1 + len(trailing) else tensor.reshape(-1, *trailing)

    def _prepare(self, readers: list[BlockAttnRes]) -> _Span:
        if not readers:  # an empty span (seal(readers=[])): no read may come; its outputs fold in at the next seal
            return _Span([], *(torch.empty(0),) * 4)
        hidden, capacity = self.shape[-1], self.snapshots.shape[-2]
        # Prepare reads the first valid_blocks slots of each token and no other: the whole buffer goes in as it
        # is, unless it has more slots than prepare takes (max_blocks > 64), when the sealed ones are copied out.
        slots = capacity if capacity <= _PREPARE_MAX_BLOCKS else self.num_sealed
        block_res = self._flat(self.snapshots, capacity, hidden)[:, :slots]
        valid_blocks = torch.full((1,), self.num_sealed, dtype=torch.uint64, device=block_res.device)
        pseudo_query = _pseudo_queries(readers)
        numerator, logit_max, exp_sum = torch.ops.attnres.block_attn_res_prepare(
            block_res, valid_blocks, pseudo_query, eps=readers[0].norm_eps
        )
        return _Span(readers, pseudo_query, numerator, logit_max, exp_sum)

    def _fold_pending(self) -> None:
        """Adds a delta no read consumed to the float32 live stream."""
        if self.pending is not None:
            self.live.add_(self.pending)
            self.pending = None

    def _read_two_phase(self, mixer: BlockAttnRes, norm: _OutputNorm | None) -> torch.Tensor:
        span, slot = self.span, self.span.next_reader
        if slot >= len(span.readers) or span.readers[slot] is not mixer:
            expected = "no further read" if slot >= len(span.readers) else f"readers[{slot}] ({span.readers[slot]!r})"
            raise ValueError(f"{_NAME}.read: the last seal declared its readers in order; read {slot} expected "
                             f"{expected}, received {mixer!r}")
        span.next_reader += 1
        delta = self.pending
        if delta is None:  # two reads with nothing accumulated between them
            delta = torch.zeros(self.shape, dtype=self.activation_dtype, device=self.live.device)
        self.pending = None
        size = self.shape[-1]
        delta = self._flat(delta, size)
        if norm is None:
            h = torch.ops.attnres.block_attn_res_update(self.flat_live, delta, *span.reader_states[slot],
                                                        eps=mixer.norm_eps)
        else:
            h = torch.ops.attnres.block_attn_res_update_norm(
                self.flat_live, delta, *span.reader_states[slot], norm.weight.reshape(size), eps=mixer.norm_eps,
                output_eps=norm.eps_for(delta.dtype))
        return h if h.dim() == len(self.shape) else h.reshape(self.shape)
