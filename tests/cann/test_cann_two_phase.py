"""The two-phase ops' registrations (BlockAttnResPrepare, BlockAttnResUpdate) beside CANN's own host code.

Both builds of tests/cann/cann_driver.cpp get the same commands: driver_ours holds our archive, driver_upstream
CANN's host code of both ops from the kit's upstream/two-phase (see conftest.py). Ours overrides Prepare's
TilingParse, compile info and Tiling (CANN's TilingParse fails on a cold platform) and adds InferShape and the
OpDef of both; Update keeps CANN's tiling, so driver_ours has none for it.
"""

from __future__ import annotations

import math
import re
import struct
import subprocess

import pytest
import torch

from attnres_ge.op_proto import PREPARE as PREPARE_PROTO
from attnres_ge.op_proto import UPDATE as UPDATE_PROTO
from attnres_ge.op_proto import WHERE_GRAPH, AttnResInputError, TensorMeta
from attnres_ge.op_proto.export import export_prototypes, proto_header_name

PREPARE = "BlockAttnResPrepare"
UPDATE = "BlockAttnResUpdate"
PROTOTYPES = {PREPARE: PREPARE_PROTO, UPDATE: UPDATE_PROTO}
FAILED = 4294967295  # ge::GRAPH_FAILED as the driver prints it
KEY_VECTOR, KEY_MIX = 0, 1
# The Ascend 950 platforms with everything Prepare's Tiling reads: from the kit's Ascend950PR_9579.ini through
# fe::PlatformInfoManager, and the same values set by hand. hand950 has no L1/L0 sizes (vector template only).
CUBE_PLATFORMS = ("ini950", "hand950cube")
AIC_CORES, AIV_CORES = 28, 56
SYSTEM_WORKSPACE = 16 * 1024 * 1024
# Struct padding of the kernels' records, which CANN's host code never writes: vector 45..47, mix 134..135.
PADDING = {48: range(45, 48), 136: range(134, 136)}  # (Update's 32-byte record has none)
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                "uint64": torch.uint64, "int32": torch.int32}


def prepare_shapes():
    """(T, N, S, D): every N edge with every D, T and S cycling through their edges (rejected ones included:
    T = 0, S = 0, N = 0 / 65, D = 8193); then a grid where the mix template applies (T >= 32, S >= 16,
    D >= 256), so every S tile size, token grouping (T * N <= 16) and D tile gets chosen."""
    blocks = (0, 1, 2, 3, 4, 8, 9, 16, 17, 63, 64, 65)
    hidden = (1, 63, 64, 65, 255, 256, 257, 511, 512, 1000, 2048, 4097, 7168, 8192, 8193)
    tokens = (1, 2, 31, 32, 33, 55, 56, 57, 100, 4096, 0)
    queries = (1, 15, 16, 17, 32, 64, 100, 128, 129, 300, 8, 0, 2)
    cases = [(tokens[i % len(tokens)], n, queries[(3 * i) % len(queries)], d)
             for i, (n, d) in enumerate((n, d) for n in blocks for d in hidden)]
    cases += [(t, n, s, d) for t in (32, 57, 1000) for n in (1, 2, 4, 5, 8, 16, 64) for s in (16, 65, 129, 1000)
              for d in (256, 2048, 8192)]
    # Groups of 8 tokens (N <= 2) only where they keep the tokens per core: T a multiple of 8 * 28 cores.
    cases += [(1792, 1, 16, 256), (2240, 2, 16, 2048), (1792, 2, 129, 512)]
    cases += [(4096, 8, 8, 2048), (4096, 8, 8, 7168), (64, 8, 16, 2048), (4, 4, 1, 128), (65536, 64, 64, 8192)]
    return cases


def prepare_commands(platform, cases):
    return [f"tiling {PREPARE} {platform} float32 0 {t} {n} {d} {s}" for (t, n, s, d) in cases]


def comparable(line):
    """What the kernel reads, with the record's padding (unset upstream) blanked."""
    if line.get("rc") != 0:
        return ("failed", line.get("parse_rc"), line.get("rc"))
    data = bytearray.fromhex(line["data"])
    for i in PADDING.get(len(data), ()):
        data[i] = 0
    return (line["key"], line["block_dim"], line["schedule_mode"], line["workspace"], bytes(data))


# ---------------------------------------------------------------- OpDef


def opdefs(drivers, which):
    return {line["op"]: line for line in drivers.run(which, ["opdef"]).lines if line["cmd"] == "opdef"}


def test_opdefs_equal_upstream(drivers, count):
    ours, upstream = opdefs(drivers, "ours"), opdefs(drivers, "upstream")
    for op in (PREPARE, UPDATE):
        assert ours[op] == upstream[op], op
    count("OpDef two-phase: ops equal to upstream (inputs, outputs, dtypes, formats, contiguity, attrs, AICore)", 2)


def test_opdefs_declare_the_facts_of_cann(drivers):
    """The facts the comparison above rests on, stated independently of the kit's copy."""
    defs = opdefs(drivers, "ours")
    prepare, update = defs[PREPARE], defs[UPDATE]
    assert [(p["name"], p["dtypes"], p["format_list"], p["auto_contiguous"]) for p in prepare["inputs"]] == [
        ("block_res", ["float32"], True, True), ("valid_blocks", ["uint64"], True, True),
        ("pseudo_query", ["float32"], True, True)]
    assert [(p["name"], p["dtypes"]) for p in prepare["outputs"]] == [
        ("numerator", ["float32"]), ("logit_max", ["float32"]), ("exp_sum", ["float32"])]
    assert [(p["name"], p["dtypes"], p["formats"]) for p in update["inputs"]] == [
        ("partial_block", ["float32"], ["ND"]), ("delta", ["bfloat16"], ["ND"]),
        ("pseudo_query", ["float32"], ["ND"]), ("numerator", ["float32"], ["ND"]),
        ("logit_max", ["float32"], ["ND"]), ("exp_sum", ["float32"], ["ND"])]
    assert [(p["name"], p["dtypes"]) for p in update["outputs"]] == [("partial_block", ["float32"]),
                                                                     ("h", ["bfloat16"])]
    for line in (prepare, update):
        assert line["attrs"] == [{"name": "eps", "type": "float", "required": False, "default": "1e-06"}]
        assert list(line["aicore"]) == ["ascend950"]
    assert prepare["aicore"]["ascend950"] == {
        "dynamicCompileStatic.flag": "true", "dynamicFormat.flag": "false", "dynamicRankSupport.flag": "false",
        "dynamicShapeSupport.flag": "true", "needCheckSupport.flag": "false", "opFile.value":
        "block_attn_res_prepare_apt", "precision_reduce.flag": "false"}
    assert update["aicore"]["ascend950"] == {
        "dynamicCompileStatic.flag": "true", "dynamicFormat.flag": "false", "dynamicRankSupport.flag": "true",
        "dynamicShapeSupport.flag": "true", "needCheckSupport.flag": "false", "opFile.value":
        "block_attn_res_update", "precision_reduce.flag": "true"}


@pytest.mark.parametrize("op", [PREPARE, UPDATE])
def test_opdef_equals_the_python_declaration(drivers, op):
    line = opdefs(drivers, "ours")[op]
    prototype = PROTOTYPES[op]

    def python(args):  # the OpDef declares CANN's dtypes (TensorArg.dtypes), not the CPU kernels' wider list
        return [(a.name, a.presence, sorted(str(d).replace("torch.", "") for d in a.dtypes)) for a in args]

    def registry(entries):
        return [(p["name"], p["presence"], sorted(p["dtypes"])) for p in entries]

    assert registry(line["inputs"]) == python(prototype.inputs)
    assert registry(line["outputs"]) == python(prototype.outputs)
    assert [(a["name"], float(a["default"])) for a in line["attrs"]] == [(a.name, a.default) for a in prototype.attrs]


# ---------------------------------------------------------------- Prepare tiling: filled platforms


@pytest.mark.parametrize("platform", CUBE_PLATFORMS)
def test_prepare_tiling_equals_upstream(drivers, platform, count):
    commands = prepare_commands(platform, prepare_shapes())
    ours = drivers.run("ours", commands).lines
    upstream = drivers.run("upstream", commands).lines
    differences = [(o, u) for o, u in zip(ours, upstream, strict=True) if comparable(o) != comparable(u)]
    assert not differences, f"{len(differences)} of {len(commands)} differ; first: {differences[0]}"
    accepted = [o for o in ours if o.get("rc") == 0]
    assert 0 < len(accepted) < len(ours), "the cases must include accepted and rejected shapes"
    assert {o["key"] for o in accepted} == {KEY_VECTOR, KEY_MIX}, "both templates must be exercised"
    assert {o["block_dim"] for o in accepted if o["key"] == KEY_MIX} >= {AIC_CORES}
    mix = [bytes.fromhex(o["data"]) for o in accepted if o["key"] == KEY_MIX]
    assert {int.from_bytes(d[80:84], "little") for d in mix} == {1, 2, 4, 8}, "every token grouping (baseT)"
    assert {o["block_dim"] for o in accepted if o["key"] == KEY_VECTOR} >= {1, AIV_CORES}
    for line in accepted:
        data = bytes.fromhex(line["data"])
        assert all(data[i] == 0 for i in PADDING[len(data)]), f"our padding must be zero: {line}"
    count(f"warm {platform} {PREPARE}: cases compared with upstream", len(commands))
    count(f"warm {platform} {PREPARE}: both rejected", len(ours) - len(accepted))


def test_prepare_without_cube_sizes_upstream_parse_fails_ours_tiles_vector(drivers, count):
    """hand950: the 950's cores and UB but no L1/L0 sizes. CANN's TilingParse requires all of them (though its
    vector template reads none); ours tiles every shape with the vector template, exactly as CANN's code tiles
    the shapes it gives the vector template on the full platform (same cores, same UB)."""
    cases = prepare_shapes()
    upstream = drivers.run("upstream", prepare_commands("hand950", cases[:3]))
    assert all(line["parse_rc"] == FAILED for line in upstream.lines)
    ours = drivers.run("ours", prepare_commands("hand950", cases)).lines
    full = drivers.run("upstream", prepare_commands("ini950", cases)).lines
    vector = [(o, u) for o, u in zip(ours, full, strict=True) if u.get("key", KEY_VECTOR) == KEY_VECTOR]
    assert all(comparable(o) == comparable(u) for o, u in vector)
    assert all(o["key"] == KEY_VECTOR for o in ours if o.get("rc") == 0)
    assert len(vector) < len(cases), "some shapes take the mix template on the full platform"
    count(f"hand950 {PREPARE}: vector or rejected cases equal to upstream's on the full platform", len(vector))


# Pinned from upstream/two-phase/README.md and its driver (CANN's code on Ascend950PR_9579.ini): guards the
# comparison against a changed kit. (T, N, S, D) -> key, block dim, workspace, record size, and fields worked out
# by hand from the kernels' buffer plans: (64, 8, 16, 2048) takes the mix template with one token per group
# (grouping 2 would raise a core's tokens from 3 to 4), the whole S and D tiles of 512 (4 tiles);
# its workspace is 16 MiB + 28 cores * (16 * 16 + 16 * 16 * 16) floats. (4, 4, 1, 128): vector, one unit per core.
VECTOR_FIELDS = {"totalWorkUnits": (8, "<I"), "blockFactor": (16, "<I"), "tailBlockFactor": (20, "<I"),
                 "baseD": (24, "<I"), "usedCoreNum": (36, "<H"), "vCacheRows": (41, "<B"), "qBufferNum": (42, "<B"),
                 "vBufferNum": (43, "<B"), "oBufferNum": (44, "<B")}
MIX_FIELDS = {"qL1Elems": (0, "<Q"), "workspacePerCoreElems": (56, "<Q"), "totalWorkUnits": (72, "<I"),
              "baseT": (80, "<I"), "baseS": (84, "<I"), "baseD": (88, "<I"), "dTileNum": (100, "<I"),
              "mm1NAlign": (112, "<I"), "usedCoreNum": (124, "<H"), "qL1BufferNum": (131, "<B")}
PINNED_950 = [
    ((64, 8, 16, 2048), KEY_MIX, AIC_CORES, SYSTEM_WORKSPACE + 28 * 4352 * 4, 136,
     {"qL1Elems": 16 * 512, "workspacePerCoreElems": 4352, "totalWorkUnits": 64, "baseT": 1, "baseS": 16,
      "baseD": 512, "dTileNum": 4, "mm1NAlign": 16, "usedCoreNum": AIC_CORES, "qL1BufferNum": 2}),
    ((4, 4, 1, 128), KEY_VECTOR, 4, SYSTEM_WORKSPACE, 48,
     {"totalWorkUnits": 4, "blockFactor": 1, "tailBlockFactor": 1, "baseD": 128, "usedCoreNum": 4, "vCacheRows": 4,
      "qBufferNum": 1, "vBufferNum": 2, "oBufferNum": 1}),
]


@pytest.mark.parametrize("which", ["ours", "upstream"])
def test_prepare_tiling_pinned_to_the_kit(drivers, which):
    lines = drivers.run(which, prepare_commands("ini950", [case for case, *_ in PINNED_950])).lines
    for line, (_, key, block_dim, workspace, size, fields) in zip(lines, PINNED_950, strict=True):
        assert (line["key"], line["block_dim"], line["workspace"], len(line["data"]) // 2) == (
            key, block_dim, workspace, size), line
        data = bytes.fromhex(line["data"])
        layout = MIX_FIELDS if key == KEY_MIX else VECTOR_FIELDS
        assert {name: struct.unpack_from(fmt, data, offset)[0] for name, (offset, fmt) in layout.items()} == fields


def test_prepare_tiling_carries_eps_and_rejects_a_bad_one_like_upstream(drivers):
    """eps lands in both records as the float32 GE stores; 0, negative, inf and nan are refused on both sides."""
    epsilons = ("1e-06", "0.5", "1e-30", "0", "-1", "inf", "nan")
    commands = [f"tiling {PREPARE} ini950 float32 0 {t} {n} {d} {s} {eps}" for eps in epsilons
                for (t, n, s, d) in ((4, 4, 1, 128), (64, 8, 16, 2048))]
    ours, upstream = drivers.run("ours", commands), drivers.run("upstream", commands)
    assert [comparable(o) for o in ours.lines] == [comparable(u) for u in upstream.lines]
    accepted = len(commands) * 3 // len(epsilons)  # the first three epsilons are valid
    for command, line in zip(commands[:accepted], ours.lines[:accepted], strict=True):
        data = bytes.fromhex(line["data"])
        offset = 32 if len(data) == 48 else 120  # eps in the vector / mix record
        as_float32 = struct.unpack("<f", struct.pack("<f", float(command.split()[-1])))[0]
        assert struct.unpack_from("<f", data, offset)[0] == as_float32, line
    assert all(line["rc"] == FAILED for line in ours.lines[accepted:])
    assert f"OpName:[{PREPARE}] [Tiling] attribute eps must be finite and > 0 (as float32), got 0" in ours.output


def test_prepare_tiling_rejects_other_archs_like_upstream(drivers):
    """CANN has this op's kernels for ascend950 only; a filled 910B platform is refused on both sides."""
    commands = prepare_commands("hand910b2", [(64, 8, 16, 2048), (4, 4, 1, 128)])
    ours = drivers.run("ours", commands)
    assert all(line["parse_rc"] == 0 and line["rc"] == FAILED for line in ours.lines), ours.lines
    assert "OpName:[BlockAttnResPrepare] [Tiling] CANN ships this op's kernels for ascend950 (NpuArch 3510) " \
           "only, the platform has NpuArch 2201" in ours.output
    # CANN's TilingParse already fails there (no L1/L0 sizes); its Tiling would find no template for NpuArch 2201.
    assert all(line["parse_rc"] == FAILED or line["rc"] == FAILED for line in drivers.run("upstream", commands).lines)


# ---------------------------------------------------------------- Prepare tiling: cold / late / strict


COLD_CASES = [(64, 8, 16, 2048), (4096, 8, 8, 7168), (4, 4, 1, 128), (1, 64, 1, 8192)]


def test_prepare_cold_platform_upstream_parse_fails_ours_falls_back(drivers, count):
    """The seed's defect in CANN's newest op: its TilingParse reads core counts and memory sizes."""
    commands = prepare_commands("cold", COLD_CASES)
    upstream = drivers.run("upstream", commands)
    assert all(line["parse_rc"] == FAILED for line in upstream.lines), upstream.lines
    assert "failed to query Ascend 950 core memory information" in upstream.output
    ours = drivers.run("ours", commands)
    for line in ours.lines:
        assert line["parse_rc"] == 0 and line["rc"] == 0, line
        assert (line["key"], line["block_dim"], line["workspace"]) == (KEY_VECTOR, 1, SYSTEM_WORKSPACE), line
    assert ours.output.count(f"OpName:[{PREPARE}] [Tiling] platform info incomplete after a re-query") == 1
    count(f"cold {PREPARE}: upstream TilingParse failed", len(upstream.lines))
    count(f"cold {PREPARE}: our TilingParse+Tiling passed on 1 core", len(ours.lines))


def test_prepare_late_platform_uses_the_full_platform(drivers, count):
    """Cold at TilingParse, filled before Tiling: ours tiles as on the filled platform; upstream never gets to
    Tiling (GE stops at its failed TilingParse)."""
    cases = COLD_CASES + [(32, 2, 16, 256), (1000, 16, 129, 8192)]
    late = drivers.run("ours", prepare_commands("late950", cases))
    warm = drivers.run("ours", prepare_commands("hand950cube", cases)).lines
    assert [comparable(x) for x in late.lines] == [comparable(x) for x in warm]
    assert {line["key"] for line in late.lines} == {KEY_VECTOR, KEY_MIX}
    assert "platform info incomplete" not in late.output
    assert all(line["parse_rc"] == FAILED for line in drivers.run("upstream", prepare_commands("late950", cases)).lines)
    count(f"late {PREPARE}: full platform used", len(late.lines))


def test_prepare_strict_mode_fails_tiling_on_a_cold_platform(drivers, count):
    strict = drivers.run("ours", prepare_commands("cold", COLD_CASES), ATTNRES_GE_STRICT_PLATFORM="1")
    for line in strict.lines:
        assert line["parse_rc"] == 0 and line["rc"] == FAILED, line
    assert f"OpName:[{PREPARE}] [Tiling] platform info still incomplete after a re-query" in strict.output
    warm = drivers.run("ours", prepare_commands("ini950", COLD_CASES), ATTNRES_GE_STRICT_PLATFORM="1")
    assert all(line["rc"] == 0 for line in warm.lines), "strict mode must not affect a filled platform"
    count(f"strict {PREPARE}: Tiling failed with the message", len(strict.lines))


def test_prepare_first_calls_from_several_threads_on_a_cold_platform(drivers, count):
    threads = 8
    run = drivers.run("ours", [f"threads {threads} {PREPARE} cold float32 0 64 8 2048 16"])
    results = run.lines[0]["results"]
    assert len(results) == threads
    assert all(r["parse_rc"] == 0 and r["rc"] == 0 and r["block_dim"] == 1 for r in results), results
    assert len({r["data"] for r in results}) == 1, "every thread must get the same tiling"
    assert run.output.count(f"OpName:[{PREPARE}] [Tiling] platform info incomplete") == 1
    count(f"threads {PREPARE}: first calls at once, all fell back to 1 core", threads)


# ---------------------------------------------------------------- Update: CANN's tiling kept


def update_commands(platform, cases):
    return [f"tiling {UPDATE} {platform} bfloat16 0 {t} 0 {d}" for (t, d) in cases]


def test_update_keeps_cann_tiling_which_reads_nothing_in_tiling_parse(drivers, count):
    """Why the package leaves Update's tiling to CANN: its TilingParse reads nothing (passes cold), its Tiling
    reads the platform when it runs (a late-filled platform works) and fails with a message, never a launch with
    0 cores, while the platform is still empty. Our archive registers no Update tiling to compete with it."""
    cases = [(4096, 2048), (3, 7168)]
    cold = drivers.run("upstream", update_commands("cold", cases))
    assert all(line["parse_rc"] == 0 and line["rc"] == FAILED for line in cold.lines), cold.lines
    late = drivers.run("upstream", update_commands("late950", cases)).lines
    warm = drivers.run("upstream", update_commands("ini950", cases)).lines
    assert all(line["parse_rc"] == 0 and line["rc"] == 0 for line in late), late
    assert [comparable(x) for x in late] == [comparable(x) for x in warm]
    assert [(x["key"], x["block_dim"]) for x in warm] == [(0, AIV_CORES), (1, 3)]  # the kit README's figures
    ours = drivers.run("ours", update_commands("ini950", cases)).lines
    assert all(line["error"] == "op not registered or platform unavailable" for line in ours), ours
    count(f"{UPDATE}: CANN's TilingParse passed cold, its Tiling passed late-filled", len(cold.lines) + len(late))


# ---------------------------------------------------------------- InferShape / InferDataType

PREPARE_LAYOUT = {"block_res": ("float32", "T N D"), "valid_blocks": ("uint64", "1"),
                  "pseudo_query": ("float32", "S D")}
UPDATE_LAYOUT = {"partial_block": ("float32", "T D"), "delta": ("bfloat16", "T D"), "pseudo_query": ("float32", "D"),
                 "numerator": ("float32", "T D"), "logit_max": ("float32", "T"), "exp_sum": ("float32", "T")}
LAYOUTS = {PREPARE: PREPARE_LAYOUT, UPDATE: UPDATE_LAYOUT}


def tensors(op, **dims):
    values = {**dims, "1": 1}
    return {name: (dtype, tuple(values[letter] for letter in layout.split()))
            for name, (dtype, layout) in LAYOUTS[op].items()}


def valid_dims(op):
    """Concrete shapes inside our limits (CANN's InferShape accepts them all): every T, N, S, D edge combined."""
    if op == PREPARE:
        return [dict(T=t, N=n, S=s, D=d) for t in (0, 1, 5, 4096) for n in (1, 7, 64) for s in (0, 1, 129)
                for d in (1, 100, 8192)]
    return [dict(T=t, D=d) for t in (0, 1, 7, 4096) for d in (0, 1, 100, 8192)]


def infer_rows(op):
    """(eps, {input: (dtype, shape)}): valid shapes, unknown dims and rank, and every rejection."""
    rows = [(1e-6, tensors(op, **dims)) for dims in valid_dims(op)]
    if op == PREPARE:
        for dims in (dict(T=-1, N=2, S=3, D=8), dict(T=4, N=-1, S=3, D=8), dict(T=4, N=2, S=-1, D=-1),
                     dict(T=4, N=0, S=3, D=8), dict(T=4, N=65, S=3, D=8), dict(T=4, N=2, S=3, D=0),
                     dict(T=4, N=2, S=3, D=8193)):
            rows.append((1e-6, tensors(op, **dims)))
        valid = tensors(op, T=4, N=2, S=3, D=8)
        rows.append((1e-6, {**valid, "valid_blocks": ("uint64", (2,))}))
        rows.append((1e-6, {**valid, "valid_blocks": ("uint64", (-1,))}))
    else:
        for dims in (dict(T=-1, D=8), dict(T=4, D=-1), dict(T=4, D=8193), dict(T=-1, D=-1)):
            rows.append((1e-6, tensors(op, **dims)))
        valid = tensors(op, T=4, D=8)
    for name, (dtype, shape) in valid.items():
        for bad in (shape + (1,), shape[:-1], tuple(d + 1 for d in shape), (-2,), tuple(-1 for _ in shape)):
            rows.append((1e-6, {**valid, name: (dtype, bad)}))
        for bad_dtype in ("float32", "bfloat16", "float16", "uint64", "int32"):
            if bad_dtype != dtype:
                rows.append((1e-6, {**valid, name: (bad_dtype, shape)}))
    for eps in (0.0, -1.0, math.inf, math.nan, 0.5, 1e-50):
        rows.append((eps, valid))
    return rows


def infer_command(op, eps, inputs):
    text = " ".join(f"{dtype}:{','.join(str(d) for d in shape) if shape else 's'}" for dtype, shape in inputs.values())
    return f"infer {op} {eps!r} {text}"


def python_expectation(op, eps, inputs):
    """(shapes or None, dtypes or None) from the Python prototype, with the OpDef's dtypes (what the C++ side, for
    Ascend, accepts: CANN's list; the CPU kernels take more, TensorArg.cpu_dtypes)."""
    prototype = PROTOTYPES[op]
    metas = {name: TensorMeta(shape, TORCH_DTYPES[dtype]) for name, (dtype, shape) in inputs.items()}
    bound = prototype.bind_attrs({"eps": eps})
    outputs = prototype.output_names()
    try:
        found = prototype.infer_shape(metas, bound, WHERE_GRAPH)
        shapes = [list(found[name]) for name in outputs]
    except AttnResInputError:
        shapes = None
    opdef_dtypes = {arg.name: arg.dtypes for arg in prototype.inputs}
    dtypes = None
    if all(metas[name].dtype in opdef_dtypes[name] for name in metas):
        try:
            found = prototype.infer_data_type(metas, bound, WHERE_GRAPH)
            dtypes = [str(found[name]).replace("torch.", "") for name in outputs]
        except AttnResInputError:
            pass
    return shapes, dtypes


def got(line):
    return (line["shapes"] if line["shape_rc"] == 0 else None, line["dtypes"] if line["dtype_rc"] == 0 else None)


@pytest.mark.parametrize("op", [PREPARE, UPDATE])
def test_infer_shape_and_dtype_equal_upstream_on_valid_inputs(drivers, op, count):
    rows = [(1e-6, tensors(op, **dims)) for dims in valid_dims(op)]
    commands = [infer_command(op, eps, inputs) for eps, inputs in rows]
    ours = drivers.run("ours", commands).lines
    upstream = drivers.run("upstream", commands).lines
    assert all(line["shape_rc"] == 0 and line["dtype_rc"] == 0 for line in ours + upstream)
    assert [got(x) for x in ours] == [got(x) for x in upstream]
    count(f"InferShape/InferDataType {op}: valid rows equal to upstream", len(rows))


@pytest.mark.parametrize("op", [PREPARE, UPDATE])
def test_infer_shape_and_dtype_equal_the_python_prototype(drivers, op, count):
    rows = infer_rows(op)
    lines = drivers.run("ours", [infer_command(op, eps, inputs) for eps, inputs in rows]).lines
    mismatches = []
    rejected = 0
    for (eps, inputs), line in zip(rows, lines, strict=True):
        expected = python_expectation(op, eps, inputs)
        if got(line) != expected:
            mismatches.append((eps, inputs, got(line), expected))
        rejected += None in expected
    assert not mismatches, f"{len(mismatches)} of {len(rows)} differ (C++ vs Python); first: {mismatches[0]}"
    assert 0 < rejected < len(rows)
    count(f"InferShape/InferDataType {op}: rows equal to Python", len(rows))
    count(f"InferShape/InferDataType {op}: of them rejected", rejected)


@pytest.mark.parametrize(("op", "inputs", "message"), [
    (PREPARE, {**tensors(PREPARE, T=4, N=2, S=3, D=8), "pseudo_query": ("float32", (3, 9))},
     "[InferShape] pseudo_query must have shape [S, D] = [*, 8], got [3, 9]"),
    (PREPARE, tensors(PREPARE, T=4, N=65, S=3, D=8),
     "[InferShape] block_res must have 1 <= N <= 64 (sealed snapshots), got N = 65"),
    (PREPARE, {**tensors(PREPARE, T=4, N=2, S=3, D=8), "valid_blocks": ("uint64", (2,))},
     "[InferShape] valid_blocks must have shape [1] = [1], got [2]"),
    (UPDATE, {**tensors(UPDATE, T=4, D=8), "logit_max": ("float32", (5,))},
     "[InferShape] logit_max must have shape [T] = [4], got [5]"),
    (UPDATE, tensors(UPDATE, T=4, D=8193), "[InferShape] partial_block must have 0 <= D <= 8192 (hidden size), "
     "got D = 8193"),
])
def test_infer_shape_rejection_names_op_tensor_expected_and_received(drivers, op, inputs, message):
    run = drivers.run("ours", [infer_command(op, 1e-6, inputs)])
    assert run.lines[0]["shape_rc"] == FAILED
    assert f"OpName:[{op}] {message}" in run.output


def test_infer_datatype_rejection_names_the_dtype(drivers):
    inputs = {**tensors(UPDATE, T=4, D=8), "delta": ("float16", (4, 8))}
    run = drivers.run("ours", [infer_command(UPDATE, 1e-6, inputs)])
    assert run.lines[0]["dtype_rc"] == FAILED
    assert f"OpName:[{UPDATE}] [InferDataType] delta must have dtype bfloat16, got float16" in run.output


# ---------------------------------------------------------------- REG_OP (generated by export-proto)

REG_OP_TENSOR = re.compile(r"\.(INPUT|OUTPUT)\((\w+), TensorType\(\{([^}]*)\}\)\)")
REG_OP_ATTR = re.compile(r"\.ATTR\((\w+), (\w+), ([^)]*)\)")
GE_DTYPE_NAMES = {"DT_FLOAT": "float32", "DT_BF16": "bfloat16", "DT_UINT64": "uint64"}


def test_generated_reg_op_compiles_and_declares_cann_opdef(drivers, cann_kit, tmp_path):
    """The REG_OP headers export-proto writes from the Python declarations compile against CANN's
    graph/operator_reg.h, name partial_block as INPUT and OUTPUT (the reference tensor: GE generates both
    accessors), and list exactly the inputs, outputs, dtypes and attribute of CANN's OpDefs (read from the
    registry of upstream's build)."""
    headers = export_prototypes([PREPARE_PROTO, UPDATE_PROTO], tmp_path / "proto")[:-1]
    upstream = opdefs(drivers, "upstream")
    for op, header in zip((PREPARE, UPDATE), headers, strict=True):
        assert header.name == proto_header_name(op)
        text = header.read_text()
        tensors = {"INPUT": [], "OUTPUT": []}
        for macro, name, dtypes in REG_OP_TENSOR.findall(text):
            tensors[macro].append((name, [GE_DTYPE_NAMES[d.strip()] for d in dtypes.split(",")]))
        assert tensors["INPUT"] == [(p["name"], p["dtypes"]) for p in upstream[op]["inputs"]], op
        assert tensors["OUTPUT"] == [(p["name"], p["dtypes"]) for p in upstream[op]["outputs"]], op
        assert [(name, kind, float(default)) for name, kind, default in REG_OP_ATTR.findall(text)] == [
            ("eps", "Float", float(upstream[op]["attrs"][0]["default"]))]
    use = (
        "#include <type_traits>\n" + "".join(f'#include "{h.name}"\n' for h in headers) +
        "void Use() {\n"
        '  ge::op::BlockAttnResUpdate update("update");\n'
        "  (void)ge::op::BlockAttnResUpdate::name_in_partial_block();\n"
        "  (void)ge::op::BlockAttnResUpdate::name_out_partial_block();\n"
        "  (void)ge::op::BlockAttnResUpdate::name_out_h();\n"
        '  static_assert(std::is_same<decltype(update.get_attr_eps()), float>::value, "eps is Float");\n'
        '  ge::op::BlockAttnResPrepare prepare("prepare");\n'
        "  (void)ge::op::BlockAttnResPrepare::name_in_valid_blocks();\n"
        "  (void)ge::op::BlockAttnResPrepare::name_out_exp_sum();\n"
        "}\n"
    )
    source = tmp_path / "two_phase_proto_check.cpp"
    source.write_text(use)
    kit = cann_kit
    include_dirs = [line.strip() for line in (kit / "include_dirs.txt").read_text().splitlines() if line.strip()]
    command = ["g++", "-std=c++17", "-fsyntax-only", "-DOS_TYPE=0", *(f"-I{kit / d}" for d in include_dirs),
               f"-I{tmp_path / 'proto'}", str(source)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
