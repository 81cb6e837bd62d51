"""Output and workspace memory of one compiled GE node, kept per plan (input shape) and reused only when free.

GE plans a static graph's memory once and reuses it on every run. Reusing is only safe while
nobody still holds the previous run's results (an autograd graph that saved an output, a
caller keeping the loss): overwriting them would silently change values someone holds. So each
buffer is a slot: a storage and one tensor of the planned shape over it, both kept by the pool.
A run hands out a new tensor sharing the slot's storage (detach: one cheap op), so anyone who
still holds a run's result, or a view of it, raises the storage's use count; before a run
writes into a slot that count is checked, and a held slot gets a fresh storage instead (kept
for next time).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import torch

from ..op_proto import TensorMeta

WORKSPACE_DTYPE = torch.uint8
IDLE_USE_COUNT = 2  # the pool's own references to a slot's storage: the storage object and the slot tensor


def _use_count(storage: torch.UntypedStorage) -> int | None:
    """References to the storage from anywhere (tensors, views, storage objects); None if torch cannot tell."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    return None if use_count is None else use_count(storage._cdata)


class _Slot:
    """One buffer: a storage and a contiguous tensor of the planned shape and dtype over it."""

    def __init__(self, meta: TensorMeta, device: torch.device):
        self.tensor = torch.empty(meta.shape, dtype=meta.dtype, device=device)
        self.storage = self.tensor.untyped_storage()

    def idle(self) -> bool:
        return _use_count(self.storage) == IDLE_USE_COUNT


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
        in memory that nobody else holds."""
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
                if not slot.idle():
                    slots[index] = self._new_slot(TensorMeta(tuple(slot.tensor.shape), slot.tensor.dtype), device)
            tensors = [slot.tensor.detach() for slot in slots]
        return tensors[:-1], tensors[-1]

    def _new_slot(self, meta: TensorMeta, device: torch.device) -> _Slot:
        self.allocations += 1
        return _Slot(meta, device)
