"""Fresh output memory for eager calls that does not page-fault 4 KiB at a time.

A freshly allocated large tensor is fresh anonymous memory: the kernel maps it a
4 KiB page at a time as the op first writes it (about 73,700 faults for a 288 MB
gradient), which costs more than the op itself. Large eager outputs therefore
come from `HugePagePool`: anonymous mappings advised MADV_HUGEPAGE (2 MiB pages),
wrapped by torch.frombuffer. The tensor keeps its mapping alive; the moment no
tensor, view or storage uses a mapping any more, the pool takes it back and hands
it to the next output of the same size, already mapped: no faults and no page
compaction. Idle mappings beyond MAX_IDLE_BYTES are unmapped, oldest first, as
soon as they become idle.
Small outputs, machines whose THP is "never", and ATTNRES_GE_HUGE_PAGES=0 use torch.empty.

Compiled graphs plan their buffers once and reuse them (buffer_pool.py, and the C++ GraphNode):
those come from torch's allocator, and from the same size on their memory is advised to use huge
pages before anything touches it (`empty_planned`): the backward writes N+1 gradient rows per
token, a 16-bit row a 4 KiB page at H=2048, and with 4 KiB pages it took 14.8 against 13.2 ms
(bfloat16, T=4096, N=8, H=2048).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import itertools
import math
import mmap
import os
import threading
import weakref
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
    """Huge-page-advised mappings for large CPU outputs, reused once no tensor uses them.

    Each output wraps its mapping in a ctypes view that only the output's storage references;
    the view's finalizer returns the mapping to the idle set the moment the last tensor, view
    or storage over it goes, and trims the idle set to `max_idle_bytes` right then.
    """

    def __init__(self, max_idle_bytes: int = MAX_IDLE_BYTES):
        self.max_idle_bytes = max_idle_bytes
        self._idle: dict[int, mmap.mmap] = {}  # insertion order = least recently returned first
        self._in_use: dict[int, mmap.mmap] = {}
        self._returned: collections.deque[int] = collections.deque()  # keys whose last user went, not yet filed
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self.mapped = 0  # mappings created so far (tests watch reuse through it)

    def idle_bytes(self) -> int:
        """Bytes of the mappings no tensor uses, kept for reuse (at most max_idle_bytes)."""
        with self._locked():
            return sum(len(mapping) for mapping in self._idle.values())

    def in_use_bytes(self) -> int:
        """Bytes of the mappings some tensor still uses."""
        with self._locked():
            return sum(len(mapping) for mapping in self._in_use.values())

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous CPU tensor [shape] of `dtype` in a huge-page mapping."""
        numel = math.prod(shape)
        size = -(-numel * dtype.itemsize // HUGE_PAGE) * HUGE_PAGE
        with self._locked():
            key = next((key for key, mapping in self._idle.items() if len(mapping) == size), None)
            if key is not None:
                mapping = self._idle.pop(key)
            else:
                key = next(self._ids)
                mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                mapping.madvise(mmap.MADV_HUGEPAGE)
                self.mapped += 1
            self._in_use[key] = mapping
        view = (ctypes.c_char * size).from_buffer(mapping)
        weakref.finalize(view, self._on_return, key).atexit = False
        return torch.frombuffer(view, dtype=dtype, count=numel).view(shape)

    def _on_return(self, key: int) -> None:
        # Runs wherever the last user of a mapping goes: maybe inside this pool's own locked section
        # (a garbage collection there), so it never waits for the lock; whoever holds it files the key.
        self._returned.append(key)
        self._file_returns()

    @contextlib.contextmanager
    def _locked(self):
        with self._lock:
            yield
        self._file_returns()

    def _file_returns(self) -> None:
        """Move returned mappings to the idle set and trim it. A return that arrives while another
        caller holds the lock is filed by that caller, which checks again after releasing it."""
        while self._returned and self._lock.acquire(blocking=False):
            try:
                while self._returned:
                    key = self._returned.popleft()
                    self._idle[key] = self._in_use.pop(key)
                self._trim()
            finally:
                self._lock.release()

    def _trim(self) -> None:
        idle_bytes = sum(len(mapping) for mapping in self._idle.values())
        while idle_bytes > self.max_idle_bytes:
            oldest = next(iter(self._idle))
            idle_bytes -= len(self._idle.pop(oldest))  # unmapped as the dying view lets go of it


_pool = HugePagePool()


_empty_of: dict[torch.dtype, torch.Tensor] = {}  # per dtype an empty CPU tensor: new_empty is the cheapest allocation


def planned_huge_page_bytes() -> int:
    """The size from which planned buffers are advised to use huge pages; 0 where they never are."""
    return MIN_HUGE_BYTES if huge_pages_available() else 0


@lru_cache(maxsize=1)
def _madvise():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return libc.madvise


def empty_planned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised contiguous CPU buffer that will be reused (a compiled graph's slot): torch's
    allocator, its 2 MiB-aligned part advised to use huge pages when it is planned_huge_page_bytes()
    or larger. Advice only: memory already touched keeps its pages, and the storage stays torch's
    (resizable, shareable)."""
    tensor = torch.empty(shape, dtype=dtype)
    nbytes = tensor.untyped_storage().nbytes()
    if 0 < planned_huge_page_bytes() <= nbytes:
        start = -(-tensor.data_ptr() // HUGE_PAGE) * HUGE_PAGE
        stop = (tensor.data_ptr() + nbytes) // HUGE_PAGE * HUGE_PAGE
        if stop > start:
            _madvise()(start, stop - start, mmap.MADV_HUGEPAGE)
    return tensor


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
