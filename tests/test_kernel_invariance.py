"""The kernels give the same bits for every core count and hidden tile Tiling can choose."""

from __future__ import annotations

import pytest
import torch
from conftest import BACKWARD_KERNEL, FORWARD_KERNEL, assert_bitwise_equal, make_inputs
from hypothesis import given, settings
from hypothesis import strategies as st

from attnres_ge.op_host import block_attention_residuals_grad_tiling as grad_tiling
from attnres_ge.op_host import block_attention_residuals_tiling as forward_tiling
from attnres_ge.op_host.platform import PlatformInfo, PlatformProfile
from attnres_ge.op_kernel import KERNELS

FORWARD_NAMES = ("hidden_states", "inv_norm", "probs")
BACKWARD_NAMES = ("grad_partial_block", "grad_block_res", "grad_proj_weight", "grad_norm_weight")


def platform(cores: int, ub_size: int) -> PlatformInfo:
    return PlatformInfo(PlatformProfile("test", cores, ub_size))


def run_forward(inputs, cores, ub_size):
    partial, blocks, proj, norm = inputs
    tokens, count, hidden = blocks.shape
    plat = platform(cores, ub_size)
    result = forward_tiling.tiling(forward_tiling.parse(plat), tokens, count, hidden, partial.dtype, 1e-6, True, plat)
    outputs = (torch.empty_like(partial), torch.empty(tokens, count + 1), torch.empty(tokens, count + 1))
    KERNELS.kernel(FORWARD_KERNEL)(*inputs, *outputs, torch.empty(0, dtype=torch.uint8), result.data)
    return outputs, result


def run_backward(inputs, stats, grad_hidden, cores, ub_size):
    partial, blocks, proj, norm = inputs
    tokens, count, hidden = blocks.shape
    plat = platform(cores, ub_size)
    result = grad_tiling.tiling(grad_tiling.parse(plat), tokens, count, hidden, partial.dtype, plat)
    outputs = tuple(torch.empty_like(t) for t in (partial, blocks, proj, norm))
    workspace = torch.empty(result.workspace_size, dtype=torch.uint8)
    KERNELS.kernel(BACKWARD_KERNEL)(*inputs, grad_hidden, *stats, *outputs, workspace, result.data)
    return outputs, result


DTYPES = st.sampled_from([torch.float32, torch.float16, torch.bfloat16])
# Buffer sizes from the L2 of large hosts (whole rows, many tokens a loop) down to a few lane groups of hidden.
UB_SIZES = st.sampled_from([2 << 20, 1 << 20, 512 << 10, 256 << 10, 196608, 32768, 8192, 4096])


@settings(max_examples=25, deadline=None)
@given(tokens=st.integers(0, 150), blocks=st.integers(1, 9), hidden=st.integers(1, 300), dtype=DTYPES,
       cores=st.integers(2, 64), ub_size=UB_SIZES, seed=st.integers(0, 2**16))
def test_forward_bits_do_not_depend_on_cores_or_tiles(tokens, blocks, hidden, dtype, cores, ub_size, seed):
    inputs = make_inputs(tokens, blocks, hidden, dtype, seed=seed)
    baseline, _ = run_forward(inputs, 1, 1 << 22)  # one core, whole rows
    variant, _ = run_forward(inputs, cores, ub_size)
    for name, a, b in zip(FORWARD_NAMES, variant, baseline, strict=True):
        assert_bitwise_equal(name, a, b)


@settings(max_examples=25, deadline=None)
@given(tokens=st.integers(0, 200), blocks=st.integers(0, 9), hidden=st.integers(1, 300), dtype=DTYPES,
       cores=st.integers(2, 64), ub_size=UB_SIZES, seed=st.integers(0, 2**16))
def test_backward_bits_do_not_depend_on_cores_or_tiles(tokens, blocks, hidden, dtype, cores, ub_size, seed):
    inputs = make_inputs(tokens, blocks, hidden, dtype, seed=seed)
    generator = torch.Generator().manual_seed(seed + 1)
    stats = (torch.rand(tokens, blocks + 1, generator=generator) + 0.5,
             torch.softmax(torch.randn(tokens, blocks + 1, generator=generator), dim=-1))
    grad_hidden = torch.randn(tokens, hidden, generator=generator).to(dtype)
    baseline, _ = run_backward(inputs, stats, grad_hidden, 1, 1 << 22)
    variant, _ = run_backward(inputs, stats, grad_hidden, cores, ub_size)
    for name, a, b in zip(BACKWARD_NAMES, variant, baseline, strict=True):
        assert_bitwise_equal(name, a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("ub_size", [24576, 16384, 8192, 4096, 2048])
@pytest.mark.parametrize("cores", [1, 3, 8])
def test_every_split_tile_gives_the_same_bits(cores, ub_size, dtype):
    """A fixed shape walked with ever smaller hidden tiles (the split variant) and several core counts. For the
    16-bit types some of these sizes give tiles of an odd number of groups (forward tiles of 528, 176 and 80
    elements, backward ones of 48 and 16), so that tiles start in the middle of the two-group steps of pass 1's
    runs (kernel_loops.h, add_runs)."""
    inputs = make_inputs(70, 5, 1000, dtype, seed=3)
    forward_base, _ = run_forward(inputs, 1, 1 << 22)
    forward_split, forward_result = run_forward(inputs, cores, ub_size)
    assert forward_result.data.h_tile_num > 1, "this buffer size should force hidden tiles"
    for name, a, b in zip(FORWARD_NAMES, forward_split, forward_base, strict=True):
        assert_bitwise_equal(name, a, b)
    grad_hidden = torch.randn(70, 1000, generator=torch.Generator().manual_seed(9)).to(dtype)
    backward_base, _ = run_backward(inputs, forward_base[1:], grad_hidden, 1, 1 << 22)
    backward_split, backward_result = run_backward(inputs, forward_base[1:], grad_hidden, cores, ub_size)
    assert backward_result.data.h_tile_num > 1
    for name, a, b in zip(BACKWARD_NAMES, backward_split, backward_base, strict=True):
        assert_bitwise_equal(name, a, b)
