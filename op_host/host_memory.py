"""Fresh output memory for eager calls that does not page-fault 4 KiB at a time.

A freshly allocated large tensor is fresh anonymous memory: the kernel maps it a
4 KiB page at a time as the op first writes it (about 73,700 faults for a 288 MB
gradient), which costs more than the op itself. Large eager outputs therefore
come from `HugePagePool`: anonymous mappings advised MADV_HUGEPAGE (2 MiB pages),
wrapped by torch.frombuffer. The tensor keeps its mapping alive; once no tensor
uses a mapping any more (its reference count says only the pool holds it) the
pool hands it to the next output of the same size, already mapped: no faults and
no page compaction. Idle mappings beyond MAX_IDLE_BYTES are unmapped, oldest first.
Small outputs, machines whose THP is "never", and ATTNRES_GE_HUGE_PAGES=0 use torch.empty.
"""

from __future__ import annotations

import itertools
import math
import mmap
import os
import sys
import threading
from functools import lru_cache
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20
MIN_HUGE_BYTES = 4 * HUGE_PAGE  # below this the faults cost little
MAX_IDLE_BYTES = 512 << 20  # idle mappings kept for reuse, at most
HUGE_PAGES_ENV = "ATTNRES_GE_HUGE_PAGES"
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@lru_cache(maxsize=1)
def huge_pages_available() -> bool:
    """THP can be asked for (its mode is "always" or "madvise") and nobody switched this off."""
    if os.environ.get(HUGE_PAGES_ENV, "1") in ("0", "false", "False") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        return "[never]" not in THP_SETTING.read_text()
    except OSError:
        return False


class HugePagePool:
    """Huge-page-advised mappings for large CPU outputs, reused once no tensor uses them."""

    def __init__(self, max_idle_bytes: int = MAX_IDLE_BYTES):
        self.max_idle_bytes = max_idle_bytes
        self._mappings: dict[int, mmap.mmap] = {}  # insertion order = least recently handed out first
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self.mapped = 0  # mappings created so far (tests watch reuse through it)

    def _idle(self, key: int) -> bool:
        # Two references when idle: the dict's and getrefcount's argument; a tensor adds its own.
        # (So no local variable may hold a mapping while this is asked.)
        return sys.getrefcount(self._mappings[key]) == 2

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous CPU tensor [shape] of `dtype` in a huge-page mapping."""
        numel = math.prod(shape)
        size = -(-numel * dtype.itemsize // HUGE_PAGE) * HUGE_PAGE
        with self._lock:
            reusable = [key for key in self._mappings if len(self._mappings[key]) == size and self._idle(key)]
            if reusable:
                key = reusable[0]
                mapping = self._mappings.pop(key)
            else:
                key = next(self._ids)
                mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                mapping.madvise(mmap.MADV_HUGEPAGE)
                self.mapped += 1
            self._mappings[key] = mapping
            tensor = torch.frombuffer(mapping, dtype=dtype, count=numel).view(shape)
            del mapping  # only the dict and the tensor hold it now
            self._trim()
        return tensor

    def _trim(self) -> None:
        idle = [key for key in self._mappings if self._idle(key)]
        idle_bytes = sum(len(self._mappings[key]) for key in idle)
        for key in idle:
            if idle_bytes <= self.max_idle_bytes:
                break
            idle_bytes -= len(self._mappings[key])
            self._mappings.pop(key).close()


_pool = HugePagePool()


_empty_of: dict[torch.dtype, torch.Tensor] = {}  # per dtype an empty CPU tensor: new_empty is the cheapest allocation


def from_huge_page_pool(shape: tuple[int, ...], dtype: torch.dtype) -> bool:
    """Whether empty_output takes an output of this shape and dtype from the huge-page pool."""
    return math.prod(shape) * dtype.itemsize >= MIN_HUGE_BYTES and huge_pages_available()


def empty_output(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A fresh contiguous CPU output: from the huge-page pool when large and available; else torch's allocator."""
    if from_huge_page_pool(shape, dtype):
        return _pool.empty(tuple(shape), dtype)
    template = _empty_of.get(dtype)
    if template is None:
        template = _empty_of.setdefault(dtype, torch.empty(0, dtype=dtype))
    return template.new_empty(shape)
