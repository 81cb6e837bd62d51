"""Shared helpers: seeded inputs, the float64 oracle and named comparisons."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from attnres_ge import block_attention_residuals_reference
from attnres_ge.ge_plugin.op_common import forget_cached_launches
from attnres_ge.op_host.platform import HOST_SOC, KIB, PlatformInfo, PlatformProfile
from attnres_ge.op_kernel import launcher as runtime_module
from attnres_ge.op_kernel.block_attention_residuals import KERNEL as FORWARD_KERNEL
from attnres_ge.op_kernel.block_attention_residuals_grad import KERNEL as BACKWARD_KERNEL
from attnres_ge.op_kernel.reference import max_violation

KERNELS_BY_TYPE = {kernel.op_type: kernel for kernel in (FORWARD_KERNEL, BACKWARD_KERNEL)}

DTYPE_IDS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
WEIGHT_GRADS = ("grad_proj_weight", "grad_norm_weight")

# The hosts the suite simulates, so that no test result depends on the machine running it:
# x86-64 hosts with 1-64 usable cores and 256 KiB-2 MiB of L2 per core.
HOST_CORES = (1, 2, 16, 64)
HOST_L2_SIZES = (256 * KIB, 512 * KIB, 1024 * KIB, 2048 * KIB)


def host(cores: int, l2_bytes: int) -> PlatformProfile:
    """A host CPU's profile as `host_profile()` would measure it on such a machine."""
    return PlatformProfile(HOST_SOC, vector_core_num=cores, ub_size=l2_bytes)


def host_id(profile: PlatformProfile) -> str:
    return f"{profile.vector_core_num}cores-{profile.ub_size // KIB}KiB"


# Every combination, for cheap tests (tiling decisions) ...
EVERY_HOST = [pytest.param(host(c, l2), id=host_id(host(c, l2))) for c in HOST_CORES for l2 in HOST_L2_SIZES]
# ... and each core count and L2 size once, for tests that run kernels.
HOST_SAMPLE = [pytest.param(host(c, l2), id=host_id(host(c, l2))) for c, l2 in zip(HOST_CORES, HOST_L2_SIZES,
                                                                                  strict=True)]


@contextmanager
def process_runtime_on(profile: PlatformProfile) -> Iterator[runtime_module.HostRuntime]:
    """Run the torch ops (eager and graph) as on a host with `profile`: the process runtime is replaced by one
    on that profile, and the C++ entry forgets the launches it planned on the real one (both undone after)."""
    saved = runtime_module._default
    simulated = runtime_module.HostRuntime(PlatformInfo(profile))
    runtime_module._default = simulated
    forget_cached_launches()
    try:
        yield simulated
    finally:
        runtime_module._default = saved
        forget_cached_launches()


def make_inputs(tokens, blocks, hidden, dtype=torch.float32, seed=0, proj_shape=None):
    """(partial_block [T, H], block_res [T, N, H], proj_weight [1, H], norm_weight [H]) in `dtype`."""
    generator = torch.Generator().manual_seed(seed)
    partial = torch.randn(tokens, hidden, generator=generator)
    blocks_t = torch.randn(tokens, blocks, hidden, generator=generator)
    proj = 0.5 * torch.randn(*(proj_shape or (1, hidden)), generator=generator) / max(hidden, 1) ** 0.5
    norm = 1 + 0.2 * torch.randn(hidden, generator=generator)
    return tuple(t.to(dtype) for t in (partial, blocks_t, proj, norm))


def reference_with_grads(inputs, grad_hidden, norm_eps=1e-6):
    """Float64 reference outputs and autograd gradients of the four inputs (from their rounded values)."""
    leaves = [t.detach().double().requires_grad_() for t in inputs]
    hidden, inv_norm, probs = block_attention_residuals_reference(*leaves, norm_eps=norm_eps)
    hidden.backward(grad_hidden.double())
    return {
        "hidden_states": hidden.detach(),
        "inv_norm": inv_norm.detach(),
        "probs": probs.detach(),
        "grad_partial_block": leaves[0].grad,
        "grad_block_res": leaves[1].grad,
        "grad_proj_weight": leaves[2].grad,
        "grad_norm_weight": leaves[3].grad,
    }


def assert_close_to_reference(name, actual, expected, dtype, allowance=None):
    """Within docs/contract.md's tolerance for `dtype` (float32 statistics always at float32 tolerance), plus
    `allowance` elementwise if given (gradients through float32 statistics: reference.gradient_term_scale)."""
    error, past = max_violation(actual, expected, dtype, whole_tensor=name in WEIGHT_GRADS, allowance=allowance)
    assert past <= 0, f"{name} ({dtype}) drifted from the float64 reference: max |err| {error:.3e}, over by {past:.3e}"


def python_frames(call) -> list[str]:
    """The Python functions that run during call(), less torch.ops' own entry (torch/_ops.py) and call
    itself: what a C++ entry calls back into Python, torch's or ours."""
    skipped = Path(torch._ops.__file__).resolve()
    frames = []

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and code is not call.__code__ and Path(code.co_filename).resolve() != skipped:
            frames.append(f"{code.co_filename}:{code.co_qualname}")

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return frames


def assert_bitwise_equal(name, actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (
        f"{name}: {actual.dtype}{list(actual.shape)} vs {expected.dtype}{list(expected.shape)}"
    )
    same = torch.equal(actual.view(torch.uint8) if actual.numel() else actual, expected.view(torch.uint8)
                       if expected.numel() else expected)
    assert same, f"{name} differs bitwise"


def assert_same_bits_but_nan_payloads(name, actual, expected):
    """The same bits wherever a result is a number; NaN at the same places. (Which NaN an operation
    meeting several NaNs returns is up to the instruction, so float32 and float16 NaNs may differ in
    sign and payload between instruction set paths; bfloat16 NaNs are always 0x7fc0.)"""
    nan = torch.isnan(expected)
    assert torch.equal(torch.isnan(actual), nan), f"{name}: NaN at different places"
    if expected.dtype == torch.bfloat16:
        assert_bitwise_equal(name, actual, expected)
    else:
        assert_bitwise_equal(name, actual[~nan], expected[~nan])


@pytest.fixture
def restore_isa_path():
    """Puts the native kernels back on the instruction set path they ran on before the test."""
    from attnres_ge.op_kernel import native  # only tests of the native kernels take this fixture

    before = native.isa_path()
    yield
    native.use_isa_path(before)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
