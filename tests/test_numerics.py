"""Forward and backward against the float64 reference, every output, every dtype, odd shapes."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import (
    DTYPE_IDS,
    FORWARD_KERNEL,
    HOST_SAMPLE,
    assert_bitwise_equal,
    assert_close_to_reference,
    host_id,
    make_inputs,
    process_runtime_on,
    reference_with_grads,
)

import attnres_ge
from attnres_ge.op_kernel.reference import (
    STATISTICS_ALLOWANCE,
    block_attention_residuals_grad_reference,
    gradient_term_scale,
)
from attnres_ge.op_proto import FORWARD, TensorMeta

forward_op = torch.ops.attnres.block_attention_residuals
backward_op = torch.ops.attnres.block_attention_residuals_backward
BACKWARD_NAMES = ("grad_partial_block", "grad_block_res", "grad_proj_weight", "grad_norm_weight")

SHAPES = [
    pytest.param(16, 4, 64, id="T16-N4-H64"),
    pytest.param(0, 3, 32, id="T0-N3-H32"),
    pytest.param(1, 1, 8, id="T1-N1-H8"),
    pytest.param(5, 2, 1, id="T5-N2-H1"),
    pytest.param(67, 37, 1000, id="T67-N37-H1000"),
    pytest.param(9, 100, 48, id="T9-N100-H48"),
]
DTYPES = [pytest.param(d, id=i) for d, i in DTYPE_IDS.items()]


def run_forward_backward(inputs, grad_hidden):
    hidden, inv_norm, probs = forward_op(*inputs, -1, 1e-6, True)
    grads = backward_op(*inputs[:2], inputs[2].reshape(1, -1), inputs[3], grad_hidden, inv_norm, probs)
    outputs = {"hidden_states": hidden, "inv_norm": inv_norm, "probs": probs}
    return {**outputs, **dict(zip(BACKWARD_NAMES, grads, strict=True))}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "blocks", "hidden"), SHAPES)
def test_ops_match_reference(tokens, blocks, hidden, dtype):
    inputs = make_inputs(tokens, blocks, hidden, dtype)
    grad_hidden = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(1)).to(dtype)
    actual = run_forward_backward(inputs, grad_hidden)
    expected = reference_with_grads(inputs, grad_hidden)
    for name, value in actual.items():
        assert value.is_contiguous(), name
        tolerance_dtype = torch.float32 if name in ("inv_norm", "probs") else dtype  # float32 statistics
        assert_close_to_reference(name, value, expected[name], tolerance_dtype)
    assert actual["hidden_states"].dtype == dtype
    assert actual["probs"].dtype == actual["inv_norm"].dtype == torch.float32
    assert actual["grad_proj_weight"].shape == (1, hidden)


@pytest.mark.parametrize("blocks", [0, 128], ids=["N0", "N128"])
def test_backward_block_count_limits(blocks):
    """The backward accepts 0 <= N <= 128 (the forward needs N >= 1, so stats come from the reference)."""
    inputs = make_inputs(12, blocks, 40)
    grad_hidden = torch.randn(12, 40, generator=torch.Generator().manual_seed(2))
    expected = reference_with_grads(inputs, grad_hidden)
    grads = backward_op(*inputs, grad_hidden, expected["inv_norm"].float(), expected["probs"].float())
    names = ("grad_partial_block", "grad_block_res", "grad_proj_weight", "grad_norm_weight")
    for name, grad in zip(names, grads, strict=True):
        assert_close_to_reference(name, grad, expected[name], torch.float32)


def test_backward_with_no_tokens_gives_zero_weight_gradients():
    inputs = make_inputs(0, 3, 16)
    empty = torch.empty(0, 4)
    grad_partial, grad_blocks, grad_proj, grad_norm = backward_op(*inputs, torch.empty(0, 16), empty, empty)
    assert grad_partial.shape == (0, 16) and grad_blocks.shape == (0, 3, 16)
    assert torch.equal(grad_proj, torch.zeros(1, 16)) and torch.equal(grad_norm, torch.zeros(16))


def host_tiling(runtime, tokens, blocks, hidden, dtype):
    metas = {
        "partial_block": TensorMeta((tokens, hidden), dtype),
        "block_res": TensorMeta((tokens, blocks, hidden), dtype),
    }
    return runtime.tiling(FORWARD_KERNEL, metas, FORWARD.bind_attrs({"need_backward": True}))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("profile", HOST_SAMPLE)
def test_hidden_split_into_tiles_matches_reference(profile, dtype):
    """On a host whose L2 one token's rows overflow, the ops run the split variant, within tolerance."""
    tokens, blocks = 3, 6
    hidden = profile.ub_size // 8 + 5  # 7 rows of 4-byte columns: over 3x the L2 (and not a multiple of 16)
    with process_runtime_on(profile) as runtime:
        tiling = host_tiling(runtime, tokens, blocks, hidden, dtype)
        assert tiling.data.h_tile_num > 1, f"expected the split variant for H={hidden} on {runtime.platform}"
        inputs = make_inputs(tokens, blocks, hidden, dtype)
        grad_hidden = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(3)).to(dtype)
        actual = run_forward_backward(inputs, grad_hidden)
    expected = reference_with_grads(inputs, grad_hidden)
    for name, value in actual.items():
        assert_close_to_reference(name, value, expected[name], dtype if value.dtype == dtype else torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ops_give_the_same_bits_on_every_host(dtype):
    """Forward and backward through the torch ops, run as on hosts of 1-64 cores and 256 KiB-2 MiB of L2: the
    same bits everywhere (the shape is whole rows on some of these hosts, hidden tiles on others)."""
    tokens, blocks, hidden = 150, 7, 7000
    inputs = make_inputs(tokens, blocks, hidden, dtype, seed=11)
    grad_hidden = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(12)).to(dtype)
    results, variants = {}, set()
    for param in HOST_SAMPLE:
        profile = param.values[0]
        with process_runtime_on(profile) as runtime:
            variants.add(host_tiling(runtime, tokens, blocks, hidden, dtype).data.h_tile_num > 1)
            results[host_id(profile)] = run_forward_backward(inputs, grad_hidden)
    assert variants == {False, True}, "the sampled hosts should cover both the whole-row and the split variant"
    (first_host, first), *others = results.items()
    for other_host, other in others:
        for name in first:
            assert_bitwise_equal(f"{name} on {other_host} vs {first_host}", other[name], first[name])


def test_non_contiguous_inputs_are_accepted():
    partial, blocks, proj, norm = make_inputs(10, 3, 24)
    blocks_t = blocks.transpose(0, 1).contiguous().transpose(0, 1)  # same values, strided
    partial_t = partial.t().contiguous().t()
    proj_offset = torch.cat([torch.zeros(1, 1), proj], dim=1)[:, 1:]
    assert not blocks_t.is_contiguous() and not partial_t.is_contiguous()
    expected, _, _ = forward_op(partial, blocks, proj, norm)
    actual, _, _ = forward_op(partial_t, blocks_t, proj_offset, norm[:])
    assert actual.is_contiguous()
    assert torch.equal(actual, expected)


def test_nan_and_inf_propagate_without_crashing():
    partial, blocks, proj, norm = make_inputs(4, 2, 8)
    partial[1, 3] = math.nan
    blocks[2, 0, 0] = math.inf
    hidden, inv_norm, probs = forward_op(partial, blocks, proj, norm, -1, 1e-6, True)
    assert torch.isnan(hidden[1]).all() and torch.isnan(probs[1]).all()
    assert not torch.isfinite(hidden[2]).all()
    assert torch.isfinite(hidden[[0, 3]]).all()
    grads = backward_op(partial, blocks, proj, norm, torch.ones(4, 8), inv_norm, probs)
    assert torch.isnan(grads[0][1]).all()
    assert torch.isfinite(grads[0][[0, 3]]).all()


def test_public_function_and_module_are_differentiable():
    inputs = make_inputs(20, 3, 32)
    leaves = [t.clone().requires_grad_() for t in inputs]
    grad_hidden = torch.randn(20, 32, generator=torch.Generator().manual_seed(4))
    attnres_ge.block_attention_residuals(*leaves).backward(grad_hidden)
    expected = reference_with_grads(inputs, grad_hidden)
    names = ("grad_partial_block", "grad_block_res", "grad_proj_weight", "grad_norm_weight")
    for name, leaf in zip(names, leaves, strict=True):
        assert_close_to_reference(name, leaf.grad, expected[name], torch.float32)

    layer = attnres_ge.BlockAttnRes(32)
    out = layer(leaves[0], leaves[1])
    out.sum().backward()
    assert layer.proj_weight.grad.shape == (1, 32) and layer.norm_weight.grad.shape == (32,)


def test_proj_weight_of_shape_h_gets_gradient_of_shape_h():
    partial, blocks, proj, norm = make_inputs(6, 2, 16, proj_shape=(16,))
    proj.requires_grad_()
    attnres_ge.block_attention_residuals(partial, blocks, proj, norm).sum().backward()
    assert proj.grad.shape == (16,)


def test_direct_op_call_without_saved_stats_still_differentiates():
    """need_backward=False yet a gradient is asked for: the backward computes the statistics itself."""
    inputs = make_inputs(8, 2, 16)
    leaves = [t.clone().requires_grad_() for t in inputs]
    hidden, inv_norm, probs = forward_op(*leaves, -1, 1e-6, False)
    assert inv_norm.shape == (0,) and probs.shape == (0,)
    hidden.sum().backward()
    expected = reference_with_grads(inputs, torch.ones(8, 16))
    assert_close_to_reference("grad_block_res", leaves[1].grad, expected["grad_block_res"], torch.float32)


def test_results_are_deterministic():
    inputs = make_inputs(70, 5, 96)
    grad_hidden = torch.randn(70, 96, generator=torch.Generator().manual_seed(5))
    first = run_forward_backward(inputs, grad_hidden)
    second = run_forward_backward(inputs, grad_hidden)
    for name in first:
        assert torch.equal(first[name], second[name]), name


def test_gradcheck_through_the_public_function():
    """gradcheck's float64 leaves pass through the float32 op (the op accepts no float64), so the
    finite-difference step and tolerances are sized for float32 rounding."""
    inputs = [t.double().requires_grad_() for t in make_inputs(5, 3, 12, seed=7)]

    def fn(partial, blocks, proj, norm):
        out = attnres_ge.block_attention_residuals(partial.float(), blocks.float(), proj.float(), norm.float())
        return out.double()

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-3, atol=2e-3, rtol=2e-2, nondet_tol=0.0)


# Unit-variance proj_weight and norm_weight: scores of magnitude ~sqrt(H), a peaked softmax over depth, and
# backward terms of magnitude ~sqrt(H) that cancel. The kernels sum each row's dots over H in float64 lanes
# and keep norms, scores, softmax and the backward's coefficients in float64 until stored; with float32
# lanes and float32 scores these checks failed at H >= 4096 (probs and hidden_states by up to 2.3e-4).
LARGE_HIDDEN = [pytest.param(h, id=f"H{h}") for h in (4096, 8192, 16384)]


def unit_scale_inputs(tokens, blocks, hidden, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shapes = [(tokens, hidden), (tokens, blocks, hidden), (1, hidden), (hidden,), (tokens, hidden)]
    return tuple(torch.randn(shape, generator=generator).to(dtype) for shape in shapes)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", LARGE_HIDDEN)
def test_peaked_softmax_at_large_hidden_meets_spec(hidden, dtype):
    """The forward against the float64 reference, and the backward op against the float64 evaluation of
    its formulas from the same (already rounded) inputs it receives: the forward's float32 statistics."""
    *inputs, grad_hidden = unit_scale_inputs(24, 8, hidden, dtype)
    expected = reference_with_grads(inputs, grad_hidden)
    hidden_states, inv_norm, probs = forward_op(*inputs, -1, 1e-6, True)
    for name, value in (("hidden_states", hidden_states), ("inv_norm", inv_norm), ("probs", probs)):
        assert_close_to_reference(name, value, expected[name], dtype if value.dtype == dtype else torch.float32)
    grads = backward_op(*inputs, grad_hidden, inv_norm, probs)
    expected_grads = block_attention_residuals_grad_reference(*inputs, grad_hidden, inv_norm, probs)
    for name, grad, reference in zip(BACKWARD_NAMES, grads, expected_grads, strict=True):
        assert_close_to_reference(name, grad, reference.reshape(grad.shape), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", LARGE_HIDDEN)
def test_composed_gradients_at_large_hidden_meet_spec(hidden, dtype):
    """Forward then backward through the public function against autograd of the float64 reference. The
    backward receives the forward's float32 statistics, off by a relative ~2^-24 from the exact ones, and its
    terms (of size S ~ sqrt(H) here) cancel: the input gradients get the contract's tolerance plus
    STATISTICS_ALLOWANCE * S (docs/contract.md), the weight gradients the contract's tolerance."""
    *inputs, grad_hidden = unit_scale_inputs(24, 8, hidden, dtype, seed=1)
    leaves = [t.clone().requires_grad_() for t in inputs]
    attnres_ge.block_attention_residuals(*leaves).backward(grad_hidden)
    expected = reference_with_grads(inputs, grad_hidden)
    scales = gradient_term_scale(*inputs, grad_hidden, expected["inv_norm"], expected["probs"])
    allowances = {name: STATISTICS_ALLOWANCE * scale for name, scale in zip(BACKWARD_NAMES[:2], scales, strict=True)}
    for name, leaf in zip(BACKWARD_NAMES, leaves, strict=True):
        assert_close_to_reference(name, leaf.grad, expected[name].reshape(leaf.grad.shape), dtype, allowances.get(name))
