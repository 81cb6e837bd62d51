"""Output and workspace memory of one compiled GE node, kept per plan (input shape) and reused only when free.

GE plans a static graph's memory once and reuses it on every run. Reusing is only safe while
nobody can still reach the previous run's results (an autograd graph that saved an output, a
caller keeping the loss, its storage, or a shared-memory copy of it sent to another process):
overwriting them would silently change values someone holds. So each buffer is a slot: a
storage and one tensor of the planned shape over it, both kept by the pool. A run hands out a
new tensor sharing the slot's storage (detach: one cheap op), so anyone who still holds a run's
result, or a view of it, raises the storage's use count.

The reuse rule (docs/memory.md; the C++ GraphNode's Slot applies the same): a slot is written
again only when it is provably free, else it gets a fresh storage (kept for next time):
- nothing but the slot references its storage: the C++ use count is the slot's own, and the
  pool's storage object (the very object `out.untyped_storage()` hands back) has no other
  reference and no weak reference;
- the storage still owns the allocation the slot made: same data pointer and size, not moved
  to shared memory (share_memory_(), a torch.multiprocessing queue) nor resized (resize_(0),
  FSDP2's resize_storage_bytes_).
When torch cannot tell a use count, the slot is never reused.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence

import torch

from attnres_ge.op_kernel.host_memory import empty_planned
from attnres_ge.op_proto import TensorMeta

WORKSPACE_DTYPE = torch.uint8


def _use_count(storage: torch.UntypedStorage) -> int | None:
    """References to the storage from anywhere (tensors, views, storage objects); None if torch cannot tell."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    return None if use_count is None else use_count(storage._cdata)


class _Slot:
    """One buffer: a storage and a contiguous tensor of the planned shape and dtype over it."""

    def __init__(self, meta: TensorMeta, device: torch.device):
        self.tensor = (empty_planned(tuple(meta.shape), meta.dtype) if device.type == "cpu"
                       else torch.empty(meta.shape, dtype=meta.dtype, device=device))
        self.storage = self.tensor.untyped_storage()
        self.data_ptr = self.storage.data_ptr()
        self.nbytes = self.storage.nbytes()
        # The pool's own references, counted now that nobody else has any: to the storage (the slot
        # tensor, the storage object) and to the storage object (how many depends on torch's version).
        self.idle_use_count = _use_count(self.storage)
        self.idle_storage_refs = sys.getrefcount(self.storage)

    def reusable(self) -> bool:
        """Provably free and still the planned allocation (the module's rule). No local may hold
        self.storage while its references are counted."""
        return (
            self.idle_use_count is not None
            and _use_count(self.storage) == self.idle_use_count
            and sys.getrefcount(self.storage) == self.idle_storage_refs
            and weakref.getweakrefcount(self.storage) == 0
            and self.storage.data_ptr() == self.data_ptr
            and self.storage.nbytes() == self.nbytes
            and not self.storage.is_shared()
        )


class BufferPool:
    """Per plan: one slot per output plus one for the workspace, for the `max_shapes` latest plans.

    A loop over ever-new token counts keeps at most `max_shapes` sets of buffers alive.
    """

    def __init__(self, max_shapes: int = 4):
        self.max_shapes = max_shapes
        # id(plan) -> (plan, slots). The plan is kept so its id is not reused while the entry lives.
        self._slots: OrderedDict[int, tuple[object, list[_Slot]]] = OrderedDict()
        self._lock = threading.Lock()
        self.allocations = 0  # storages allocated so far (tests watch reuse through it)

    def __len__(self) -> int:
        return len(self._slots)

    def take(
        self, plan: object, outputs: Sequence[TensorMeta], workspace_size: int, device: torch.device
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Output tensors [shapes of `outputs`] and a workspace [workspace_size] uint8 for one run of `plan`,
        in memory that nobody else can reach."""
        with self._lock:
            entry = self._slots.get(id(plan))
            if entry is None or entry[0] is not plan:
                metas = [*outputs, TensorMeta((workspace_size,), WORKSPACE_DTYPE)]
                entry = (plan, [self._new_slot(meta, device) for meta in metas])
                self._slots[id(plan)] = entry
                if len(self._slots) > self.max_shapes:
                    self._slots.popitem(last=False)
            self._slots.move_to_end(id(plan))
            slots = entry[1]
            for index, slot in enumerate(slots):
                if not slot.reusable():
                    slots[index] = self._new_slot(TensorMeta(tuple(slot.tensor.shape), slot.tensor.dtype), device)
            tensors = [slot.tensor.detach() for slot in slots]
        return tensors[:-1], tensors[-1]

    def _new_slot(self, meta: TensorMeta, device: torch.device) -> _Slot:
        self.allocations += 1
        return _Slot(meta, device)
