"""Tiling decisions per profile (golden), the binary record, and the cold-start contract."""

from __future__ import annotations

import dataclasses
import itertools
import warnings

import pytest
import torch
from conftest import EVERY_HOST, host

from attnres_ge.op_host import block_attention_residuals_grad_tiling as grad_tiling
from attnres_ge.op_host import block_attention_residuals_tiling as forward_tiling
from attnres_ge.op_host.platform import PlatformInfo, PlatformProfile
from attnres_ge.op_host.tiling_base import (
    LANES,
    PlatformFallbackWarning,
    PlatformNotReadyError,
    TilingError,
    reset_fallback_warnings,
)

# A generic test platform of the size ops-transformer's golden tests fake: 48 cores, 196608 bytes of buffer.
GENERIC_48 = PlatformProfile("generic-48", 48, 196608)
TINY = PlatformProfile("tiny", 3, 4096)


def as_platform(profile_or_platform) -> PlatformInfo:
    if isinstance(profile_or_platform, PlatformInfo):
        return profile_or_platform
    return PlatformInfo(profile_or_platform)


def forward(profile_or_platform, tokens, blocks, hidden, dtype=torch.float32, need_backward=True, strict=False):
    platform = as_platform(profile_or_platform)
    info = forward_tiling.parse(platform)
    return forward_tiling.tiling(info, tokens, blocks, hidden, dtype, 1e-6, need_backward, platform, strict=strict)


def backward(profile_or_platform, tokens, blocks, hidden, dtype=torch.float32, strict=False):
    platform = as_platform(profile_or_platform)
    info = grad_tiling.parse(platform)
    return grad_tiling.tiling(info, tokens, blocks, hidden, dtype, platform, strict=strict)


# Golden decisions: (key, block_dim, workspace, tiling data as hex). A change here is a reviewed diff.
GOLDEN = [
    pytest.param(forward, GENERIC_48, (4096, 8, 2048, torch.float32), id="fwd-generic48-T4096-N8-H2048-fp32"),
    pytest.param(forward, GENERIC_48, (4096, 8, 2048, torch.bfloat16), id="fwd-generic48-T4096-N8-H2048-bf16"),
    pytest.param(forward, GENERIC_48, (513, 37, 1000, torch.float16), id="fwd-generic48-T513-N37-H1000-fp16"),
    pytest.param(backward, GENERIC_48, (4096, 8, 2048, torch.float32), id="bwd-generic48-T4096-N8-H2048-fp32"),
    pytest.param(backward, GENERIC_48, (513, 37, 1000, torch.bfloat16), id="bwd-generic48-T513-N37-H1000-bf16"),
    pytest.param(backward, GENERIC_48, (0, 0, 1, torch.float32), id="bwd-generic48-T0-N0-H1-fp32"),
    pytest.param(forward, TINY, (7, 2, 100, torch.float32), id="fwd-tiny-T7-N2-H100-fp32"),
]
EXPECTED = {
    "fwd-generic48-T4096-N8-H2048-fp32": (
        10,
        48,
        0,
        dict(
            used_core_num=48,
            former_core_num=16,
            former_core_tokens=86,
            tail_core_tokens=85,
            tokens_per_loop=2,
            h_tile=2048,
            h_tile_num=1,
            h_last_tile=2048,
        ),
    ),
    "fwd-generic48-T4096-N8-H2048-bf16": (
        12,
        48,
        0,
        dict(
            used_core_num=48,
            former_core_num=16,
            former_core_tokens=86,
            tail_core_tokens=85,
            tokens_per_loop=1,
            h_tile=2048,
            h_tile_num=1,
            h_last_tile=2048,
        ),
    ),
    "fwd-generic48-T513-N37-H1000-fp16": (
        21,
        48,
        0,
        dict(
            used_core_num=48,
            former_core_num=33,
            former_core_tokens=11,
            tail_core_tokens=10,
            tokens_per_loop=1,
            h_tile=816,
            h_tile_num=2,
            h_last_tile=184,
        ),
    ),
    "bwd-generic48-T4096-N8-H2048-fp32": (
        20,
        48,
        64 * 2048 * 4,
        dict(
            used_core_num=48,
            former_core_num=16,
            former_core_chunks=2,
            tail_core_chunks=1,
            chunk_num=64,
            tokens_per_loop=1,
            h_tile=1568,
            h_tile_num=2,
            h_last_tile=480,
        ),
    ),
    "bwd-generic48-T513-N37-H1000-bf16": (
        22,
        9,
        9 * 1000 * 4,
        dict(
            used_core_num=9,
            former_core_num=0,
            former_core_chunks=1,
            tail_core_chunks=1,
            chunk_num=9,
            tokens_per_loop=1,
            h_tile=608,
            h_tile_num=2,
            h_last_tile=392,
        ),
    ),
    "bwd-generic48-T0-N0-H1-fp32": (
        10,
        1,
        0,
        dict(
            used_core_num=1,
            former_core_num=0,
            former_core_chunks=0,
            tail_core_chunks=0,
            chunk_num=0,
            tokens_per_loop=1,
            h_tile=1,
            h_tile_num=1,
            h_last_tile=1,
        ),
    ),
    "fwd-tiny-T7-N2-H100-fp32": (
        10,
        3,
        0,
        dict(
            used_core_num=3,
            former_core_num=1,
            former_core_tokens=3,
            tail_core_tokens=2,
            tokens_per_loop=1,
            h_tile=100,
            h_tile_num=1,
            h_last_tile=100,
        ),
    ),
}


@pytest.mark.parametrize(("tile", "profile", "shape"), GOLDEN)
def test_golden_tiling(request, tile, profile, shape):
    key, block_dim, workspace, fields = EXPECTED[request.node.callspec.id]
    result = tile(profile, *shape)
    actual = {name: getattr(result.data, name) for name in fields}
    assert (result.tiling_key, result.block_dim, result.workspace_size, actual) == (key, block_dim, workspace, fields)


def test_tiling_record_binary_layout_is_stable():
    result = forward(GENERIC_48, 4096, 8, 2048)
    data = result.data.to_bytes()
    assert len(data) == 13 * 8 + 4  # thirteen int64 fields and the float32 epsilon
    assert forward_tiling.ForwardTilingData.from_bytes(data) == dataclasses.replace(
        result.data, norm_eps=data_eps(data)
    )
    assert data[:8] == (4096).to_bytes(8, "little")
    assert data.hex().endswith("bd378635")  # 1e-6 as float32, little-endian
    grad = backward(GENERIC_48, 4096, 8, 2048).data
    assert grad_tiling.BackwardTilingData.from_bytes(grad.to_bytes()) == grad


def data_eps(data: bytes) -> float:
    import struct

    return struct.unpack("<f", data[-4:])[0]


@pytest.mark.parametrize("tile", [forward, backward], ids=["forward", "backward"])
def test_split_variant_when_one_token_does_not_fit(tile):
    result = tile(GENERIC_48, 10, 16, 8192)
    data = result.data
    assert result.tiling_key // 10 == 2 and data.h_tile_num > 1
    assert data.h_tile % LANES == 0 and (data.h_tile_num - 1) * data.h_tile + data.h_last_tile == 8192


def test_buffer_too_small_for_one_lane_group_is_a_clear_error():
    with pytest.raises(TilingError, match=r"BlockAttentionResiduals Tiling: a buffer of 512 bytes cannot hold 16"):
        forward(PlatformProfile("crumb", 1, 512), 4, 100, 4096)


def test_tiling_parse_needs_a_platform_handle():
    with pytest.raises(TilingError, match="BlockAttentionResidualsGrad TilingParse: no platform handle"):
        grad_tiling.parse(None)


# --- the cold start ---------------------------------------------------------------


@pytest.mark.parametrize("tile", [forward, backward], ids=["forward", "backward"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_empty_at_parse_filled_at_tiling(tile, dtype):
    """TilingParse on an empty handle succeeds; the runtime fills it before Tiling; no fallback."""
    platform = PlatformInfo.empty(GENERIC_48, runtime_answers=False)
    parse = forward_tiling.parse if tile is forward else grad_tiling.parse
    info = parse(platform)
    assert platform.core_num() == 0
    assert all(value != 0 for value in dataclasses.astuple(info)[1:])  # nothing read from the empty handle
    platform.fill()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = tile(platform, 4096, 8, 2048, dtype)
    assert result.block_dim == 48


def test_empty_handle_is_requeried_at_tiling():
    platform = PlatformInfo.empty(GENERIC_48, runtime_answers=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = backward(platform, 4096, 8, 2048)
    assert result.block_dim == 48 and platform.filled


@pytest.mark.parametrize("tile", [forward, backward], ids=["forward", "backward"])
def test_empty_at_both_falls_back_to_one_core_with_one_warning(tile):
    reset_fallback_warnings()
    op = "BlockAttentionResiduals " if tile is forward else "BlockAttentionResidualsGrad "
    with pytest.warns(PlatformFallbackWarning) as record:
        first = tile(PlatformInfo.empty(GENERIC_48, runtime_answers=False), 300, 4, 256)
        second = tile(PlatformInfo.empty(GENERIC_48, runtime_answers=False), 300, 4, 256)
    assert len(record) == 1, "the fallback warning is given once per op"
    message = str(record[0].message)
    assert message.startswith(
        op + "Tiling: platform generic-48 reported coreNum=0, ubSize=0; after a re-query "
        "coreNum=0, ubSize=0; falling back to coreNum=1"
    )
    assert first.block_dim == second.block_dim == 1


@pytest.mark.parametrize("tile", [forward, backward], ids=["forward", "backward"])
def test_strict_mode_raises_with_context(tile, monkeypatch):
    with pytest.raises(
        PlatformNotReadyError,
        match=r"Tiling: platform generic-48 reported coreNum=0, ubSize=0; "
        r"after a re-query coreNum=0, ubSize=0; strict mode",
    ):
        tile(PlatformInfo.empty(GENERIC_48, runtime_answers=False), 300, 4, 256, strict=True)
    monkeypatch.setenv("ATTNRES_GE_STRICT_PLATFORM", "1")
    platform = PlatformInfo.empty(GENERIC_48, runtime_answers=False)
    info = (forward_tiling.parse if tile is forward else grad_tiling.parse)(platform)
    with pytest.raises(PlatformNotReadyError):
        if tile is forward:
            forward_tiling.tiling(info, 300, 4, 256, torch.float32, 1e-6, True, platform)
        else:
            grad_tiling.tiling(info, 300, 4, 256, torch.float32, platform)


@pytest.mark.parametrize("cores", [1, 2, 3, 7, 48, 1000])
@pytest.mark.parametrize("tokens", [0, 1, 5, 64, 65, 4097])
def test_never_zero_cores_and_every_token_dealt(cores, tokens):
    profile = PlatformProfile("p", cores, 196608)
    fwd = forward(profile, tokens, 4, 64).data
    assert 1 <= fwd.used_core_num <= cores
    assert (
        fwd.former_core_num * fwd.former_core_tokens + (fwd.used_core_num - fwd.former_core_num) * fwd.tail_core_tokens
        == tokens
    )
    bwd = backward(profile, tokens, 4, 64).data
    assert 1 <= bwd.used_core_num <= cores
    assert (
        bwd.former_core_num * bwd.former_core_chunks + (bwd.used_core_num - bwd.former_core_num) * bwd.tail_core_chunks
        == bwd.chunk_num
    )
    assert bwd.chunk_num * bwd.chunk_tokens >= tokens


class RecordingPlatform(PlatformInfo):
    """A platform handle that records every read of its core count and buffer size."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads: list[str] = []

    def core_num(self) -> int:
        self.reads.append("core_num")
        return super().core_num()

    def ub_size(self) -> int:
        self.reads.append("ub_size")
        return super().ub_size()


@pytest.mark.parametrize("parse", [forward_tiling.parse, grad_tiling.parse], ids=["forward", "backward"])
def test_tiling_parse_never_reads_the_core_count(parse):
    platform = RecordingPlatform(GENERIC_48, filled=False)
    parse(platform)
    assert platform.reads == []
    filled = RecordingPlatform(GENERIC_48)
    info = parse(filled)
    assert filled.reads == []
    tile = forward_tiling.tiling if parse is forward_tiling.parse else None
    if tile is not None:
        tile(info, 8, 2, 32, torch.float32, 1e-6, False, filled)
    else:
        grad_tiling.tiling(info, 8, 2, 32, torch.float32, filled)
    assert "core_num" in filled.reads, "Tiling is where the core count is read"


# The serialized tiling data a kernel reads, pinned byte for byte (48 cores, 196608-byte UB, T=4096 N=8 H=2048 fp32).
GOLDEN_BYTES = {
    "forward": "0010000000000000080000000000000009000000000000000008000000000000300000000000000010000000000000005600"
    "000000000000550000000000000002000000000000000008000000000000010000000000000000080000000000000100000000000000bd378635",
    "backward": "00100000000000000800000000000000090000000000000000080000000000003000000000000000100000000000000002"
    "00000000000000010000000000000040000000000000004000000000000000010000000000000020060000000000000200000000000000e0010"
    "00000000000",
}


@pytest.mark.parametrize("op", ["forward", "backward"])
def test_golden_tiling_bytes(op):
    tile = forward if op == "forward" else backward
    assert tile(GENERIC_48, 4096, 8, 2048).data.to_bytes().hex() == GOLDEN_BYTES[op]


# --- the host CPU's decisions, on every host the suite simulates -----------------------

HOST_SHAPES = [(0, 1, 16), (1, 8, 4096), (16, 8, 4096), (4096, 8, 2048), (1024, 16, 8192), (67, 37, 1000),
               (3, 6, 40005), (2, 128, 65536)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def assert_hidden_walk(data, hidden):
    """Whole rows, or tiles of whole lane groups that cover hidden exactly."""
    if data.h_tile_num == 1:
        assert data.h_tile == data.h_last_tile == hidden
    else:
        assert data.tokens_per_loop == 1 and data.h_tile % LANES == 0
        assert 0 < data.h_last_tile <= data.h_tile < hidden
        assert (data.h_tile_num - 1) * data.h_tile + data.h_last_tile == hidden


@pytest.mark.parametrize("profile", EVERY_HOST)
def test_host_tiling_is_consistent_on_every_host(profile):
    cores = profile.vector_core_num
    for tokens, blocks, hidden in HOST_SHAPES:
        for dtype in DTYPES:
            shape = (tokens, blocks, hidden, dtype)
            fwd = forward(profile, *shape)
            assert fwd.block_dim == fwd.data.used_core_num == max(1, min(cores, tokens)), shape
            assert fwd.data.tokens_per_loop == 1, "the host forward walks one token per loop"
            assert fwd.tiling_key // 10 == (2 if fwd.data.h_tile_num > 1 else 1), shape
            assert_hidden_walk(fwd.data, hidden)
            bwd = backward(profile, *shape)
            assert bwd.block_dim == bwd.data.used_core_num == max(1, min(cores, bwd.data.chunk_num)), shape
            assert 1 <= bwd.data.tokens_per_loop <= bwd.data.chunk_tokens
            assert bwd.workspace_size == bwd.data.chunk_num * hidden * 4
            assert_hidden_walk(bwd.data, hidden)


@pytest.mark.parametrize("tile", [forward, backward], ids=["forward", "backward"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
def test_host_hidden_walk_depends_on_l2_only_and_grows_with_it(tile, dtype):
    """The core count never changes how hidden is walked; a larger L2 never cuts finer tiles."""
    for tokens, blocks, hidden in HOST_SHAPES:
        walks = {}
        for param in EVERY_HOST:
            profile = param.values[0]
            data = tile(profile, tokens, blocks, hidden, dtype).data
            walk = (data.h_tile_num, data.h_tile, data.tokens_per_loop)
            assert walks.setdefault(profile.ub_size, walk) == walk, f"{tokens, blocks, hidden} on {profile}"
        sizes = sorted(walks)
        for smaller, larger in itertools.pairwise(sizes):
            assert walks[larger][0] <= walks[smaller][0], f"{tokens, blocks, hidden}: {walks}"


def test_l2_decides_between_whole_rows_and_hidden_tiles():
    """The split-H numerics tests size hidden by the L2; this pins that the sizing forces tiles on a host of
    each L2 size, and that the same shape runs whole rows where the L2 holds it."""
    for l2 in (256 * 1024, 512 * 1024, 1024 * 1024, 2048 * 1024):
        assert forward(host(2, l2), 3, 6, l2 // 8 + 5).data.h_tile_num > 1
        assert forward(host(2, l2), 3, 6, l2 // 64).data.h_tile_num == 1
