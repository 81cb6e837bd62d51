"""Kernels of the Block AttnRes ops: the implementation in use, and the launcher above them.

Two implementations share one signature per op (tensors, outputs, workspace, tiling record):

  native  C++ (op_kernel/csrc, built at install time as `_native`): the fast path
  python  torch ops accumulating in float64 in a fixed order: the oracle

Each op's kernel module defines its `KERNEL` (an OpKernel: prototype, tiling, Python kernel).
`KERNELS` picks the implementation at first use from the environment variable
ATTNRES_GE_KERNEL (`native`, `python`, or `auto`, the default). `auto` takes the native
kernels when `_native` imports and otherwise the Python ones, with one warning saying why and
how to build. `KERNELS.kernel(op)` is the op's kernel in that implementation (`kernel(op,
implementation)` a specific one: tests compare the two); `KERNELS.set_implementation(name)`
switches.

`KERNELS.launch(op, tiling, dtype)` is what the launcher (op_kernel.launcher) calls instead,
once per plan: a `launch(inputs, outputs, workspace)` for tensors the plan already
guarantees to match (the native one converts the record once and checks no tensor per call).

"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable, Sequence

import torch

from attnres_ge.op_host.tiling_base import TilingRecord
from attnres_ge.op_kernel.kernel_spec import OpKernel

KERNEL_ENV = "ATTNRES_GE_KERNEL"
IMPLEMENTATIONS = ("native", "python")
BUILD_HINT = "build it with: pip install torch==2.13.0 && pip install --no-build-isolation -e . (needs a C++ compiler)"
Launch = Callable[[Sequence, Sequence, object], None]  # (inputs, outputs, workspace)


def _python_launch(op: OpKernel, tiling: TilingRecord) -> Launch:
    def launch(inputs, outputs, workspace):
        op.python(*inputs, *outputs, workspace, tiling)

    return launch


class NativeKernelUnavailableWarning(RuntimeWarning):
    """The native kernels are not built; the (much slower) Python kernels run instead."""


def _load_native():
    """(the native module, "") or (None, why it is unavailable)."""
    try:
        from attnres_ge.op_kernel import native
    except ImportError as error:
        return None, f"attnres_ge.op_kernel._native does not import ({error})"
    return native, ""


_native_module, NATIVE_UNAVAILABLE_REASON = _load_native()


def native_available() -> bool:
    return _native_module is not None


def native_module():
    """op_kernel.native, for kernels called with their tensors (the read's); ImportError when unavailable."""
    _require("native")
    return _native_module


def _require(implementation: str) -> None:
    if implementation == "native" and _native_module is None:
        raise ImportError(f"native kernels unavailable: {NATIVE_UNAVAILABLE_REASON}; {BUILD_HINT}")
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"unknown kernel implementation {implementation!r}; known: {IMPLEMENTATIONS}")


def kernel(op: OpKernel, implementation: str) -> Callable[..., None]:
    """`op`'s kernel in `implementation` ("native" or "python"): called as
    `kernel(*inputs, *outputs, workspace, tiling_record)`; the native one checks every tensor."""
    _require(implementation)
    return op.python if implementation == "python" or not op.has_native else _native_module.checked_kernel(op)


def _choose(requested: str) -> str:
    if requested in IMPLEMENTATIONS:
        _require(requested)  # raises with the reason when unavailable
        return requested
    if requested not in ("", "auto"):
        raise ValueError(f"{KERNEL_ENV}={requested!r}: expected one of native, python, auto")
    if _native_module is not None:
        return "native"
    warnings.warn(
        f"attnres-ge: using the slow Python kernels because {NATIVE_UNAVAILABLE_REASON}; {BUILD_HINT}. "
        f"Set {KERNEL_ENV}=python to choose them explicitly and silence this warning.",
        NativeKernelUnavailableWarning,
        stacklevel=4,
    )
    return "python"


class _Kernels:
    """KERNELS: the kernel implementation in use, chosen at first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._implementation: str | None = None
        self.switch_listeners: list[Callable[[], None]] = []  # called after every set_implementation

    @property
    def implementation(self) -> str:
        """"native" or "python" (resolving the choice if not made yet)."""
        with self._lock:
            if self._implementation is None:
                self._implementation = _choose(os.environ.get(KERNEL_ENV, "auto").strip().lower())
            return self._implementation

    def set_implementation(self, implementation: str | None) -> None:
        """Use `implementation` from now on; None goes back to the environment's choice at next use."""
        if implementation is not None:
            _require(implementation)
        with self._lock:
            self._implementation = implementation
        for listener in self.switch_listeners:
            listener()

    def kernel(self, op: OpKernel) -> Callable[..., None]:
        """`op`'s kernel in the implementation in use."""
        return kernel(op, self.implementation)

    def launch(self, op: OpKernel, tiling: TilingRecord, dtype: torch.dtype) -> tuple[str, Launch]:
        """(implementation, `launch(inputs, outputs, workspace)`) for tensors that match `tiling` and `dtype`:
        contiguous inputs of the shapes it was made for, outputs and workspace of the planned sizes."""
        implementation = self.implementation
        if implementation == "python" or not op.has_native:  # an op with no native kernel runs its Python one
            return implementation, _python_launch(op, tiling)
        return implementation, _native_module.Launch(op.op_type, tiling, dtype)


KERNELS = _Kernels()


def active_implementation() -> str:
    """The implementation KERNELS runs: "native" or "python"."""
    return KERNELS.implementation


def describe_implementation() -> str:
    """What runs the kernels, for people: "native, avx512bf16 path" (the native kernels' instruction
    set, see native.isa_path) or "python"."""
    if active_implementation() == "python":
        return "python"
    return f"native, {_native_module.isa_path()} path"


__all__ = [
    "KERNELS",
    "KERNEL_ENV",
    "NativeKernelUnavailableWarning",
    "OpKernel",
    "active_implementation",
    "describe_implementation",
    "kernel",
    "native_available",
    "native_module",
]
