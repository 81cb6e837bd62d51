"""Kernels of the Block AttnRes ops, by GE op type, and the float64 reference.

Two implementations share one signature per op (tensors, outputs, workspace, tiling record):

  native  C++ (op_kernel/csrc, built at install time as `_native`): the fast path
  python  torch ops accumulating in float64 in a fixed order: the oracle

`KERNELS[op_type]` picks, at first use, the one named by the environment variable
ATTNRES_GE_KERNEL (`native`, `python`, or `auto`, the default). `auto` takes the
native kernels when `_native` imports and otherwise the Python ones, with one
warning saying why and how to build. `get_kernels(name)` returns a specific
implementation (tests compare the two); `KERNELS.set_implementation(name)` switches.

Both kernels check every tensor against the tiling record. `KERNELS.launch(op_type,
tiling, dtype)` is what the host runtime calls instead, once per plan: a
`launch(inputs, outputs, workspace)` for tensors the plan already guarantees to
match (the native one converts the record once and checks no tensor per call).
"""

from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch

from attnres_ge.op_host.tiling_base import TilingRecord
from attnres_ge.op_kernel.block_attention_residuals import block_attention_residuals_kernel
from attnres_ge.op_kernel.block_attention_residuals_grad import block_attention_residuals_grad_kernel
from attnres_ge.op_proto import BACKWARD, FORWARD

FORWARD_OP = FORWARD.op_type
BACKWARD_OP = BACKWARD.op_type
KERNEL_ENV = "ATTNRES_GE_KERNEL"
IMPLEMENTATIONS = ("native", "python")
BUILD_HINT = "build it with: pip install torch==2.13.0 && pip install --no-build-isolation -e . (needs a C++ compiler)"

PYTHON_KERNELS: dict[str, Callable] = {
    FORWARD_OP: block_attention_residuals_kernel,
    BACKWARD_OP: block_attention_residuals_grad_kernel,
}
Launch = Callable[[Sequence, Sequence, object], None]  # (inputs, outputs, workspace)


def _checked_launch(kernel: Callable) -> Callable[[TilingRecord, torch.dtype], Launch]:
    """A launch factory that calls the (checking) kernel itself."""

    def factory(tiling: TilingRecord, dtype: torch.dtype) -> Launch:
        def launch(inputs, outputs, workspace):
            kernel(*inputs, *outputs, workspace, tiling)

        return launch

    return factory


PYTHON_LAUNCHES = {op_type: _checked_launch(kernel) for op_type, kernel in PYTHON_KERNELS.items()}


class NativeKernelUnavailableWarning(RuntimeWarning):
    """The native kernels are not built; the (much slower) Python kernels run instead."""


def _load_native() -> tuple[dict[str, Callable] | None, dict[str, Callable] | None, str]:
    """(the native kernels, their launch factories, "") or (None, None, why they are unavailable)."""
    try:
        from attnres_ge.op_kernel import native
    except ImportError as error:
        return None, None, f"attnres_ge.op_kernel._native does not import ({error})"
    kernels = {
        FORWARD_OP: native.block_attention_residuals_native,
        BACKWARD_OP: native.block_attention_residuals_grad_native,
    }
    return kernels, {FORWARD_OP: native.ForwardLaunch, BACKWARD_OP: native.BackwardLaunch}, ""


_native_kernels, _native_launches, NATIVE_UNAVAILABLE_REASON = _load_native()


def native_available() -> bool:
    return _native_kernels is not None


def get_kernels(implementation: str) -> dict[str, Callable]:
    """The kernels of one implementation, "native" or "python", by op type."""
    if implementation == "python":
        return dict(PYTHON_KERNELS)
    if implementation == "native":
        if _native_kernels is None:
            raise ImportError(f"native kernels unavailable: {NATIVE_UNAVAILABLE_REASON}; {BUILD_HINT}")
        return dict(_native_kernels)
    raise ValueError(f"unknown kernel implementation {implementation!r}; known: {IMPLEMENTATIONS}")


def _choose(requested: str) -> str:
    if requested in IMPLEMENTATIONS:
        if requested == "native":
            get_kernels("native")  # raises with the reason when unavailable
        return requested
    if requested not in ("", "auto"):
        raise ValueError(f"{KERNEL_ENV}={requested!r}: expected one of native, python, auto")
    if _native_kernels is not None:
        return "native"
    warnings.warn(
        f"attnres-ge: using the slow Python kernels because {NATIVE_UNAVAILABLE_REASON}; {BUILD_HINT}. "
        f"Set {KERNEL_ENV}=python to choose them explicitly and silence this warning.",
        NativeKernelUnavailableWarning,
        stacklevel=4,
    )
    return "python"


class _KernelTable(Mapping):
    """KERNELS: op type -> kernel of the chosen implementation, chosen at first lookup."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._implementation: str | None = None
        self._kernels: dict[str, Callable] = {}
        self.switch_listeners: list[Callable[[], None]] = []  # called after every set_implementation

    def _resolve(self) -> dict[str, Callable]:
        with self._lock:
            if self._implementation is None:
                self._implementation = _choose(os.environ.get(KERNEL_ENV, "auto").strip().lower())
                self._kernels = get_kernels(self._implementation)
            return self._kernels

    @property
    def implementation(self) -> str:
        """"native" or "python" (resolving the choice if not made yet)."""
        self._resolve()
        return self._implementation  # type: ignore[return-value]

    def set_implementation(self, implementation: str | None) -> None:
        """Use `implementation` from now on; None goes back to the environment's choice at next use."""
        with self._lock:
            self._implementation = None
            self._kernels = {}
            if implementation is not None:
                self._kernels = get_kernels(implementation)
                self._implementation = implementation
        for listener in self.switch_listeners:
            listener()

    def __getitem__(self, op_type: str) -> Callable:
        return self._resolve()[op_type]

    def launch(self, op_type: str, tiling: TilingRecord, dtype: torch.dtype) -> tuple[str, Launch]:
        """(implementation, `launch(inputs, outputs, workspace)`) for tensors that match `tiling` and `dtype`:
        contiguous inputs of the shapes it was made for, outputs and workspace of the planned sizes."""
        self._resolve()
        implementation = self._implementation
        launches = _native_launches if implementation == "native" else PYTHON_LAUNCHES
        return implementation, launches[op_type](tiling, dtype)

    def __iter__(self) -> Iterator[str]:
        return iter(PYTHON_KERNELS)

    def __len__(self) -> int:
        return len(PYTHON_KERNELS)


KERNELS = _KernelTable()


def active_implementation() -> str:
    """The implementation KERNELS runs: "native" or "python"."""
    return KERNELS.implementation


def describe_implementation() -> str:
    """What runs the kernels, for people: "native, avx512bf16 path" (the native kernels' instruction
    set, see native.isa_path) or "python"."""
    if active_implementation() == "python":
        return "python"
    from attnres_ge.op_kernel import native

    return f"native, {native.isa_path()} path"


__all__ = [
    "KERNELS",
    "KERNEL_ENV",
    "NativeKernelUnavailableWarning",
    "active_implementation",
    "block_attention_residuals_grad_kernel",
    "block_attention_residuals_kernel",
    "describe_implementation",
    "get_kernels",
    "native_available",
]
