"""The native kernels of the two-phase ops (op_kernel/csrc/prepare_kernel.h, update_kernel.h): the same
bits on every instruction set path, tiling and store kind, agreement with the Python oracle, every
output element written, and records that do not cover their shapes refused.

test_two_phase_ops.py checks both ops against the float64 reference through the torch ops, which run
these kernels whenever they are built; the cases here aim at the native code: hidden sizes off the
16-lane grid, split hidden tiles, query groups, every register block of rows and queries (N and S
from 1 to 9), and the conversions of 16-bit deltas.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import assert_bitwise_equal, assert_same_bits_but_nan_payloads

import attnres_ge.op_kernel as op_kernel
from attnres_ge.op_host import block_attn_res_prepare_tiling as prepare_tiling
from attnres_ge.op_host import block_attn_res_update_tiling as update_tiling
from attnres_ge.op_host.platform import PlatformInfo, PlatformProfile
from attnres_ge.op_kernel.block_attn_res_prepare import KERNEL as PREPARE_KERNEL
from attnres_ge.op_kernel.block_attn_res_update import KERNEL as UPDATE_KERNEL

native = pytest.importorskip("attnres_ge.op_kernel.native", reason="the native kernels are not built")
NO_WORKSPACE = torch.empty(0, dtype=torch.uint8)
DELTA_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def platform(cores: int, ub_size: int) -> PlatformInfo:
    return PlatformInfo(PlatformProfile("test", cores, ub_size))


def prepare_case(tokens, blocks, queries, hidden, seed=0):
    generator = torch.Generator().manual_seed(seed)
    block_res = torch.randn(tokens, blocks, hidden, generator=generator)
    pseudo_query = torch.randn(queries, hidden, generator=generator) * 2 / hidden**0.5
    return block_res, pseudo_query


def run_prepare(block_res, valid, pseudo_query, cores=2, ub_size=1 << 20, implementation="native"):
    tokens, blocks, hidden = block_res.shape
    queries = pseudo_query.shape[0]
    plat = platform(cores, ub_size)
    tiling = prepare_tiling.tiling(prepare_tiling.parse(plat), tokens, blocks, queries, hidden, 1e-6, plat).data
    # NaN-filled, so that an element the kernel forgets to write shows up.
    outputs = (torch.full((queries, tokens, hidden), float("nan")), torch.full((queries, tokens), float("nan")),
               torch.full((queries, tokens), float("nan")))
    valid_blocks = torch.tensor([valid], dtype=torch.uint64)
    op_kernel.kernel(PREPARE_KERNEL, implementation)(block_res, valid_blocks, pseudo_query, *outputs, NO_WORKSPACE,
                                                     tiling)
    return outputs, tiling


def update_case(tokens, hidden, delta_dtype, seed=1):
    """partial_block, delta, pseudo_query and a state of positive exp sums and finite maxima."""
    generator = torch.Generator().manual_seed(seed)
    partial = torch.randn(tokens, hidden, generator=generator)
    delta = torch.randn(tokens, hidden, generator=generator).to(delta_dtype)
    query = torch.randn(hidden, generator=generator) * 2 / hidden**0.5
    numerator = torch.randn(tokens, hidden, generator=generator) * 3
    logit_max = torch.randn(tokens, generator=generator)
    exp_sum = torch.rand(tokens, generator=generator) * 4 + 1
    return [partial, delta, query, numerator, logit_max, exp_sum]


def run_update(inputs, cores=2, ub_size=1 << 20, implementation="native", in_place=False):
    """(partial_out, h, tiling); the inputs are left alone unless in_place."""
    tokens, hidden = inputs[0].shape
    delta_dtype = inputs[1].dtype
    plat = platform(cores, ub_size)
    tiling = update_tiling.tiling(update_tiling.parse(plat), tokens, hidden, delta_dtype, 1e-6, plat).data
    partial = inputs[0] if in_place else inputs[0].clone()
    partial_out = partial if in_place else torch.full_like(partial, float("nan"))
    h = torch.full((tokens, hidden), float("nan"), dtype=delta_dtype)
    op_kernel.kernel(UPDATE_KERNEL, implementation)(partial, *inputs[1:], partial_out, h, NO_WORKSPACE, tiling)
    return partial_out, h, tiling


def assert_paths_agree(run, same=assert_bitwise_equal):
    results = {}
    for path in native.available_isa_paths():
        native.use_isa_path(path)
        results[path] = run()
    scalar = results.pop("scalar")
    for path, outputs in results.items():
        for index, (value, expected) in enumerate(zip(outputs, scalar, strict=True)):
            same(f"{path} vs scalar: output {index}", value, expected)


# (T, N, S, D, valid, cores, buffer bytes): D off the grid and D = 1, split hidden tiles and query
# groups (small buffers), N and S from 1 to 9 (every register block), Nv < N.
PREPARE_SHAPES = [(7, 3, 2, 37, 3, 2, 1 << 20), (11, 9, 9, 200, 9, 3, 4096), (5, 1, 1, 1, 1, 2, 1 << 20),
                  (9, 5, 7, 130, 4, 2, 1 << 20), (6, 8, 5, 1000, 8, 3, 2048), (4, 2, 3, 64, 2, 1, 512),
                  (5, 9, 7, 90, 7, 2, 1536)]


@pytest.mark.parametrize("shape", PREPARE_SHAPES, ids=lambda s: "T{}-N{}-S{}-D{}-Nv{}-c{}-ub{}".format(*s))
def test_prepare_gives_the_same_bits_on_every_path(shape, restore_isa_path):
    tokens, blocks, queries, hidden, valid, cores, ub_size = shape
    block_res, pseudo_query = prepare_case(tokens, blocks, queries, hidden, seed=hidden)
    assert_paths_agree(lambda: run_prepare(block_res, valid, pseudo_query, cores, ub_size)[0])


UPDATE_SHAPES = [(7, 37, 2, 1 << 20), (13, 200, 3, 512), (5, 1, 2, 1 << 20), (9, 1000, 2, 2048), (4, 64, 1, 512)]


@pytest.mark.parametrize("delta_id", DELTA_DTYPES)
@pytest.mark.parametrize("shape", UPDATE_SHAPES, ids=lambda s: "T{}-D{}-c{}-ub{}".format(*s))
def test_update_gives_the_same_bits_on_every_path(shape, delta_id, restore_isa_path):
    tokens, hidden, cores, ub_size = shape
    inputs = update_case(tokens, hidden, DELTA_DTYPES[delta_id], seed=hidden)
    assert_paths_agree(lambda: run_update(inputs, cores, ub_size)[:2])


@pytest.mark.parametrize("delta_id", DELTA_DTYPES)
def test_update_gives_the_same_bits_on_every_path_on_special_values(delta_id, restore_isa_path):
    """Tokens whose delta, p and h are subnormal in delta's dtype, huge, zero, Inf or NaN: the 16-bit
    conversions' edge cases must not show."""
    dtype = DELTA_DTYPES[delta_id]
    inputs = update_case(10, 80, torch.float32, seed=4)
    partial, delta, _, numerator, _, _ = inputs
    tiny = torch.finfo(dtype).smallest_normal
    for t, scale in enumerate([tiny, tiny / 64, 1e30, 0.0]):
        partial[t] *= scale
        delta[t] *= scale
        numerator[t] *= scale
    delta[4, 3] = float("inf")
    partial[5, 7] = float("nan")
    numerator[6, 2] = float("-inf")
    inputs[1] = delta.to(dtype)
    assert_paths_agree(lambda: run_update(inputs, 3, 512)[:2], same=assert_same_bits_but_nan_payloads)


def test_prepare_gives_the_same_bits_on_every_path_on_special_values(restore_isa_path):
    block_res, pseudo_query = prepare_case(8, 4, 3, 80, seed=6)
    block_res[0] *= 1e-42  # subnormal rows
    block_res[1] *= 1e30
    block_res[2] = 0.0
    block_res[3, 1, 5] = float("inf")
    block_res[4, 2, 9] = float("nan")
    assert_paths_agree(lambda: run_prepare(block_res, 4, pseudo_query, 3, 2048)[0],
                       same=assert_same_bits_but_nan_payloads)


@pytest.mark.parametrize("valid", [3, 6, 0])
def test_prepare_agrees_with_the_python_oracle(valid):
    """Every element written (the outputs start as NaN), within a few float32 roundings of the oracle."""
    block_res, pseudo_query = prepare_case(23, 6, 5, 300, seed=valid)
    for ub_size in (1 << 20, 1024):  # one hidden tile and one query group; several of each
        native_out, tiling = run_prepare(block_res, valid, pseudo_query, 3, ub_size)
        python_out, _ = run_prepare(block_res, valid, pseudo_query, 3, ub_size, implementation="python")
        for name, a, b in zip(("numerator", "logit_max", "exp_sum"), native_out, python_out, strict=True):
            torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6, msg=lambda m, name=name: f"{name}: {m}")
    assert tiling.h_tile_num > 1 and tiling.query_tile_num > 1, tiling


@pytest.mark.parametrize("ub_size", [1 << 20, 131072])
def test_prepare_agrees_with_the_python_oracle_across_pass_1_chunks(ub_size):
    """D = 2500 spans several of pass 1's chunks of 1024 elements and ends off the 16-lane grid; the smaller
    buffer cuts it into hidden tiles of 1712 and 788 elements, so a chunk ends at a tile's end."""
    block_res, pseudo_query = prepare_case(9, 7, 6, 2500, seed=ub_size)
    native_out, tiling = run_prepare(block_res, 7, pseudo_query, 2, ub_size)
    python_out, _ = run_prepare(block_res, 7, pseudo_query, 2, ub_size, implementation="python")
    for name, a, b in zip(("numerator", "logit_max", "exp_sum"), native_out, python_out, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6, msg=lambda m, name=name: f"{name}: {m}")
    assert (tiling.h_tile_num > 1) == (ub_size == 131072), tiling


@pytest.mark.parametrize("delta_id", DELTA_DTYPES)
def test_update_agrees_with_the_python_oracle(delta_id):
    inputs = update_case(23, 300, DELTA_DTYPES[delta_id], seed=3)
    for ub_size in (1 << 20, 512):
        native_out = run_update(inputs, 3, ub_size)
        python_out = run_update(inputs, 3, ub_size, implementation="python")
        assert_bitwise_equal("partial_out", native_out[0], python_out[0])  # one float32 addition either way
        # h: float32 arithmetic here, float64 in the oracle; 16-bit outputs may round the other way.
        tolerance = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[DELTA_DTYPES[delta_id]]
        torch.testing.assert_close(native_out[1], python_out[1], rtol=tolerance, atol=tolerance)
    assert native_out[2].h_tile_num > 1, native_out[2]


@pytest.mark.parametrize("delta_id", DELTA_DTYPES)
def test_update_in_place_gives_the_bits_of_a_separate_output(delta_id):
    inputs = update_case(9, 600, DELTA_DTYPES[delta_id], seed=8)
    for ub_size in (1 << 20, 512):  # the second pass reads p back from the output, in place or not
        separate = run_update(inputs, 2, ub_size)
        fed = [tensor.clone() for tensor in inputs]
        in_place = run_update(fed, 2, ub_size, in_place=True)
        assert in_place[0] is fed[0]
        assert_bitwise_equal("partial_block", in_place[0], separate[0])
        assert_bitwise_equal("h", in_place[1], separate[1])


def test_streaming_stores_write_the_same_bits(monkeypatch):
    block_res, pseudo_query = prepare_case(9, 4, 3, 256, seed=2)
    inputs = update_case(9, 256, torch.bfloat16, seed=2)
    plain = (*run_prepare(block_res, 4, pseudo_query)[0], *run_update(inputs)[:2])
    monkeypatch.setattr(native, "STREAM_MIN_BYTES", 0)
    streamed = (*run_prepare(block_res, 4, pseudo_query)[0], *run_update(inputs)[:2])
    for index, (a, b) in enumerate(zip(streamed, plain, strict=True)):
        assert_bitwise_equal(f"output {index}", a, b)


def test_a_record_whose_query_groups_do_not_cover_s_is_refused():
    plat = platform(2, 1 << 20)
    tiling = prepare_tiling.tiling(prepare_tiling.parse(plat), 4, 2, 5, 32, 1e-6, plat).data
    with pytest.raises(ValueError, match=r"BlockAttnResPrepare native kernel: query groups .* do not cover S=5"):
        native.launch_record("BlockAttnResPrepare", dataclasses.replace(tiling, query_last_tile=4), torch.float32)


def test_a_record_that_does_not_deal_every_token_is_refused():
    plat = platform(2, 1 << 20)
    tiling = update_tiling.tiling(update_tiling.parse(plat), 6, 32, torch.bfloat16, 1e-6, plat).data
    with pytest.raises(ValueError, match=r"BlockAttnResUpdate native kernel: the core split does not cover 6 items"):
        native.launch_record("BlockAttnResUpdate", dataclasses.replace(tiling, tail_core_tokens=1), torch.bfloat16)


def test_the_update_kernel_is_chosen_by_deltas_dtype():
    """partial_block is float32 whatever delta is: the kernel is compiled for delta's dtype (dtype_input)."""
    assert UPDATE_KERNEL.dtype_index == 1 and PREPARE_KERNEL.dtype_index == 0
    inputs = update_case(5, 48, torch.bfloat16)
    _, h, _ = run_update(inputs)
    assert h.dtype == torch.bfloat16 and not torch.isnan(h).any()
