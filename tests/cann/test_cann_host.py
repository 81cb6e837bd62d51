"""Our CANN registrations (op_proto/cann/*.cpp, op_host/cann/*.cpp) run through CANN's registries the way GE
calls them.

Each case goes to two builds of tests/cann/cann_driver.cpp: one linked with our archive, one with upstream's
(hicann/ops-transformer's host code of both ops, from the CANN source kit). See conftest.py for the build and for
when the tier is skipped.
"""

from __future__ import annotations

import math
import struct
import subprocess
from pathlib import Path

import pytest
import torch

from attnres_ge.ge_plugin.ops import op_for_type
from attnres_ge.op_proto import WHERE_GRAPH, AttnResInputError, TensorMeta

GRAD = "BlockAttentionResidualsGrad"
FWD = "BlockAttentionResiduals"
DTYPES = ("float16", "bfloat16", "float32")
TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "int32": torch.int32}
WARM_PLATFORMS = ("ini910b2", "hand910b2", "hand91093", "hand950")
FULL_CORES = {"ini910b2": 48, "hand910b2": 48, "hand91093": 48, "hand950": 56}
FAILED = 4294967295  # ge::GRAPH_FAILED as the driver prints it
REPO = Path(__file__).resolve().parents[2]

# Forward tiling record (96 bytes): bytes 52..55 are struct padding upstream never writes. With T = 0 upstream
# also leaves invHiddenSize (48..51) and wsSizePerToken (56..63) unset (its early return), so those are
# compared only for T >= 1.
FWD_PADDING = range(52, 56)
FWD_UNSET_WHEN_EMPTY = range(48, 64)

HIDDEN_SIZES = (1, 15, 16, 17, 63, 64, 65, 1023, 2048, 4097, 6143, 6144, 6700, 6800, 8191, 20000, 100003)


def shapes(op):
    """(T, N, H) cases: every N edge with every H (odd, 15/16/17, around the whole-H/split-H boundary, large),
    T cycling through 1, core-count edges and a long sequence; plus T = 0."""
    blocks = (0, 1, 4, 100, 127, 128, 129) if op == GRAD else (0, 1, 2, 8, 99, 100, 101)
    tokens = (1, 2, 3, 47, 48, 49, 56, 57, 4096)
    cases = []
    for i, (n, h) in enumerate((n, h) for n in blocks for h in HIDDEN_SIZES):
        cases.append((tokens[i % len(tokens)], n, h))
    cases += [(0, 4, 16), (0, 1, 2048), (1, 1, 1), (1, 8, 20000)]
    return cases


def tiling_commands(op, platform, cases, dtypes=DTYPES, need_backward=(0, 1)):
    backward = need_backward if op == FWD else (0,)
    return [
        f"tiling {op} {platform} {dtype} {nb} {t} {n} {h}"
        for (t, n, h) in cases
        for dtype in dtypes
        for nb in backward
    ]


def comparable(line):
    """What a kernel reads, with the bytes upstream leaves unset blanked."""
    if line.get("rc") != 0:
        return ("failed", line.get("parse_rc"), line.get("rc"))
    data = bytearray.fromhex(line["data"])
    if line["op"] == FWD:
        for i in FWD_UNSET_WHEN_EMPTY if line["T"] == 0 else FWD_PADDING:
            data[i] = 0
    return (line["key"], line["block_dim"], line["schedule_mode"], line["workspace"], bytes(data))


# ---------------------------------------------------------------- cold / late / strict


@pytest.mark.parametrize("op", [GRAD, FWD])
def test_cold_platform_parse_passes_and_tiling_falls_back_to_one_core(drivers, op, count):
    commands = tiling_commands(op, "cold", [(64, 4, 2048), (3, 6, 20000)])
    ours = drivers.run("ours", commands)
    for line in ours.lines:
        assert line["parse_rc"] == 0, line
        assert line["rc"] == 0, line
        assert line["block_dim"] == 1, line
        assert line["workspace"] > 0 and line["workspace"] < 2**32, line
    assert f"OpName:[{op}] [Tiling] platform info incomplete after a re-query (vector cores=0" in ours.output
    assert "using vector cores=1, UB bytes=196352" in ours.output
    count(f"cold {op}: our TilingParse+Tiling passed with block dim 1", len(ours.lines))


def test_first_calls_from_several_threads_on_cold_platforms(drivers, count):
    """Eight threads run both ops' first TilingParse + Tiling at once: all fall back, one warning per op."""
    threads = 8
    commands = [f"threads {threads} {op} cold float32 1 64 4 2048" for op in (GRAD, FWD)]
    run = drivers.run("ours", commands)
    for line in run.lines:
        assert len(line["results"]) == threads
        for result in line["results"]:
            assert result["parse_rc"] == 0 and result["rc"] == 0 and result["block_dim"] == 1, result
        assert len({result["data"] for result in line["results"]}) == 1, "every thread must get the same tiling"
    for op in (GRAD, FWD):
        assert run.output.count(f"OpName:[{op}] [Tiling] platform info incomplete") == 1
    count("threads: first calls run at once, all fell back to 1 core", threads * len(commands))


def test_cold_platform_upstream_backward_parse_fails(drivers, count):
    """The seed bug, reproduced beside the fix: upstream's backward TilingParse reads the core count."""
    commands = tiling_commands(GRAD, "cold", [(64, 4, 2048)])
    upstream = drivers.run("upstream", commands)
    assert all(line["parse_rc"] == FAILED for line in upstream.lines), upstream.lines
    assert "coreNum is 0" in upstream.output
    ours = drivers.run("ours", commands)
    assert all(line["parse_rc"] == 0 and line["rc"] == 0 for line in ours.lines)
    count("cold BlockAttentionResidualsGrad: upstream TilingParse failed (coreNum is 0)", len(upstream.lines))


@pytest.mark.parametrize("op", [GRAD, FWD])
def test_late_platform_uses_the_full_core_count(drivers, op, count):
    """Cold at TilingParse, filled before Tiling: Tiling sees the filled platform."""
    cases = [(64, 4, 2048), (4096, 8, 2048), (3, 6, 20000)]
    late = drivers.run("ours", tiling_commands(op, "late", cases)).lines
    warm = drivers.run("ours", tiling_commands(op, "hand910b2", cases)).lines
    assert [comparable(x) for x in late] == [comparable(x) for x in warm]
    for line in late:
        expected = 48 if op == GRAD else min(line["T"], 48)
        assert line["block_dim"] == expected, line
    count(f"late {op}: full core count used", len(late))


@pytest.mark.parametrize("op", [GRAD, FWD])
def test_requery_finds_the_vector_core_count_platform_ascendc_misses(drivers, op, count):
    """SoCInfo with vector_core_cnt but no core_type_list: PlatformAscendC reports 0 vector cores; the re-query
    reads vector_core_cnt from the same platform, so there is no fallback (upstream's backward fails here)."""
    commands = tiling_commands(op, "vectorcountonly", [(64, 4, 2048)])
    ours = drivers.run("ours", commands)
    for line in ours.lines:
        assert line["rc"] == 0 and line["block_dim"] == 48, line
    assert "platform info incomplete" not in ours.output
    if op == GRAD:
        assert all(line["parse_rc"] == FAILED for line in drivers.run("upstream", commands).lines)
    count(f"re-query {op}: vector cores found without fallback", len(ours.lines))


@pytest.mark.parametrize("op", [GRAD, FWD])
def test_strict_mode_fails_tiling_on_a_cold_platform(drivers, op, count):
    commands = tiling_commands(op, "cold", [(64, 4, 2048)])
    strict = drivers.run("ours", commands, ATTNRES_GE_STRICT_PLATFORM="1")
    for line in strict.lines:
        assert line["parse_rc"] == 0 and line["rc"] == FAILED, line
    assert f"OpName:[{op}] [Tiling] platform info still incomplete after a re-query" in strict.output
    assert "ATTNRES_GE_STRICT_PLATFORM=1 forbids the fallback" in strict.output
    warm = drivers.run("ours", tiling_commands(op, "hand910b2", [(64, 4, 2048)]), ATTNRES_GE_STRICT_PLATFORM="1")
    assert all(line["rc"] == 0 for line in warm.lines), "strict mode must not affect a warm platform"
    count(f"strict {op}: Tiling failed with the message", len(strict.lines))


def test_cold_platform_upstream_forward_tiling_reports_success_with_an_unset_workspace(drivers, count):
    """Upstream's forward, beside ours above: on a cold platform its Tiling succeeds with workspace uint32(-1)."""
    commands = tiling_commands(FWD, "cold", [(64, 4, 2048)], dtypes=("bfloat16",), need_backward=(1,))
    upstream = drivers.run("upstream", commands)
    line = upstream.lines[0]
    assert line["parse_rc"] == 0 and line["rc"] == 0 and line["workspace"] == 2**32 - 1, line
    count("cold BlockAttentionResiduals: upstream Tiling succeeded with workspace 4294967295", 1)


# ---------------------------------------------------------------- warm: equal to upstream


@pytest.mark.parametrize("platform", WARM_PLATFORMS)
@pytest.mark.parametrize("op", [GRAD, FWD])
def test_warm_tiling_equals_upstream(drivers, op, platform, count):
    commands = tiling_commands(op, platform, shapes(op))
    ours = drivers.run("ours", commands).lines
    upstream = drivers.run("upstream", commands).lines
    differences = [(o, u) for o, u in zip(ours, upstream, strict=True) if comparable(o) != comparable(u)]
    assert not differences, f"{len(differences)} of {len(commands)} differ; first: {differences[0]}"
    accepted = [o for o in ours if o.get("rc") == 0]
    assert accepted and len(accepted) < len(ours), "the cases must include accepted and rejected shapes"
    if op == GRAD:
        assert {o["key"] for o in accepted} == {0, 1}, "both whole-H and split-H must be exercised"
        assert {o["block_dim"] for o in accepted} == {FULL_CORES[platform]}
    else:
        assert {o["key"] for o in accepted} == {40010, 40020, 40030}, "reload, resident and H-slice kernels"
        assert {o["block_dim"] for o in accepted} >= {1, FULL_CORES[platform]}
    count(f"warm {platform} {op}: cases compared with upstream", len(commands))
    count(f"warm {platform} {op}: both rejected", len(ours) - len(accepted))


# Pinned from the CANN source kit's README (upstream on the warm Ascend910B2 .ini): (op, dtype, T, N, H) ->
# key, block dim, workspace, and decoded fields. Guards the comparison itself against a changed kit.
PINNED_910B2 = [
    (GRAD, "float32", 64, 4, 2048, 0, 48, 17170432, {"hiddenTileSize": 2048, "perCoreWkspBytes": 8192}),
    (GRAD, "bfloat16", 3, 6, 20000, 1, 48, 20636672,
     {"hiddenTileSize": 6672, "hiddenTileNum": 3, "perCoreWkspBytes": 80384, "gradScoresWkspOff": 3858432,
      "varianceScaleWkspOff": 3858944}),
    (GRAD, "float32", 1, 0, 16, 0, 48, 16801792, {"totalBlocks": 1, "perCoreWkspBytes": 512}),
    (FWD, "bfloat16", 4096, 8, 2048, 40020, 48, 16777216, {"tokensPerCore": 86, "hiddenSizeChunk": 0}),
    (FWD, "float32", 3, 6, 20000, 40030, 3, 16777216, {"tokensPerCore": 1, "hiddenSizeChunk": 6800}),
    (FWD, "bfloat16", 3, 6, 20000, 40030, 3, 16777216, {"tokensPerCore": 1, "hiddenSizeChunk": 9072}),
]
GRAD_FIELDS = ("batchSize numBlocks totalBlocks hiddenSize hiddenTileSize hiddenTileNum coreBatchStart coreBatchEnd "
               "coreBatchCount gradScoreWeightWkspOff coreNum perCoreWkspBytes gradScoresWkspOff "
               "varianceScaleWkspOff").split()
FWD_FIELDS = {"tokensPerCore": (32, "<q"), "hiddenSizeChunk": (88, "<q")}


def decoded(op, data):
    if op == GRAD:
        return dict(zip(GRAD_FIELDS, struct.unpack("<14q", data), strict=True))
    return {name: struct.unpack_from(fmt, data, offset)[0] for name, (offset, fmt) in FWD_FIELDS.items()}


@pytest.mark.parametrize("which", ["ours", "upstream"])
def test_warm_910b2_tiling_pinned_to_the_kit_readme(drivers, which):
    commands = [f"tiling {op} ini910b2 {dtype} 1 {t} {n} {h}" for op, dtype, t, n, h, *_ in PINNED_910B2]
    for line, (op, _, _, _, _, key, block_dim, workspace, fields) in zip(
        drivers.run(which, commands).lines, PINNED_910B2, strict=True
    ):
        assert (line["key"], line["block_dim"], line["workspace"]) == (key, block_dim, workspace), line
        values = decoded(op, bytes.fromhex(line["data"]))
        assert {name: values[name] for name in fields} == fields, line


def test_archive_holds_only_our_registrations(drivers):
    """build/cann-host/libattnres_ge_cann_host.a: one object per *.cpp in op_proto/cann/ and op_host/cann/, no main."""
    archive = REPO / "build" / "cann-host" / "libattnres_ge_cann_host.a"
    sources = [*(REPO / "op_proto" / "cann").glob("*.cpp"), *(REPO / "op_host" / "cann").glob("*.cpp")]
    assert sources, "no C++ registrations in op_proto/cann/ or op_host/cann/"
    members = subprocess.run(["ar", "t", str(archive)], capture_output=True, text=True, check=True).stdout.split()
    assert sorted(members) == sorted(source.with_suffix(".o").name for source in sources)
    nm = ["nm", "-C", "--defined-only", str(archive)]
    symbols = subprocess.run(nm, capture_output=True, text=True, check=True).stdout
    assert " T main" not in symbols
    assert "PlatformAscendC::GetCoreNumAiv" not in symbols and "OpImplRegistry::GetInstance" not in symbols


def test_forward_record_has_no_unset_bytes(drivers):
    """Padding is zero; with T = 0 (where upstream leaves them unset) invHiddenSize is 1/H, wsSizePerToken 0."""
    lines = drivers.run("ours", tiling_commands(FWD, "hand910b2", [(64, 4, 2048), (0, 4, 16)])).lines
    for line in lines:
        data = bytes.fromhex(line["data"])
        assert data[52:56] == bytes(4), line
        assert struct.unpack_from("<f", data, 48)[0] == struct.unpack("<f", struct.pack("<f", 1 / line["H"]))[0]
        assert struct.unpack_from("<Q", data, 56)[0] == 0, line


# ---------------------------------------------------------------- InferShape / InferDataType vs Python

GRAD_LAYOUT = {
    "partial_block": ("T", "H"),
    "block_res": ("T", "N", "H"),
    "proj_weight": ("1", "H"),
    "norm_weight": ("H",),
    "grad_hidden_states": ("T", "H"),
    "inv_norm": ("T", "N+1"),
    "probs": ("T", "N+1"),
}
FWD_LAYOUT = {k: GRAD_LAYOUT[k] for k in ("partial_block", "block_res", "proj_weight", "norm_weight")}


def layout_shape(layout, t, n, h):
    values = {"T": t, "N": n, "H": h, "1": 1, "N+1": -1 if n < 0 else n + 1}
    return tuple(values[letter] for letter in layout)


def infer_cases(op):
    """(attrs, {input: (dtype, shape)}) rows: valid shapes, unknown dims and rank, and every rejection."""
    layout = GRAD_LAYOUT if op == GRAD else FWD_LAYOUT
    if op == GRAD:
        base_attrs = {"valid_block_num": 0}
    else:
        base_attrs = {"valid_block_num": -1, "norm_eps": 1e-6, "need_backward": True}
    float_dtype = "bfloat16"

    def tensors(t, n, h, dtype=float_dtype):
        return {
            name: ("float32" if name in ("inv_norm", "probs") else dtype, layout_shape(lay, t, n, h))
            for name, lay in layout.items()
        }

    rows = []
    low, high = (0, 128) if op == GRAD else (1, 100)
    for t, n, h in [(4, 2, 8), (0, 2, 8), (1, low, 1), (3, high, 17), (5, high + 1, 8), (5, low - 1, 8),
                    (2, 3, 0), (-1, 2, 8), (4, -1, 8), (4, 2, -1), (-1, -1, -1)]:
        for dtype in DTYPES:
            rows.append((base_attrs, tensors(t, n, h, dtype)))
    valid = tensors(4, 2, 8)
    for name in layout:
        dtype, shape = valid[name]
        for bad in (shape + (1,), shape[:-1], tuple(d + 1 for d in shape), (-2,), tuple(-1 for _ in shape), ()):
            rows.append((base_attrs, {**valid, name: (dtype, bad)}))
        for bad_dtype in ("float16", "float32", "int32"):
            rows.append((base_attrs, {**valid, name: (bad_dtype, shape)}))
    if op == FWD:
        rows.append((base_attrs, {**valid, "proj_weight": (float_dtype, (8,))}))
        rows.append((base_attrs, {**valid, "proj_weight": (float_dtype, (2, 8))}))
        for attrs in ({"norm_eps": 0.0}, {"norm_eps": -1.0}, {"norm_eps": math.inf}, {"norm_eps": math.nan},
                      {"norm_eps": 0.5}, {"valid_block_num": 2}, {"valid_block_num": 3}, {"valid_block_num": 0},
                      {"need_backward": False}):
            rows.append(({**base_attrs, **attrs}, valid))
        rows.append(({**base_attrs, "valid_block_num": 2}, tensors(4, -1, 8)))
    else:
        rows.append(({"valid_block_num": 7}, valid))
    return rows


def python_expectation(op, attrs, inputs):
    """(shapes or None, dtypes or None) from the Python prototype; unknown rank [-2] is read as a tensor of the
    prototype's rank with every dim unknown (the rank of each tensor is fixed by the op)."""
    prototype = op_for_type(op).prototype
    layout = GRAD_LAYOUT if op == GRAD else FWD_LAYOUT
    metas = {}
    for name, (dtype, shape) in inputs.items():
        if shape == (-2,):
            shape = (-1,) * len(layout[name])
        metas[name] = TensorMeta(shape, TORCH_DTYPES[dtype])
    bound = prototype.bind_attrs(attrs)
    outputs = prototype.output_names()
    try:
        found = prototype.infer_shape(metas, bound, WHERE_GRAPH)
        shapes_ = [list(found[name]) for name in outputs]
    except AttnResInputError:
        shapes_ = None
    try:
        found = prototype.infer_data_type(metas, bound, WHERE_GRAPH)
        dtypes = [str(found[name]).replace("torch.", "") for name in outputs]
    except AttnResInputError:
        dtypes = None
    return shapes_, dtypes


def infer_command(op, attrs, inputs):
    if op == GRAD:
        attr_text = str(attrs["valid_block_num"])
    else:
        attr_text = f"{attrs['valid_block_num']},{attrs['norm_eps']!r},{int(attrs['need_backward'])}"
    tensor_text = " ".join(
        f"{dtype}:{','.join(str(d) for d in shape) if shape else 's'}" for dtype, shape in inputs.values()
    )
    return f"infer {op} {attr_text} {tensor_text}"


@pytest.mark.parametrize("op", [GRAD, FWD])
def test_infer_shape_and_dtype_equal_the_python_prototype(drivers, op, count):
    rows = infer_cases(op)
    lines = drivers.run("ours", [infer_command(op, a, i) for a, i in rows]).lines
    mismatches = []
    rejected = 0
    for (attrs, inputs), line in zip(rows, lines, strict=True):
        shapes_, dtypes = python_expectation(op, attrs, inputs)
        got_shapes = line["shapes"] if line["shape_rc"] == 0 else None
        got_dtypes = line["dtypes"] if line["dtype_rc"] == 0 else None
        if (got_shapes, got_dtypes) != (shapes_, dtypes):
            mismatches.append((attrs, inputs, (got_shapes, got_dtypes), (shapes_, dtypes)))
        rejected += shapes_ is None or dtypes is None
    assert not mismatches, f"{len(mismatches)} of {len(rows)} differ (C++ vs Python); first: {mismatches[0]}"
    assert 0 < rejected < len(rows)
    count(f"InferShape/InferDataType {op}: rows equal to Python", len(rows))
    count(f"InferShape/InferDataType {op}: of them rejected", rejected)


def test_infer_shape_rejection_names_op_tensor_expected_and_received(drivers):
    bad = {
        "partial_block": ("float32", (4, 8)),
        "block_res": ("float32", (4, 2, 9)),
        "proj_weight": ("float32", (1, 8)),
        "norm_weight": ("float32", (8,)),
    }
    attrs = {"valid_block_num": -1, "norm_eps": 1e-6, "need_backward": False}
    run = drivers.run("ours", [infer_command(FWD, attrs, bad)])
    assert run.lines[0]["shape_rc"] == FAILED
    expected = "block_res must have shape [T, N, H] = [4, *, 8], got [4, 2, 9]"
    assert f"OpName:[BlockAttentionResiduals] [InferShape] {expected}" in run.output


# ---------------------------------------------------------------- OpDef


def opdefs(drivers, which):
    return {line["op"]: line for line in drivers.run(which, ["opdef"]).lines if line["cmd"] == "opdef"}


def test_opdef_equals_upstream(drivers, count):
    ours, upstream = opdefs(drivers, "ours"), opdefs(drivers, "upstream")
    assert set(ours) == {GRAD, FWD, "BlockAttnResPrepare", "BlockAttnResUpdate"}
    assert ours == upstream
    count("OpDef: ops equal to upstream (inputs, outputs, dtypes, formats, attrs, AICore configs)", len(ours))


def python_declaration(op):
    prototype = op_for_type(op).prototype

    def params(args):
        return [(a.name, a.presence, sorted(str(d).replace("torch.", "") for d in set(a.dtypes))) for a in args]

    kinds = {"Int": "int", "Float": "float", "Bool": "bool", "Str": "str"}
    attrs = [(a.name, kinds[a.kind], a.default) for a in prototype.attrs]
    return params(prototype.inputs), params(prototype.outputs), attrs


def registry_declaration(line):
    def params(entries):
        return [(p["name"], p["presence"], sorted(set(p["dtypes"]))) for p in entries]

    def value(attr):
        parse = {"int": int, "float": float, "bool": lambda text: text == "true"}[attr["type"]]
        return parse(attr["default"])

    attrs = [(a["name"], a["type"], value(a)) for a in line["attrs"]]
    return params(line["inputs"]), params(line["outputs"]), attrs


@pytest.mark.parametrize("op", [GRAD, FWD])
def test_opdef_equals_the_python_declaration(drivers, op, count):
    line = opdefs(drivers, "ours")[op]
    registry, python = registry_declaration(line), python_declaration(op)
    differences = [
        f"{name}: OpDef {a} vs Python {b}"
        for name, ours, theirs in zip(("inputs", "outputs", "attrs"), registry, python, strict=True)
        for a, b in zip(ours, theirs, strict=False)  # lengths differ only where the assert fails anyway
        if a != b
    ]
    assert registry == python, f"{op}: the Python declaration differs from the OpDef: {'; '.join(differences)}"
    count(f"OpDef {op}: equal to the Python declaration", 1)
