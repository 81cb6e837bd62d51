"""The native (C++) kernels: launch records and the checked kernels, for every op alike.

`_native` is the extension built at install time from op_kernel/csrc (see setup.py);
importing this module raises ImportError when it was not built, or when it was built from
other sources than this Python (its constants or record layouts disagree: rebuild).

A tiling record's `to_bytes()` becomes a launch record in C++ (`LaunchRecord`), which checks
that it covers the tokens and the hidden size exactly, since the kernel walks it. `Launch` is
what the launcher calls, once made per plan, for tensors the plan already guarantees to match;
`checked_kernel(kernel)` has the Python kernels' signature and checks every tensor against the
tiling record first (tests and tools call kernels that way).

Streaming (non-temporal) stores write an output without first reading its cache
lines (no read-for-ownership). They are used for outputs of at least STREAM_MIN_BYTES
(8 MiB), which would leave the caches before anyone read them anyway (docs/kernels.md).
ATTNRES_GE_STREAM_MIN_BYTES=N changes the threshold; a huge N turns them off.

The kernels are compiled for several instruction sets and run on the fastest the CPU has
(`isa_path()`); ATTNRES_GE_ISA=scalar|avx2|avx512|avx512bf16 forces one (an error at import
when this CPU cannot run it), `use_isa_path(name)` switches in a running process. Every path
gives the same bits. A call runs on at most torch.get_num_threads() threads; a long one on torch's
OpenMP team, whose threads spin after torch's operators (op_kernel/csrc/openmp_team.h;
`torch_team_calls()` counts it), a short one on the kernels' own pool.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence

import torch

from attnres_ge.op_host.tiling_base import DTYPE_CODES, LANES, TilingRecord
from attnres_ge.op_kernel import _native
from attnres_ge.op_kernel.kernel_spec import OpKernel

STREAM_ENV = "ATTNRES_GE_STREAM_MIN_BYTES"
STREAM_MIN_BYTES = int(os.environ.get(STREAM_ENV, 8 << 20))
ISA_ENV = "ATTNRES_GE_ISA"
REBUILD_HINT = "rebuild it: pip install --no-build-isolation -e ."


def _check_shared_constants() -> None:
    """The constants both languages use must agree: a stale build of _native must not run."""
    lanes, codes = getattr(_native, "LANES", None), getattr(_native, "DTYPE_CODES", None)  # absent: an older build
    native_codes = {getattr(torch, name): code for name, code in (codes or {}).items()}
    if lanes != LANES or native_codes != DTYPE_CODES or not hasattr(_native, "openmp_team_min_bytes"):
        raise ImportError(f"attnres_ge.op_kernel._native was built from other sources (LANES {lanes}, dtype codes "
                          f"{codes}; this Python has {LANES}, {DTYPE_CODES}); {REBUILD_HINT}")


_check_shared_constants()


def isa_path() -> str:
    """The instruction set the native kernels run on: "scalar", "avx2", "avx512" or "avx512bf16"."""
    return _native.isa_path()


def available_isa_paths() -> tuple[str, ...]:
    """The paths this CPU can run, from the most portable to the fastest (the default)."""
    return _native.available_isa_paths()


def use_isa_path(name: str) -> None:
    """Run the native kernels on path `name` from now on, in this process (same bits on every path)."""
    if name not in _native.available_isa_paths():
        raise ValueError(
            f"native kernel: cannot use instruction set path {name!r}: this CPU runs "
            f"{', '.join(_native.available_isa_paths())} (paths of this build: {', '.join(_native.known_isa_paths())})"
        )
    _native.select_isa_path(name)


def last_call_threads() -> int:
    """How many threads the calling thread's latest native kernel call ran on (the caller included)."""
    return _native.last_call_threads()


def openmp_team_min_bytes(threads: int) -> int:
    """The bytes a kernel call on `threads` threads must move (read and write) to run on torch's OpenMP
    team rather than the kernels' own pool (op_kernel/csrc/openmp_team.h, whose rule this is)."""
    return _native.openmp_team_min_bytes(threads)


def torch_team_calls() -> int:
    """How many of this process's kernel calls ran on torch's OpenMP team."""
    return _native.torch_team_calls()


def _started_by_fork() -> bool:
    """Whether this process is a multiprocessing child forked from its parent (the start method a
    forked child sees is its parent's; a spawned child sets its own)."""
    import multiprocessing

    return (multiprocessing.parent_process() is not None
            and multiprocessing.get_start_method(allow_none=True) in (None, "fork", "forkserver"))


if _started_by_fork():  # its OpenMP team may be the parent's, whose threads do not exist here
    _native.openmp_team_may_be_inherited()


def _select_isa_from_environment() -> None:
    forced = os.environ.get(ISA_ENV, "").strip()
    if forced in ("", "auto"):
        return
    try:
        use_isa_path(forced)
    except ValueError as error:
        raise RuntimeError(f"{ISA_ENV}={forced}: {error}") from None


_select_isa_from_environment()

_checked_records: set[tuple[str, type]] = set()
_checked_lock = threading.Lock()


def _check_record_layout(op_type: str, record_type: type[TilingRecord]) -> None:
    """The C++ record struct of `op_type` must be `record_type.to_bytes()` field for field."""
    with _checked_lock:
        if (op_type, record_type) in _checked_records:
            return
    native = _native.record_layouts().get(op_type)
    if native is None:
        raise RuntimeError(f"{op_type} native kernel: the native module has no such op; {REBUILD_HINT}")
    expected = record_type.field_layout()
    if native != expected:
        raise RuntimeError(f"{op_type} native kernel: the C++ tiling record {native} does not match "
                           f"{record_type.__name__} {expected}; {REBUILD_HINT}")
    with _checked_lock:
        _checked_records.add((op_type, record_type))


def _dtype_code(op_type: str, dtype: torch.dtype) -> int:
    try:
        return DTYPE_CODES[dtype]
    except KeyError:
        raise ValueError(f"{op_type} native kernel: dtype must be float32, float16 or bfloat16, got {dtype}") from None


def launch_record(op_type: str, tiling: TilingRecord, dtype: torch.dtype) -> object:
    """The launch record (a capsule; _native checks that it tiles the tokens and H exactly) of a tiling."""
    _check_record_layout(op_type, type(tiling))
    return _native.make_launch(op_type, _dtype_code(op_type, dtype), tiling.to_bytes(), STREAM_MIN_BYTES)


def _address(tensor: torch.Tensor) -> int:
    """A tensor's data address; 0 for an empty one (the forward's statistics when not kept)."""
    return tensor.data_ptr() if tensor.numel() else 0


class Launch:
    """`launch(inputs, outputs, workspace)` of one op for one tiling record and dtype, for tensors that
    match them (contiguous, of the record's sizes); nothing is checked per call."""

    def __init__(self, op_type: str, tiling: TilingRecord, dtype: torch.dtype):
        self.record = launch_record(op_type, tiling, dtype)  # also what the torch ops' C++ entry caches

    def __call__(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor], workspace: torch.Tensor):
        _native.launch(self.record, [tensor.data_ptr() for tensor in inputs], [_address(t) for t in outputs],
                       _address(workspace), torch.get_num_threads())


def _check_tensor(op_type: str, name: str, tensor: torch.Tensor, dtype: torch.dtype, numel: int) -> None:
    if (not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu" or tensor.dtype != dtype
            or not tensor.is_contiguous() or tensor.numel() != numel):
        got = (f"{tensor.dtype} {list(tensor.shape)} on {tensor.device}" + ("" if tensor.is_contiguous() else
               " (not contiguous)")) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ValueError(f"{op_type} native kernel: {name} must be a contiguous CPU {dtype} tensor of {numel} "
                         f"elements, got {got}")


def _check_workspace(op_type: str, workspace: torch.Tensor, size: int) -> None:
    if size and (workspace.device.type != "cpu" or not workspace.is_contiguous() or workspace.nbytes < size
                 or workspace.data_ptr() % 4):
        raise ValueError(f"{op_type} native kernel: the workspace must be a contiguous, 4-byte aligned CPU buffer "
                         f"of at least {size} bytes, got {workspace.nbytes} bytes on {workspace.device}")


def checked_kernel(kernel: OpKernel) -> Callable[..., None]:
    """The native kernel of `kernel`'s op with the Python kernel's signature (`*inputs, *outputs,
    workspace, tiling`), checking every tensor against the tiling record before it runs."""
    prototype = kernel.prototype
    names = [*prototype.input_names(), *prototype.output_names()]

    def run(*args) -> None:
        *tensors, workspace, tiling = args
        dtype = tensors[kernel.dtype_index].dtype
        sizes = tiling.tensor_sizes(dtype)
        if len(tensors) != len(sizes):
            raise TypeError(f"{prototype.op_type} native kernel: takes {len(sizes)} tensors, a workspace and a "
                            f"tiling record, got {len(tensors)} tensors")
        for name, tensor, (want_dtype, numel) in zip(names, tensors, sizes, strict=True):
            _check_tensor(prototype.op_type, name, tensor, want_dtype, numel)
        _check_workspace(prototype.op_type, workspace, tiling.workspace_bytes())
        count = len(prototype.inputs)
        Launch(prototype.op_type, tiling, dtype)(tensors[:count], tensors[count:], workspace)

    run.__name__ = run.__qualname__ = f"{prototype.op_type}_native"
    run.__module__ = __name__
    return run


# ------------------------------------------------------------------------- BlockAttnResRead, the general read
# Its kernels take their arguments directly (no tiling record: the L sources are separate tensors, read in
# place at whatever row stride they have). The caller (op_kernel/block_attn_res_read.py) has validated
# shapes and dtypes; here only what the C++ side relies on is asserted cheaply. The weight gradients'
# per-chunk workspace is allocated by the C++ kernel itself (op_kernel/csrc/read_kernel.h).

READ_OP = "BlockAttnResRead"


def _optional_address(tensor: torch.Tensor | None) -> int:
    return 0 if tensor is None else tensor.data_ptr()


def _read_sources(sources: Sequence[torch.Tensor]) -> tuple[torch.dtype, int, int, list[int], list[int]]:
    """(dtype, T, H, addresses, row strides) of the sources, each [T, H] with unit stride along H."""
    tokens, hidden = sources[0].shape
    dtype = sources[0].dtype
    for source in sources:
        if source.dtype != dtype or source.shape != (tokens, hidden) or (hidden > 1 and source.stride(1) != 1):
            raise ValueError(f"{READ_OP} native kernel: every source must be [{tokens}, {hidden}] {dtype} with unit "
                             f"stride along H, got {source.dtype} {list(source.shape)} strides {source.stride()}")
    # A stride is only ever multiplied by a token index, so for T <= 1 any value >= H reads the same rows.
    strides = [source.stride(0) if tokens > 1 else hidden for source in sources]
    return dtype, tokens, hidden, [source.data_ptr() for source in sources], strides


def _read_shape(tokens: int, hidden: int, sources, query: torch.Tensor, output_norm_weight) -> tuple[int, ...]:
    """(T, H, L, S, W): W = 0 without an output norm."""
    weight_rows = 0 if output_norm_weight is None else output_norm_weight.reshape(-1, hidden).shape[0]
    return tokens, hidden, len(sources), query.shape[0], weight_rows


def read_forward(sources, query, key_norm_weight, output_norm_weight, out, inv_norm, probs, output_inv_rms,
                 eps: float, output_eps: float, scale: float, normalize_values: bool) -> None:
    """BlockAttnResRead's forward (op_kernel/csrc/read_kernel.h) into `out` [S, T, H] and, when given,
    `inv_norm` [T, L], `probs` [S, T, L] and `output_inv_rms` [S, T]. eps, output_eps and scale are used
    rounded to float32, as GE stores them."""
    dtype, tokens, hidden, addresses, strides = _read_sources(sources)
    tensors = [query, key_norm_weight, output_norm_weight, out, inv_norm, probs, output_inv_rms]
    _native.read_forward(_dtype_code(READ_OP, dtype), _read_shape(tokens, hidden, sources, query, output_norm_weight),
                         addresses, strides, [_optional_address(t) for t in tensors], (eps, output_eps, scale),
                         bool(normalize_values), torch.get_num_threads(), STREAM_MIN_BYTES)


def read_backward(grad_out, sources, query, key_norm_weight, output_norm_weight, inv_norm, probs, output_inv_rms,
                  grad_sources, grad_query, grad_key_norm_weight, grad_output_norm_weight,
                  eps: float, output_eps: float, scale: float, normalize_values: bool) -> None:
    """BlockAttnResRead's backward (op_kernel/csrc/read_kernel.h) from the forward's saved `inv_norm`,
    `probs` and `output_inv_rms`, into `grad_sources` (L contiguous [T, H] tensors), `grad_query` [S, H]
    and, when given, `grad_key_norm_weight` [H] and `grad_output_norm_weight` [W, H]. With T = 0 the
    query's and weights' gradients are written as zeros."""
    dtype, tokens, hidden, addresses, strides = _read_sources(sources)
    if len(grad_sources) != len(sources) or any(not grad.is_contiguous() for grad in grad_sources):
        raise ValueError(f"{READ_OP} native kernel: grad_sources must be {len(sources)} contiguous tensors")
    tensors = [grad_out, query, key_norm_weight, output_norm_weight, inv_norm, probs, output_inv_rms, grad_query,
               grad_key_norm_weight, grad_output_norm_weight]
    _native.read_backward(_dtype_code(READ_OP, dtype), _read_shape(tokens, hidden, sources, query, output_norm_weight),
                          addresses, strides, [_optional_address(t) for t in tensors],
                          [grad.data_ptr() for grad in grad_sources], (eps, output_eps, scale),
                          bool(normalize_values), torch.get_num_threads())


# ------------------------------------------------------- BlockAttnResUpdateNorm, the update with a fused norm
# The update's kernel on the update's launch record, with the norm's weight; the caller
# (op_kernel/block_attn_res_update_norm.py) passes the tensors the record was planned for.

def update_norm(launch: Launch, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor],
                output_norm_weight: torch.Tensor, output_eps: float) -> None:
    """BlockAttnResUpdate's `launch` on `inputs` and `outputs` ([partial_out, h]), with h normed by the RMSNorm
    of weight `output_norm_weight` ([D] contiguous float32) and `output_eps` (used rounded to float32)."""
    _check_tensor("BlockAttnResUpdateNorm", "output_norm_weight", output_norm_weight, torch.float32,
                  outputs[1].shape[-1])
    _native.update_norm(launch.record, [tensor.data_ptr() for tensor in inputs], [_address(t) for t in outputs],
                        output_norm_weight.data_ptr(), output_eps, torch.get_num_threads())
