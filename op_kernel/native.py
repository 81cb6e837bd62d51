"""The native (C++) kernels, with the same signatures as the Python kernels.

`_native` is the extension built at install time from op_kernel/csrc (see setup.py);
importing this module raises ImportError when it was not built. A tiling record becomes
a launch record in C++ (`forward_record`/`backward_record`), which checks that it covers
the tokens and the hidden size exactly, since the kernel walks it. The wrappers check
every tensor against the tiling record (CPU, dtype, contiguity, element count) and hand
the launch record and data pointers to the kernel. The host runtime launches through
`ForwardLaunch`/`BackwardLaunch` instead: made once per plan, for tensors the plan
already guarantees, they skip the per-tensor checks.

Streaming (non-temporal) stores write an output without first reading its cache
lines (no read-for-ownership). They are used for outputs of at least STREAM_MIN_BYTES
(8 MiB), which would leave the caches before anyone
read them anyway (docs/kernels.md, performance notes). ATTNRES_GE_STREAM_MIN_BYTES=N
changes the threshold; a huge N turns them off.

The kernels are compiled for several instruction sets and run on the fastest the CPU has
(`isa_path()`); ATTNRES_GE_ISA=scalar|avx2|avx512|avx512bf16 forces one (an error at import
when this CPU cannot run it), `use_isa_path(name)` switches in a running process. Every path
gives the same bits. A call runs on at most torch.get_num_threads() threads.
"""

from __future__ import annotations

import os

import torch

from attnres_ge.op_host.block_attention_residuals_grad_tiling import BackwardTilingData
from attnres_ge.op_host.block_attention_residuals_tiling import ForwardTilingData
from attnres_ge.op_kernel import _native

STREAM_ENV = "ATTNRES_GE_STREAM_MIN_BYTES"
STREAM_MIN_BYTES = int(os.environ.get(STREAM_ENV, 8 << 20))
ISA_ENV = "ATTNRES_GE_ISA"
KERNEL_TABLE = _native.KERNEL_TABLE  # the kernels, for the torch ops' C++ entry (ge_plugin/csrc)
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # attnres::DType


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


def _select_isa_from_environment() -> None:
    forced = os.environ.get(ISA_ENV, "").strip()
    if forced in ("", "auto"):
        return
    try:
        use_isa_path(forced)
    except ValueError as error:
        raise RuntimeError(f"{ISA_ENV}={forced}: {error}") from None


_select_isa_from_environment()


def _address(tensor: torch.Tensor, name: str, dtype: torch.dtype, numel: int) -> int:
    """The data address of `tensor` once it is a contiguous CPU tensor of `numel` `dtype` elements."""
    if tensor.device.type != "cpu" or tensor.dtype != dtype or not tensor.is_contiguous() or tensor.numel() != numel:
        raise ValueError(
            f"native kernel: {name} must be a contiguous CPU {dtype} tensor of {numel} elements, got "
            f"{tensor.dtype} {list(tensor.shape)} on {tensor.device}"
            + ("" if tensor.is_contiguous() else " (not contiguous)")
        )
    return tensor.data_ptr()


def _dtype_code(dtype: torch.dtype) -> int:
    try:
        return DTYPE_CODES[dtype]
    except KeyError:
        raise ValueError(f"native kernel: dtype must be float32, float16 or bfloat16, got {dtype}") from None


def forward_record(tiling: ForwardTilingData, dtype: torch.dtype) -> object:
    """The launch record (_native checks that it tiles the tokens and H exactly) of a forward tiling."""
    stream = tiling.tokens * tiling.hidden * dtype.itemsize >= STREAM_MIN_BYTES
    return _native.forward_record(
        _dtype_code(dtype), tiling.tokens, tiling.blocks, tiling.hidden,
        tiling.used_core_num, tiling.former_core_num, tiling.former_core_tokens, tiling.tail_core_tokens,
        tiling.tokens_per_loop, tiling.h_tile, tiling.h_tile_num, tiling.h_last_tile,
        tiling.norm_eps, stream)  # fmt: skip


def backward_record(tiling: BackwardTilingData, dtype: torch.dtype) -> object:
    """The launch record (checked likewise) of a backward tiling."""
    output_bytes = (tiling.blocks + 1) * tiling.tokens * tiling.hidden * dtype.itemsize
    stream = output_bytes >= STREAM_MIN_BYTES
    return _native.backward_record(
        _dtype_code(dtype), tiling.tokens, tiling.blocks, tiling.hidden,
        tiling.used_core_num, tiling.former_core_num, tiling.former_core_chunks, tiling.tail_core_chunks,
        tiling.chunk_tokens, tiling.chunk_num, tiling.tokens_per_loop,
        tiling.h_tile, tiling.h_tile_num, tiling.h_last_tile,
        stream)  # fmt: skip


def _check_workspace(workspace: torch.Tensor, tiling: BackwardTilingData) -> int:
    chunk_bytes = tiling.chunk_num * tiling.hidden * 4
    if (workspace.device.type != "cpu" or not workspace.is_contiguous() or workspace.nbytes < chunk_bytes
            or workspace.data_ptr() % 4):
        raise ValueError(f"native kernel: the workspace must be a contiguous, 4-byte aligned CPU buffer of at least "
                         f"{chunk_bytes} bytes, got {workspace.nbytes} bytes on {workspace.device}")
    return workspace.data_ptr()


def block_attention_residuals_native(
    partial_block: torch.Tensor,  # [T, H]
    block_res: torch.Tensor,  # [T, N, H]
    proj_weight: torch.Tensor,  # [1, H] or [H]
    norm_weight: torch.Tensor,  # [H]
    hidden_states: torch.Tensor,  # [T, H] out, dtype of partial_block
    inv_norm: torch.Tensor,  # [T, N+1] float32 out when need_backward, else [0]
    probs: torch.Tensor,  # [T, N+1] float32 out when need_backward, else [0]
    workspace: torch.Tensor,  # unused by the forward
    tiling: ForwardTilingData,
) -> None:
    tokens, blocks, hidden = tiling.tokens, tiling.blocks, tiling.hidden
    dtype, stats = partial_block.dtype, tokens * (blocks + 1)
    _native.forward(
        forward_record(tiling, dtype),
        _address(partial_block, "partial_block", dtype, tokens * hidden),
        _address(block_res, "block_res", dtype, tokens * blocks * hidden),
        _address(proj_weight, "proj_weight", dtype, hidden),
        _address(norm_weight, "norm_weight", dtype, hidden),
        _address(hidden_states, "hidden_states", dtype, tokens * hidden),
        _address(inv_norm, "inv_norm", torch.float32, stats) if tiling.need_backward else 0,
        _address(probs, "probs", torch.float32, stats) if tiling.need_backward else 0,
        torch.get_num_threads(),
    )


def block_attention_residuals_grad_native(
    partial_block: torch.Tensor,  # [T, H]
    block_res: torch.Tensor,  # [T, N, H]
    proj_weight: torch.Tensor,  # [1, H]
    norm_weight: torch.Tensor,  # [H]
    grad_hidden_states: torch.Tensor,  # [T, H]
    inv_norm: torch.Tensor,  # [T, N+1] float32
    probs: torch.Tensor,  # [T, N+1] float32
    grad_partial_block: torch.Tensor,  # [T, H] out
    grad_block_res: torch.Tensor,  # [T, N, H] out
    grad_proj_weight: torch.Tensor,  # [1, H] out
    grad_norm_weight: torch.Tensor,  # [H] out
    workspace: torch.Tensor,  # uint8, >= chunk_num * H * 4 bytes: chunk rows [chunk_num, H] float32
    tiling: BackwardTilingData,
) -> None:
    tokens, blocks, hidden = tiling.tokens, tiling.blocks, tiling.hidden
    dtype, stats = partial_block.dtype, tokens * (blocks + 1)
    _native.backward(
        backward_record(tiling, dtype),
        _address(partial_block, "partial_block", dtype, tokens * hidden),
        _address(block_res, "block_res", dtype, tokens * blocks * hidden),
        _address(proj_weight, "proj_weight", dtype, hidden),
        _address(norm_weight, "norm_weight", dtype, hidden),
        _address(grad_hidden_states, "grad_hidden_states", dtype, tokens * hidden),
        _address(inv_norm, "inv_norm", torch.float32, stats),
        _address(probs, "probs", torch.float32, stats),
        _address(grad_partial_block, "grad_partial_block", dtype, tokens * hidden),
        _address(grad_block_res, "grad_block_res", dtype, tokens * blocks * hidden),
        _address(grad_proj_weight, "grad_proj_weight", dtype, hidden),
        _address(grad_norm_weight, "grad_norm_weight", dtype, hidden),
        _check_workspace(workspace, tiling),
        torch.get_num_threads(),
    )


# Launches for tensors that already match a tiling record (see KERNELS.launch in op_kernel): the
# launch record is made (and checked) once per plan and no tensor is checked per call.


class ForwardLaunch:
    """`launch(inputs, outputs, workspace)` of the forward for one tiling record and dtype."""

    def __init__(self, tiling: ForwardTilingData, dtype: torch.dtype):
        self.record = forward_record(tiling, dtype)  # also what the torch ops' C++ entry caches
        self._keep_stats = bool(tiling.need_backward)

    def __call__(self, inputs, outputs, workspace) -> None:
        hidden_states, inv_norm, probs = outputs
        keep_stats = self._keep_stats
        _native.forward(self.record, *[tensor.data_ptr() for tensor in inputs], hidden_states.data_ptr(),
                        inv_norm.data_ptr() if keep_stats else 0, probs.data_ptr() if keep_stats else 0,
                        torch.get_num_threads())


class BackwardLaunch:
    """`launch(inputs, outputs, workspace)` of the backward for one tiling record and dtype."""

    def __init__(self, tiling: BackwardTilingData, dtype: torch.dtype):
        self.record = backward_record(tiling, dtype)

    def __call__(self, inputs, outputs, workspace) -> None:
        _native.backward(self.record, *[tensor.data_ptr() for tensor in (*inputs, *outputs, workspace)],
                         torch.get_num_threads())
