"""The ops' C++ entry (ge_plugin/csrc, built at install time as `_cpp_entry`), when it is usable.

`MODULE` is the extension, or None when it was not built, when the native kernels whose launch
records it repeats are unavailable, or when it was built from other sources (a failed rebuild
leaves the previous build in place; it is then not used, with one warning). op_common registers
the torch ops' kernels through it; the local GE runs its compiled nodes with its GraphNode.
"""

from __future__ import annotations

import warnings

import torch

INTERFACE_VERSION = 8  # what ge_plugin/csrc/cpp_entry.cpp exports as INTERFACE_VERSION


def _load():
    try:
        from attnres_ge.ge_plugin import _cpp_entry
        from attnres_ge.op_kernel import native  # noqa: F401  (the launch records the entry repeats come from it)
    except ImportError:  # not built, or no native kernels: the Python registrations stand in
        return None
    if getattr(_cpp_entry, "INTERFACE_VERSION", None) != INTERFACE_VERSION:
        warnings.warn(f"attnres-ge: {_cpp_entry.__file__} was built from other sources and is not used (every call "
                      "runs the ops' Python entry); rebuild it: pip install --no-build-isolation -e .",
                      RuntimeWarning, stacklevel=2)
        return None
    return _cpp_entry


MODULE = _load()


def empty_output(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A fresh output tensor: from the entry's huge-page pool when large (a torch.empty would page-fault on
    every 4 KiB page its kernel first writes), else torch's allocator; torch's allocator without the entry."""
    if MODULE is not None:
        return MODULE.empty_output(tuple(shape), dtype)
    return torch.empty(tuple(shape), dtype=dtype)
