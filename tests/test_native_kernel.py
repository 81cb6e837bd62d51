"""The native (C++/OpenMP) kernels: float64-reference parity, bitwise invariance, determinism, dispatch.

The foundation's kernel tests (test_kernel_invariance.py, test_numerics.py, ...) run
through KERNELS and so through the native kernels when they are built; these add
cases aimed at the native code paths: lane tails (H % 16 != 0), hidden tiles
from several buffer sizes, core counts 1..8, all three dtypes, and the dispatch.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from conftest import (
    BACKWARD_KERNEL,
    DTYPE_IDS,
    FORWARD_KERNEL,
    assert_bitwise_equal,
    assert_close_to_reference,
    make_inputs,
    reference_with_grads,
)

import attnres_ge.op_kernel as op_kernel
from attnres_ge.op_host import block_attention_residuals_grad_tiling as grad_tiling
from attnres_ge.op_host import block_attention_residuals_tiling as forward_tiling
from attnres_ge.op_host.platform import PlatformInfo, PlatformProfile
from attnres_ge.op_kernel.reference import block_attention_residuals_grad_reference, block_attention_residuals_reference

pytestmark = pytest.mark.skipif(
    not op_kernel.native_available(), reason=f"native kernels not built: {op_kernel.NATIVE_UNAVAILABLE_REASON}"
)

FORWARD_NAMES = ("hidden_states", "inv_norm", "probs")
BACKWARD_NAMES = ("grad_partial_block", "grad_block_res", "grad_proj_weight", "grad_norm_weight")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ROOMY_UB = 1 << 22  # whole rows, many tokens a loop


def platform(cores: int, ub_size: int) -> PlatformInfo:
    return PlatformInfo(PlatformProfile("test", cores, ub_size))


def run_forward(inputs, cores=2, ub_size=ROOMY_UB, implementation="native", need_backward=True, norm_eps=1e-6):
    partial, blocks, _, _ = inputs
    tokens, count, hidden = blocks.shape
    plat = platform(cores, ub_size)
    result = forward_tiling.tiling(
        forward_tiling.parse(plat), tokens, count, hidden, partial.dtype, norm_eps, need_backward, plat
    )
    stat_shape = (tokens, count + 1) if need_backward else (0,)
    outputs = (torch.empty_like(partial), torch.empty(stat_shape), torch.empty(stat_shape))
    kernel = op_kernel.kernel(FORWARD_KERNEL, implementation)
    kernel(*inputs, *outputs, torch.empty(0, dtype=torch.uint8), result.data)
    return outputs, result


def run_backward(inputs, stats, grad_hidden, cores=2, ub_size=ROOMY_UB, implementation="native"):
    partial, blocks, proj, norm = inputs
    tokens, count, hidden = blocks.shape
    plat = platform(cores, ub_size)
    result = grad_tiling.tiling(grad_tiling.parse(plat), tokens, count, hidden, partial.dtype, plat)
    # Outputs start as NaN so that an element the kernel forgets to write shows up.
    outputs = tuple(torch.full_like(t, float("nan")) for t in (partial, blocks, proj, norm))
    workspace = torch.full((result.workspace_size,), 0xFF, dtype=torch.uint8)  # NaN-filled chunk rows
    kernel = op_kernel.kernel(BACKWARD_KERNEL, implementation)
    kernel(*inputs, grad_hidden, *stats, *outputs, workspace, result.data)
    return outputs, result


def backward_case(tokens, blocks, hidden, dtype, seed=0):
    """Inputs, the reference's float32 statistics, grad_hidden_states and the float64 reference."""
    inputs = make_inputs(tokens, blocks, hidden, dtype, seed=seed)
    grad_hidden = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(seed + 7)).to(dtype)
    if blocks == 0:  # the forward needs N >= 1; the backward's maths holds for N = 0 (one row, p = 1)
        leaves = [t.detach().double().requires_grad_() for t in inputs]
        values = leaves[0].unsqueeze(1)
        inv_norm = torch.rsqrt(values.pow(2).mean(dim=-1) + 1e-6)
        scores = inv_norm * (values * (leaves[3] * leaves[2].reshape(-1))).sum(dim=-1)
        probs = torch.softmax(scores, dim=-1)
        hidden_states = (probs.unsqueeze(-1) * values).sum(dim=1)
        hidden_states.backward(grad_hidden.double())
        grads = [leaf.grad if leaf.grad is not None else torch.zeros_like(leaf) for leaf in leaves]  # [T, 0, H]
        expected = dict(zip(BACKWARD_NAMES, grads, strict=True))
        stats = (inv_norm.detach().float(), probs.detach().float())
    else:
        reference = reference_with_grads(inputs, grad_hidden)
        expected = {name: reference[name] for name in BACKWARD_NAMES}
        stats = (reference["inv_norm"].float(), reference["probs"].float())
    return inputs, stats, grad_hidden, expected


# (T, N, H): lane tails, H = 1, a wide H, one token, an empty batch, token counts that leave partial chunks.
SHAPES = [(0, 3, 16), (1, 1, 1), (5, 2, 1), (7, 3, 37), (33, 5, 1000), (130, 8, 64), (66, 1, 17)]
# Buffer sizes: whole rows, and ever smaller hidden tiles (the split-H variant for the wider shapes).
UB_SIZES = [ROOMY_UB, 8192, 4096]


def case_id(shape, dtype, ub_size):
    tokens, blocks, hidden = shape
    return f"T{tokens}-N{blocks}-H{hidden}-{DTYPE_IDS[dtype]}-ub{ub_size}"


PARITY_CASES = [
    pytest.param(shape, dtype, ub, id=case_id(shape, dtype, ub)) for shape in SHAPES for dtype in DTYPES
    for ub in UB_SIZES
]


@pytest.mark.parametrize("shape, dtype, ub_size", PARITY_CASES)
def test_forward_matches_float64_reference(shape, dtype, ub_size):
    tokens, blocks, hidden = shape
    inputs = make_inputs(tokens, blocks, hidden, dtype, seed=tokens + hidden)
    reference = reference_with_grads(inputs, torch.zeros(tokens, hidden, dtype=dtype))
    outputs, _ = run_forward(inputs, cores=3, ub_size=ub_size)
    for name, actual in zip(FORWARD_NAMES, outputs, strict=True):
        assert_close_to_reference(name, actual, reference[name], dtype if name == "hidden_states" else torch.float32)


@pytest.mark.parametrize(
    "shape, dtype, ub_size",
    PARITY_CASES + [pytest.param((9, 0, 40), dtype, ub, id=case_id((9, 0, 40), dtype, ub))
                    for dtype in DTYPES for ub in UB_SIZES],
)
def test_backward_matches_float64_reference(shape, dtype, ub_size):
    inputs, stats, grad_hidden, expected = backward_case(*shape, dtype, seed=sum(shape))
    outputs, _ = run_backward(inputs, stats, grad_hidden, cores=3, ub_size=ub_size)
    for name, actual in zip(BACKWARD_NAMES, outputs, strict=True):
        assert_close_to_reference(name, actual, expected[name], dtype)


def test_forward_without_statistics_leaves_them_empty():
    inputs = make_inputs(9, 2, 50)
    with_stats, _ = run_forward(inputs, need_backward=True)
    without, _ = run_forward(inputs, need_backward=False)
    assert without[1].shape == (0,) and without[2].shape == (0,)
    assert_bitwise_equal("hidden_states", without[0], with_stats[0])


def test_empty_batch_gives_zero_weight_gradients():
    inputs, stats, grad_hidden, _ = backward_case(0, 4, 33, torch.float32)
    outputs, result = run_backward(inputs, stats, grad_hidden)
    assert result.workspace_size == 0
    assert torch.equal(outputs[2], torch.zeros(1, 33)) and torch.equal(outputs[3], torch.zeros(33))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
@pytest.mark.parametrize("shape", [(150, 6, 1000), (67, 3, 131)], ids=lambda s: "T{}-N{}-H{}".format(*s))
def test_bits_do_not_depend_on_cores_or_hidden_tiles(shape, dtype):
    """Core counts 1..8 crossed with buffer sizes that give several different hidden tiles."""
    tokens, blocks, hidden = shape
    inputs, stats, grad_hidden, _ = backward_case(tokens, blocks, hidden, dtype, seed=11)
    forward_base, _ = run_forward(inputs, cores=1)
    backward_base, _ = run_backward(inputs, stats, grad_hidden, cores=1)
    h_tiles = set()
    for cores, ub_size in [(2, ROOMY_UB), (3, 16384), (4, 8192), (5, 6144), (6, 4096), (7, 3072), (8, 2048),
                           (1, 2048), (8, ROOMY_UB)]:
        forward_out, forward_result = run_forward(inputs, cores, ub_size)
        backward_out, backward_result = run_backward(inputs, stats, grad_hidden, cores, ub_size)
        h_tiles.update({forward_result.data.h_tile, backward_result.data.h_tile})
        for name, a, b in zip(FORWARD_NAMES, forward_out, forward_base, strict=True):
            assert_bitwise_equal(f"{name} (cores={cores}, ub={ub_size})", a, b)
        for name, a, b in zip(BACKWARD_NAMES, backward_out, backward_base, strict=True):
            assert_bitwise_equal(f"{name} (cores={cores}, ub={ub_size})", a, b)
    assert len(h_tiles) >= 4, f"the buffer sizes should give several hidden tiles, got {sorted(h_tiles)}"


# The forward sums 16-bit inputs in short float32 runs (op_kernel/csrc/forward_kernel.h, kRunGroups) and
# sums a row again in float64 lanes where float32 would have lost bits. Each case: (value scale, weight
# scale, norm_eps); one row of every token is zero.
RUN_EDGE_HIDDEN = 1100  # whole runs of 512 elements (kRunGroups 32) and a partial one: 512, 512, 76
RUN_EDGE_CASES = {
    "squares-beyond-float32": (1e25, 1.0, 1e-6),  # v^2 ~ 1e50 overflows float32
    "squares-float32-subnormal": (1e-22, 1.0, 2.0**-149),  # v^2 ~ 1e-44, larger than eps
    "weight-beyond-float32": (1.0, 1e25, 1e-6),  # w = norm * proj ~ 1e49: no float32 runs at all
    "plain": (1.0, 1.0, 1e-6),
}


@pytest.mark.parametrize("dtype, case", [(torch.bfloat16, case) for case in RUN_EDGE_CASES] +
                         [(torch.float16, "plain")])  # float16's range keeps its terms inside float32's
def test_16bit_values_float32_runs_cannot_hold_meet_the_reference(dtype, case):
    value_scale, weight_scale, norm_eps = RUN_EDGE_CASES[case]
    partial, blocks, proj, norm = make_inputs(24, 3, RUN_EDGE_HIDDEN, seed=13)
    blocks[:, 1] = 0.0
    inputs = ((partial * value_scale).to(dtype), (blocks * value_scale).to(dtype), (proj * weight_scale).to(dtype),
              (norm * weight_scale).to(dtype))
    outputs, _ = run_forward(inputs, norm_eps=norm_eps)
    expected = block_attention_residuals_reference(*inputs, norm_eps=norm_eps)
    for name, actual, reference in zip(FORWARD_NAMES, outputs, expected, strict=True):
        assert torch.isfinite(actual).all(), f"{name}: not finite"
        assert_close_to_reference(name, actual, reference, actual.dtype)  # the statistics: float32's tolerance


# The backward sums go * v and w * v the same way (op_kernel/csrc/kernel_loops.h, kRunGroups). Each case: (value
# scale, gradient scale, weight scale, norm_eps); one row of every token is zero, and every token's go in the
# "gradient-zero" case (exact zero sums the runs need not sum again).
BACKWARD_RUN_EDGE_CASES = {
    "products-beyond-float32": (1e20, 1e20, 1.0, 1e30),  # go * v ~ 1e40 overflows float32 (the eps keeps the
    # zero row's r, and so its gradient, inside bfloat16's range)
    "products-float32-subnormal": (1e-22, 1e-22, 1.0, 2.0**-149),  # go * v ~ 1e-44
    "gradient-tiny": (1.0, 1e-30, 1.0, 1e-6),  # sums of go * v ~ 1e-29: summed again, go not zero
    "weight-below-float32": (1.0, 1.0, 1e-25, 1e-6),  # w = norm * proj ~ 1e-50: no float32 runs at all
    "gradient-zero": (1.0, 0.0, 1.0, 1e-6),
    "plain": (1.0, 1.0, 1.0, 1e-6),
}


@pytest.mark.parametrize("dtype, case", [(torch.bfloat16, case) for case in BACKWARD_RUN_EDGE_CASES] +
                         [(torch.float16, "plain")])  # float16's range keeps its terms inside float32's
def test_16bit_gradients_float32_runs_cannot_hold_meet_the_reference(dtype, case):
    """The backward op against the float64 evaluation of its formulas from the statistics it receives; the
    input gradients scaled by 1 / gradient scale first, so that tiny ones are held to the relative tolerance."""
    value_scale, grad_scale, weight_scale, norm_eps = BACKWARD_RUN_EDGE_CASES[case]
    partial, blocks, proj, norm = make_inputs(24, 3, RUN_EDGE_HIDDEN, seed=17)
    blocks[:, 1] = 0.0
    inputs = ((partial * value_scale).to(dtype), (blocks * value_scale).to(dtype), (proj * weight_scale).to(dtype),
              (norm * weight_scale).to(dtype))
    grad_hidden = (torch.randn(partial.shape, generator=torch.Generator().manual_seed(3)) * grad_scale).to(dtype)
    (_, inv_norm, probs), _ = run_forward(inputs, norm_eps=norm_eps)
    grads, _ = run_backward(inputs, (inv_norm, probs), grad_hidden)
    expected = block_attention_residuals_grad_reference(*inputs, grad_hidden, inv_norm, probs)
    unscale = 1.0 / grad_scale if grad_scale != 0.0 else 1.0
    # Beyond float32, the weight gradients (sums of a v ~ go v) overflow the float32 chunk rows and the dtype
    # whatever pass 1 does: the input gradients only.
    checked = 2 if case == "products-beyond-float32" else len(BACKWARD_NAMES)
    for name, actual, reference in list(zip(BACKWARD_NAMES, grads, expected, strict=True))[:checked]:
        assert torch.isfinite(actual).all(), f"{name}: not finite"
        if name in ("grad_partial_block", "grad_block_res"):
            actual, reference = actual.double() * unscale, reference.double() * unscale
        assert_close_to_reference(name, actual, reference.reshape(actual.shape), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_repeated_calls_give_the_same_bits(dtype):
    inputs, stats, grad_hidden, _ = backward_case(300, 7, 517, dtype, seed=5)
    forward_first, _ = run_forward(inputs)
    backward_first, _ = run_backward(inputs, stats, grad_hidden)
    for _ in range(4):
        for name, a, b in zip(FORWARD_NAMES, run_forward(inputs)[0], forward_first, strict=True):
            assert_bitwise_equal(name, a, b)
        for name, a, b in zip(BACKWARD_NAMES, run_backward(inputs, stats, grad_hidden)[0], backward_first,
                              strict=True):
            assert_bitwise_equal(name, a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS.get)
def test_streaming_stores_write_the_same_bits(dtype, monkeypatch, restore_isa_path):
    """The non-temporal store path (large outputs only by default) against the ordinary one, on every instruction
    set path this CPU runs (each has its own streaming stores); H = 1040 keeps rows 32-byte aligned."""
    from attnres_ge.op_kernel import native

    inputs, stats, grad_hidden, _ = backward_case(70, 3, 1040, dtype, seed=4)
    for path in native.available_isa_paths():
        native.use_isa_path(path)
        monkeypatch.setattr(native, "STREAM_MIN_BYTES", 1 << 62)
        plain = run_forward(inputs)[0] + run_backward(inputs, stats, grad_hidden)[0]
        monkeypatch.setattr(native, "STREAM_MIN_BYTES", 0)
        streamed = run_forward(inputs)[0] + run_backward(inputs, stats, grad_hidden)[0]
        for name, a, b in zip(FORWARD_NAMES + BACKWARD_NAMES, streamed, plain, strict=True):
            assert_bitwise_equal(f"{path}: {name}", a, b)


def test_native_agrees_with_the_python_oracle():
    inputs, stats, grad_hidden, _ = backward_case(70, 4, 200, torch.float32, seed=2)
    native_forward, _ = run_forward(inputs, cores=2, ub_size=8192)
    python_forward, _ = run_forward(inputs, cores=2, ub_size=8192, implementation="python")
    for name, a, b in zip(FORWARD_NAMES, native_forward, python_forward, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6, msg=lambda m, name=name: f"{name}: {m}")
    native_backward, _ = run_backward(inputs, stats, grad_hidden, cores=2, ub_size=8192)
    python_backward, _ = run_backward(inputs, stats, grad_hidden, cores=2, ub_size=8192, implementation="python")
    for name, a, b in zip(BACKWARD_NAMES, native_backward, python_backward, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-5, atol=2e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_nan_and_inf_propagate_without_crashing():
    partial, blocks, proj, norm = make_inputs(6, 3, 40)
    blocks[1, 2, 5] = float("nan")
    partial[3, 7] = float("inf")
    outputs, _ = run_forward((partial, blocks, proj, norm))
    assert torch.isnan(outputs[0][1]).all() and torch.isfinite(outputs[0][[0, 2, 4, 5]]).all()
    stats = (outputs[1], outputs[2])
    grads, _ = run_backward((partial, blocks, proj, norm), stats, torch.randn(6, 40))
    assert torch.isfinite(grads[0][[0, 2, 4, 5]]).all()


def test_a_record_that_does_not_match_the_tensors_is_refused():
    inputs = make_inputs(10, 2, 32)
    plat = platform(2, ROOMY_UB)
    result = forward_tiling.tiling(forward_tiling.parse(plat), 12, 2, 32, torch.float32, 1e-6, True, plat)
    outputs = (torch.empty(10, 32), torch.empty(10, 3), torch.empty(10, 3))
    with pytest.raises(ValueError, match="partial_block must be a contiguous CPU torch.float32 tensor of 384"):
        op_kernel.kernel(FORWARD_KERNEL, "native")(*inputs, *outputs, torch.empty(0, dtype=torch.uint8), result.data)


def test_a_record_that_does_not_cover_the_shape_is_refused():
    """The C++ side refuses a record whose core split or hidden tiles would step outside the tensors."""
    inputs = make_inputs(10, 2, 40)
    outputs, result = run_forward(inputs, cores=3, ub_size=2048)
    kernel = op_kernel.kernel(FORWARD_KERNEL, "native")
    empty = torch.empty(0, dtype=torch.uint8)
    bad_tiles = dataclasses.replace(result.data, h_last_tile=result.data.h_last_tile + 16)
    with pytest.raises(ValueError, match="do not tile H=40"):
        kernel(*inputs, *outputs, empty, bad_tiles)
    bad_split = dataclasses.replace(result.data, tail_core_tokens=result.data.tail_core_tokens + 1)
    with pytest.raises(ValueError, match="does not cover 10 items"):
        kernel(*inputs, *outputs, empty, bad_split)


def test_the_eager_op_runs_the_native_kernel():
    inputs = make_inputs(20, 3, 48)
    assert op_kernel.active_implementation() == "native"
    hidden, inv_norm, probs = torch.ops.attnres.block_attention_residuals(*inputs, -1, 1e-6, True)
    direct, _ = run_forward(inputs, cores=5)  # the bits do not depend on the host's core count
    for name, a, b in zip(FORWARD_NAMES, (hidden, inv_norm, probs), direct, strict=True):
        assert_bitwise_equal(name, a, b)


def test_switching_implementation_reaches_plans_already_cached(monkeypatch):
    inputs = make_inputs(19, 3, 56)  # a signature no other test plans, so no Python launch is cached yet
    torch.ops.attnres.block_attention_residuals(*inputs, -1, 1e-6, True)  # planned, launched natively
    made = []
    python_launch = op_kernel._python_launch

    def spy(op, tiling):
        made.append(tiling)
        return python_launch(op, tiling)

    monkeypatch.setattr(op_kernel, "_python_launch", spy)
    try:
        op_kernel.KERNELS.set_implementation("python")
        outputs = torch.ops.attnres.block_attention_residuals(*inputs, -1, 1e-6, True)
        outputs_again = torch.ops.attnres.block_attention_residuals(*inputs, -1, 1e-6, True)
    finally:
        op_kernel.KERNELS.set_implementation(None)
    assert len(made) == 1  # the cached plan got a Python launch once, then reused it
    direct, _ = run_forward(inputs, implementation="python")
    for name, a, b, c in zip(FORWARD_NAMES, outputs, outputs_again, direct, strict=True):
        assert_bitwise_equal(name, a, c)
        assert_bitwise_equal(name, b, c)


class TestDispatch:
    def test_kernel_names_both_implementations(self):
        assert op_kernel.kernel(FORWARD_KERNEL, "native").__module__.endswith("native")
        assert op_kernel.kernel(FORWARD_KERNEL, "python") is FORWARD_KERNEL.python
        with pytest.raises(ValueError, match="unknown kernel implementation"):
            op_kernel.kernel(FORWARD_KERNEL, "cuda")

    def test_environment_forces_an_implementation(self, monkeypatch):
        try:
            monkeypatch.setenv(op_kernel.KERNEL_ENV, "python")
            op_kernel.KERNELS.set_implementation(None)
            assert op_kernel.active_implementation() == "python"
            monkeypatch.setenv(op_kernel.KERNEL_ENV, "native")
            op_kernel.KERNELS.set_implementation(None)
            assert op_kernel.active_implementation() == "native"
            monkeypatch.setenv(op_kernel.KERNEL_ENV, "fortran")
            op_kernel.KERNELS.set_implementation(None)
            with pytest.raises(ValueError, match="ATTNRES_GE_KERNEL='fortran'"):
                op_kernel.active_implementation()
        finally:
            monkeypatch.delenv(op_kernel.KERNEL_ENV)
            op_kernel.KERNELS.set_implementation(None)

    def test_missing_extension_falls_back_with_one_warning(self, monkeypatch):
        monkeypatch.delenv(op_kernel.KERNEL_ENV, raising=False)
        monkeypatch.setattr(op_kernel, "_native_module", None)
        monkeypatch.setattr(op_kernel, "NATIVE_UNAVAILABLE_REASON", "it was not built (test)")
        try:
            op_kernel.KERNELS.set_implementation(None)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                assert op_kernel.KERNELS.kernel(FORWARD_KERNEL) is FORWARD_KERNEL.python
                assert op_kernel.KERNELS.kernel(BACKWARD_KERNEL) is BACKWARD_KERNEL.python
            fallback = op_kernel.NativeKernelUnavailableWarning
            messages = [str(w.message) for w in caught if issubclass(w.category, fallback)]
            assert len(messages) == 1 and "not built (test)" in messages[0] and "pip install" in messages[0]
            with pytest.raises(ImportError, match="not built"):
                op_kernel.kernel(FORWARD_KERNEL, "native")
        finally:
            monkeypatch.undo()
            op_kernel.KERNELS.set_implementation(None)
