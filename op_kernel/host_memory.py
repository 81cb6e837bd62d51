"""Huge pages for large host buffers: whether they can be had, and the buffers compiled graphs plan.

Fresh anonymous memory is mapped by the OS a 4 KiB page at a time as it is first written: about
73,700 faults for a 288 MB gradient, more than the op itself costs. Two places avoid that:

- Large eager outputs come from the C++ entry's huge-page pool (ge_plugin/csrc/huge_page_pool.h):
  mappings advised MADV_HUGEPAGE, reused, already mapped, once no tensor uses them any more. This
  module says from which size (`huge_page_min_bytes`); `ATTNRES_GE_HUGE_PAGES=0` switches it off.
- Compiled graphs plan their buffers once and reuse them (buffer_pool.py, and the C++ GraphNode):
  those come from torch's allocator, and from the same size on their memory is advised to use huge
  pages before anything touches it (`empty_planned`): the backward writes N+1 gradient rows per
  token, a 16-bit row a 4 KiB page at H=2048, and with 4 KiB pages it took 14.8 against 13.2 ms
  (bfloat16, T=4096, N=8, H=2048).
"""

from __future__ import annotations

import ctypes
import mmap
import os
from functools import lru_cache
from pathlib import Path

import torch

HUGE_PAGE = 2 << 20
MIN_HUGE_BYTES = 4 * HUGE_PAGE  # below this the faults cost little
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


def huge_page_min_bytes() -> int:
    """The size from which eager outputs come from the huge-page pool and planned buffers are advised to use
    huge pages; 0 where neither happens."""
    return MIN_HUGE_BYTES if huge_pages_available() else 0


@lru_cache(maxsize=1)
def _madvise():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return libc.madvise


def empty_planned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised contiguous CPU buffer that will be reused (a compiled graph's slot): torch's
    allocator, its 2 MiB-aligned part advised to use huge pages when it is huge_page_min_bytes()
    or larger. Advice only: memory already touched keeps its pages, and the storage stays torch's
    (resizable, shareable)."""
    tensor = torch.empty(shape, dtype=dtype)
    nbytes = tensor.untyped_storage().nbytes()
    if 0 < huge_page_min_bytes() <= nbytes:
        start = -(-tensor.data_ptr() // HUGE_PAGE) * HUGE_PAGE
        stop = (tensor.data_ptr() + nbytes) // HUGE_PAGE * HUGE_PAGE
        if stop > start:
            _madvise()(start, stop - start, mmap.MADV_HUGEPAGE)
    return tensor
