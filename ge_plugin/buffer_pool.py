"""Output and workspace memory of one compiled GE node, kept per input shape and reused only when free.

GE plans a static graph's memory once and reuses it on every run. Reusing is only safe while
nobody still holds the previous run's results (an autograd graph that saved an output, a
caller keeping the loss): overwriting them would silently change values someone holds. So each
buffer is kept as a storage, every run builds fresh tensors over it, and before a run writes
into it the storage's reference count is checked: held by anyone but the pool (a tensor, a
view, a saved activation) -> a fresh storage is allocated instead and kept for next time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import torch

from ..op_proto import TensorMeta

WORKSPACE_DTYPE = torch.uint8


def _only_held_by_pool(storage: torch.UntypedStorage) -> bool:
    """True when no tensor (nor view of one) uses the storage any more; False if that cannot be told."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:
        return False
    return use_count(storage._cdata) == 1


def _nbytes(meta: TensorMeta) -> int:
    numel = 1
    for dim in meta.shape:
        numel *= dim
    return numel * meta.dtype.itemsize


def _tensor_over(storage: torch.UntypedStorage, meta: TensorMeta, device: torch.device) -> torch.Tensor:
    """A contiguous tensor of `meta`'s shape and dtype viewing `storage` from offset 0."""
    strides, step = [], 1
    for dim in reversed(meta.shape):
        strides.insert(0, step)
        step *= max(dim, 1)
    return torch.empty(0, dtype=meta.dtype, device=device).set_(storage, 0, meta.shape, strides)


class BufferPool:
    """Per shape key: one storage per output plus one workspace storage, for the `max_shapes` latest shapes.

    A loop over ever-new token counts keeps at most `max_shapes` sets of buffers alive.
    """

    def __init__(self, max_shapes: int = 4):
        self.max_shapes = max_shapes
        self._storages: OrderedDict[tuple, list[torch.UntypedStorage]] = OrderedDict()
        self._lock = threading.Lock()
        self.allocations = 0  # storages allocated so far (tests watch reuse through it)

    def take(
        self, key: tuple, outputs: Sequence[TensorMeta], workspace_size: int, device: torch.device
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Fresh output tensors [shapes of `outputs`] and a workspace [workspace_size] uint8 for one run."""
        metas = [*outputs, TensorMeta((workspace_size,), WORKSPACE_DTYPE)]
        with self._lock:
            kept = self._storages.setdefault(key, [None] * len(metas))
            self._storages.move_to_end(key)
            if len(self._storages) > self.max_shapes:
                self._storages.popitem(last=False)
            for slot, meta in enumerate(metas):
                kept[slot] = self._reusable_or_new(kept[slot], _nbytes(meta), device)
            tensors = [_tensor_over(storage, meta, device) for storage, meta in zip(kept, metas, strict=True)]
        return tensors[:-1], tensors[-1]

    def _reusable_or_new(self, storage, nbytes: int, device: torch.device) -> torch.UntypedStorage:
        if storage is not None and storage.nbytes() >= nbytes and _only_held_by_pool(storage):
            return storage
        self.allocations += 1
        return torch.UntypedStorage(nbytes, device=device)
