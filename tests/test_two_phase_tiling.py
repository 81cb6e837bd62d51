"""Tiling of the two-phase ops' CPU kernels: golden decisions, the cold-start contract (TilingParse reads no
platform fact; Tiling reads cores and buffer, re-queries, falls back to one core with one warning or raises
in strict mode), every token dealt, and query groups and hidden tiles only when the buffer requires them."""

from __future__ import annotations

import warnings

import pytest
import torch

from attnres_ge.op_host import block_attn_res_prepare_tiling as prepare_tiling
from attnres_ge.op_host import block_attn_res_update_tiling as update_tiling
from attnres_ge.op_host.platform import KIB, PlatformInfo, PlatformProfile
from attnres_ge.op_host.tiling_base import (
    LANES,
    MODE_FULL_ROW,
    MODE_SPLIT_H,
    PlatformFallbackWarning,
    PlatformNotReadyError,
    TilingError,
    reset_fallback_warnings,
)

# The generic platform ops-transformer's golden tests fake: 48 cores, 196608 bytes of buffer.
GENERIC_48 = PlatformProfile("generic-48", 48, 196608)


def as_platform(profile_or_platform) -> PlatformInfo:
    if isinstance(profile_or_platform, PlatformInfo):
        return profile_or_platform
    return PlatformInfo(profile_or_platform)


def prepare(profile_or_platform, tokens, blocks, queries, hidden, strict=False):
    platform = as_platform(profile_or_platform)
    info = prepare_tiling.parse(platform)
    return prepare_tiling.tiling(info, tokens, blocks, queries, hidden, 1e-6, platform, strict=strict)


def update(profile_or_platform, tokens, hidden, dtype=torch.bfloat16, strict=False):
    platform = as_platform(profile_or_platform)
    info = update_tiling.parse(platform)
    return update_tiling.tiling(info, tokens, hidden, dtype, 1e-6, platform, strict=strict)


def prepare_small(platform, strict=False):
    return prepare(platform, 300, 4, 3, 256, strict=strict)


def update_small(platform, strict=False):
    return update(platform, 300, 256, strict=strict)


TILES = [pytest.param(prepare_small, id="prepare"), pytest.param(update_small, id="update")]
PARSES = [pytest.param(prepare_tiling.parse, id="prepare"), pytest.param(update_tiling.parse, id="update")]

# The serialized records a kernel reads, pinned byte for byte on GENERIC_48 (T=4096, N=8, S=8, D=2048; delta bf16).
GOLDEN_BYTES = {
    "prepare": "001000000000000008000000000000000800000000000000000800000000000030000000000000001000000000000000"
    "560000000000000055000000000000000100000000000000080000000000000001000000000000000800000000000000f007000000000000"
    "02000000000000001000000000000000bd378635",
    "update": "0010000000000000000800000000000030000000000000001000000000000000560000000000000055000000000000000500"
    "000000000000000800000000000001000000000000000008000000000000bd378635",
}


def test_golden_prepare_tiling():
    result = prepare(GENERIC_48, 4096, 8, 8, 2048)
    assert (result.tiling_key, result.block_dim, result.workspace_size) == (10 * MODE_SPLIT_H, 48, 0)
    assert result.data.to_bytes().hex() == GOLDEN_BYTES["prepare"]


def test_golden_update_tiling():
    result = update(GENERIC_48, 4096, 2048)
    assert (result.tiling_key, result.block_dim, result.workspace_size) == (10 * MODE_FULL_ROW + 2, 48, 0)
    assert result.data.to_bytes().hex() == GOLDEN_BYTES["update"]


@pytest.mark.parametrize(("dtype", "code"), [(torch.float32, 0), (torch.float16, 1), (torch.bfloat16, 2)],
                         ids=["fp32", "fp16", "bf16"])
def test_update_tiling_key_names_the_delta_dtype(dtype, code):
    assert update(GENERIC_48, 64, 512, dtype).tiling_key == 10 * MODE_FULL_ROW + code


def test_the_record_round_trips_through_its_bytes():
    for result in (prepare(GENERIC_48, 33, 5, 3, 100), update(GENERIC_48, 33, 100)):
        record = type(result.data)
        assert record.from_bytes(result.data.to_bytes()) == result.data


# --- what the buffer decides -------------------------------------------------------------


def test_prepare_keeps_every_query_on_one_load_when_the_buffer_allows():
    data = prepare(GENERIC_48, 64, 8, 8, 512).data
    assert (data.query_tile, data.query_tile_num, data.h_tile_num) == (8, 1, 1)
    assert data.tokens_per_loop >= 1


def test_prepare_cuts_the_queries_into_groups_only_when_one_token_cannot_hold_them():
    tiny = PlatformProfile("tiny", 2, 1 * KIB)
    data = prepare(tiny, 10, 7, 6, 520).data
    assert data.query_tile < 6 and data.h_tile % LANES == 0
    assert (data.query_tile_num - 1) * data.query_tile + data.query_last_tile == 6


def test_prepare_at_the_largest_shape_fits_the_fallback_buffer():
    fallback = PlatformProfile("fallback-sized", 1, 64 * KIB)
    data = prepare(fallback, 3, 64, 1, 8192).data
    assert data.h_tile >= LANES and (data.h_tile_num - 1) * data.h_tile + data.h_last_tile == 8192


def test_update_cuts_the_hidden_dimension_when_a_row_does_not_fit():
    data = update(PlatformProfile("small", 4, 8 * KIB), 16, 8192).data
    assert data.h_tile_num > 1 and data.h_tile % LANES == 0
    assert (data.h_tile_num - 1) * data.h_tile + data.h_last_tile == 8192


def test_a_buffer_too_small_for_one_lane_group_is_a_clear_error():
    with pytest.raises(TilingError, match=r"BlockAttnResPrepare Tiling: a buffer of 256 bytes cannot hold 16"):
        prepare(PlatformProfile("crumb", 1, 256), 4, 64, 1, 4096)


@pytest.mark.parametrize("cores", [1, 2, 3, 7, 48, 1000])
@pytest.mark.parametrize("tokens", [0, 1, 5, 64, 65, 4097])
def test_never_zero_cores_and_every_token_dealt(cores, tokens):
    profile = PlatformProfile("p", cores, 196608)
    for data in (prepare(profile, tokens, 4, 3, 64).data, update(profile, tokens, 64).data):
        assert 1 <= data.used_core_num <= cores
        dealt = data.former_core_num * data.former_core_tokens
        dealt += (data.used_core_num - data.former_core_num) * data.tail_core_tokens
        assert dealt == tokens


def test_empty_shapes_tile():
    assert prepare(GENERIC_48, 0, 4, 3, 16).block_dim == 1
    assert prepare(GENERIC_48, 7, 3, 0, 16).data.query_last_tile == 0
    assert update(GENERIC_48, 3, 0).data.h_last_tile == 0


# --- the cold start ----------------------------------------------------------------------


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


@pytest.mark.parametrize("parse", PARSES)
def test_tiling_parse_reads_no_platform_fact(parse):
    for filled in (False, True):
        platform = RecordingPlatform(GENERIC_48, filled=filled)
        parse(platform)
        assert platform.reads == []


@pytest.mark.parametrize("tile", TILES)
def test_tiling_reads_the_core_count(tile):
    platform = RecordingPlatform(GENERIC_48)
    tile(platform)
    assert "core_num" in platform.reads and "ub_size" in platform.reads


@pytest.mark.parametrize("parse", PARSES)
def test_tiling_parse_needs_a_platform_handle(parse):
    with pytest.raises(TilingError, match=r"BlockAttnRes(Prepare|Update) TilingParse: no platform handle"):
        parse(None)


@pytest.mark.parametrize("tile", TILES)
def test_empty_at_parse_filled_at_tiling(tile):
    platform = PlatformInfo.empty(GENERIC_48, runtime_answers=False)
    parse = prepare_tiling.parse if tile is prepare_small else update_tiling.parse
    parse(platform)
    platform.fill()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tile(platform).block_dim == 48


@pytest.mark.parametrize("tile", TILES)
def test_empty_handle_is_requeried_at_tiling(tile):
    platform = PlatformInfo.empty(GENERIC_48, runtime_answers=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = tile(platform)
    assert result.block_dim == 48 and platform.filled


@pytest.mark.parametrize("tile", TILES)
def test_empty_at_both_falls_back_to_one_core_with_one_warning(tile):
    reset_fallback_warnings()
    op = "BlockAttnResPrepare " if tile is prepare_small else "BlockAttnResUpdate "
    with pytest.warns(PlatformFallbackWarning) as record:
        first = tile(PlatformInfo.empty(GENERIC_48, runtime_answers=False))
        second = tile(PlatformInfo.empty(GENERIC_48, runtime_answers=False))
    assert len(record) == 1, "the fallback warning is given once per op"
    assert str(record[0].message).startswith(
        op + "Tiling: platform generic-48 reported coreNum=0, ubSize=0; after a re-query "
        "coreNum=0, ubSize=0; falling back to coreNum=1")
    assert first.block_dim == second.block_dim == 1


@pytest.mark.parametrize("tile", TILES)
def test_strict_mode_raises_with_context(tile, monkeypatch):
    with pytest.raises(PlatformNotReadyError, match=r"Tiling: platform generic-48 reported coreNum=0, ubSize=0; "
                                                    r"after a re-query coreNum=0, ubSize=0; strict mode"):
        tile(PlatformInfo.empty(GENERIC_48, runtime_answers=False), strict=True)
    monkeypatch.setenv("ATTNRES_GE_STRICT_PLATFORM", "1")
    with pytest.raises(PlatformNotReadyError):
        tile(PlatformInfo.empty(GENERIC_48, runtime_answers=False), strict=None)
