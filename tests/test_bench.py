"""`attnres-ge bench` runs end to end, writes its JSON and plot, and never reports disturbed rounds as results."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attnres_ge.op_kernel
from attnres_ge import bench
from attnres_ge.bench import harness, paths, report, run
from attnres_ge.bench.cases import registry
from attnres_ge.bench.cases.block import BLOCK_PROVIDERS, BlockCase, block_traffic
from attnres_ge.bench.cases.stream import STREAM_PROVIDERS, StreamCase, stream_traffic
from attnres_ge.bench.cases.two_phase import TWO_PHASE_PROVIDERS, prepare_traffic, update_traffic
from attnres_ge.bench.overheads import COMPILED_EAGER
from attnres_ge.bench.plot import plot
from attnres_ge.cli import build_parser

SMALL = ["--shape", "8,2,64", "--dtypes", "float32", "--rounds", "3", "--overhead-rounds", "5"]


@pytest.fixture
def never_disturbed(monkeypatch):
    """This shared host's noise must not decide a test: no copy rate or spread counts as disturbed."""
    monkeypatch.setattr(harness, "DISTURBED_COPY_FRACTION", 0.0)
    monkeypatch.setattr(harness, "DISTURBED_SPREAD_TO_MEDIAN", float("inf"))
    monkeypatch.setattr(harness, "DISTURBED_ROUND_RATIO_SPREAD", float("inf"))


def test_bench_writes_every_measurement(tmp_path, never_disturbed, capsys):
    out = tmp_path / "bench.json"
    providers = ["op-eager", "op-graph", "kernel", "read", "torch-eager"]
    status = bench.main(["--shapes", "T16_N8_H4096", "--dtypes", "float32", "--providers", *providers,
                         "--rounds", "3", "--overhead-rounds", "21", "--json", str(out)])
    assert status == 0
    printed = capsys.readouterr().out.splitlines()
    assert any(line.startswith("kernels: ") and "kernel threads" in line for line in printed)
    report = json.loads(out.read_text())
    keys = {(m["provider"], m["direction"]) for m in report["results"]}
    assert keys == {(p, d) for p in providers for d in ("forward", "backward")}
    for m in report["results"]:
        assert m["median_ms"] > 0 and m["copy_gbps"] > 0 and m["page_faults_per_call"] >= 0
        assert m["trusted"] and m["attempts"] == 1 and m["quiet_copy_gbps"] > 0
    assert any(r["provider"] == "op-graph" and r["against"] == "torch-eager" for r in report["speedups"])
    assert {(r["provider"], r["direction"]) for r in report["overheads"]} == {
        (p, d) for p in ("op-eager", "op-graph", COMPILED_EAGER) for d in ("forward", "backward")}
    assert report["machine"]["kernels"] in ("native", "python")
    assert report["machine"]["kernels"] and report["machine"]["kernel_threads"] >= 1
    compiled = [r for r in report["overheads"] if r["provider"] == COMPILED_EAGER]
    # A median of time differences: its sign is the host's noise on a loaded machine, so only its presence is tested.
    assert compiled and all(math.isfinite(r["overhead_us"]) for r in compiled)


def test_custom_shapes_are_timed_under_their_own_names(tmp_path, never_disturbed):
    out = tmp_path / "bench.json"
    assert bench.main([*SMALL, "--shape", "4,1,16", "--providers", "kernel", "torch-eager", "--json", str(out)]) == 0
    shapes = {m["shape"] for m in json.loads(out.read_text())["results"]}
    assert shapes == {"T8_N2_H64", "T4_N1_H16"}  # --shape alone times only the shapes given


@pytest.mark.parametrize("text", ["8,2", "8,2,x", "0,2,64"])
def test_bad_custom_shape_is_refused(text, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--shape", text])
    assert "--shape" in capsys.readouterr().err


def test_disturbed_rounds_are_rerun_then_flagged_never_reported(tmp_path, monkeypatch, capsys):
    """A paired copy far below the quiet copy's rate: the rounds run again, then the measurements are flagged;
    no fraction of the copy, no speedup is printed or written from them."""
    monkeypatch.setattr(harness, "quiet_copy_gbps", lambda copy, copy_bytes: 1e6)  # a quiet copy no pair can match
    out = tmp_path / "bench.json"
    assert bench.main([*SMALL, "--providers", "kernel", "torch-eager", "--retries", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("rounds disturbed (attempt") == 4  # forward and backward, each twice
    assert "of copy" not in printed and "x vs" not in printed
    assert "stayed disturbed after 1 rerun(s)" in printed
    report = json.loads(out.read_text())
    assert report["speedups"] == [] and report["overheads"] == []
    for m in report["results"]:
        assert not m["trusted"] and m["attempts"] == 2 and "under 50% of the quiet copy" in m["disturbed"]


def test_disturbance_names_each_reason():
    quiet = [1e-3] * 8
    assert harness.disturbance(quiet, copy_gbps=40.0, quiet_gbps=50.0) == ""
    assert "under 50% of the quiet copy's 100.0 GB/s" in harness.disturbance(quiet, 40.0, 100.0)
    noisy = [1e-3, 1e-3, 1e-3, 1e-3, 9e-3, 9e-3, 9e-3, 9e-3]  # interquartile range above the median
    assert harness.disturbance(noisy, 40.0, 50.0).startswith("spread")
    steady_pairs = [2e-3 * (1 + 0.01 * i) for i in range(8)]  # the copy's time follows the call's round by round
    assert harness.disturbance(quiet, 40.0, 50.0, copy_times=[2e-3] * 8) == ""
    assert harness.disturbance([t / 2 for t in steady_pairs], 40.0, 50.0, copy_times=steady_pairs) == ""
    apart = [1e-3, 3e-3, 1e-3, 3e-3, 1e-3, 3e-3, 1e-3, 3e-3]  # the copy slow in every other round, the call not
    assert "spreads 100% round to round" in harness.disturbance(quiet, 40.0, 50.0, copy_times=apart)


def test_paths_are_timed_one_after_the_other_and_judged_against_the_goals(tmp_path, never_disturbed, monkeypatch,
                                                                          capsys):
    native = pytest.importorskip("attnres_ge.op_kernel.native")
    if attnres_ge.op_kernel.active_implementation() != "native":
        pytest.skip("the Python kernels are active")
    monkeypatch.setattr(report, "GOAL_SHAPE", (8, 2, 64))  # the goals' shape, small enough for a test
    before = native.isa_path()
    out = tmp_path / "bench.json"
    assert bench.main([*SMALL, "--providers", "op-eager", "kernel", "--paths", "all", "--json", str(out)]) == 0
    assert native.isa_path() == before  # the run leaves the kernels on the path they ran on
    written = json.loads(out.read_text())
    paths = list(native.available_isa_paths())
    assert list(dict.fromkeys(m["path"] for m in written["results"])) == paths
    vector_paths = [path for path in paths if path in report.GOAL_PATHS]
    goals = {(g["path"], g["provider"], g["direction"]): g for g in written["goals"]}
    assert set(goals) == {(path, "op-eager", d) for path in vector_paths for d in ("forward", "backward")}
    for goal in goals.values():
        assert goal["met"] == (goal["fraction_of_copy"] >= goal["goal"])
    printed = capsys.readouterr().out
    assert printed.count("kernels: native, ") == len(paths)
    if vector_paths:
        assert "goals at T=8 N=2 H=64" in printed
        for path in vector_paths:
            assert any(line.split()[:2] == [path, "float32"] for line in printed.splitlines())


def test_paths_this_cpu_cannot_run_are_refused(capsys):
    with pytest.raises(SystemExit):
        bench.main([*SMALL, "--paths", "avx9000"])
    assert "--paths" in capsys.readouterr().err


def test_paths_need_the_native_kernels(capsys):
    attnres_ge.op_kernel.KERNELS.set_implementation("python")
    try:
        assert paths.kernel_path() == "python"
        with pytest.raises(SystemExit):
            bench.main([*SMALL, "--paths", "all"])
    finally:
        attnres_ge.op_kernel.KERNELS.set_implementation(None)
    assert "--paths needs the native kernels" in capsys.readouterr().err


def test_goal_table_marks_each_goal_met_missed_disturbed_or_not_timed():
    def measurement(provider, direction, fraction, disturbed="", path="avx2"):
        return harness.Measurement("T4096_N8_H2048", "bfloat16", provider, direction, 1.0, 0.1, 0.9, 10**6, 1.0, 2.0,
                                 fraction, 0.0, 3.0, 1, disturbed, path)
    results = [measurement("op-graph", "forward", 0.95), measurement("op-graph", "backward", 0.5),
               measurement("op-eager", "forward", 0.99, "spread 9 ms"), measurement("kernel", "forward", 0.3),
               measurement("op-graph", "forward", 0.1, path="scalar")]
    rows = report.goal_rows(results, {"T4096_N8_H2048": report.GOAL_SHAPE})
    assert [(r["provider"], r["direction"], r["met"]) for r in rows] == [
        ("op-graph", "forward", True), ("op-graph", "backward", False), ("op-eager", "forward", None)]
    line = report.goal_table(rows)[-1]
    assert line.split()[:2] == ["avx2", "bfloat16"]
    assert [cell.strip() for cell in line[24:].split("  ") if cell.strip()] == [
        "95% met", "50% NOT MET", "disturbed", "not timed"]
    assert report.goal_rows(results, {"T4096_N8_H2048": (16, 8, 4096)}) == []  # another shape has no goals


def test_bench_plot_writes_a_png(tmp_path):
    measurements = [
        harness.Measurement("T16_N8_H4096", "float32", provider, direction, ms, 0.1, 0.9 * ms, 10**6, 1.0, 2.0, 0.5,
                          0.0, 3.0, 1, "" if provider != "op-graph" else "paired copy too slow")
        for provider, ms in (("kernel", 1.0), ("op-graph", 1.2), ("torch-eager", 9.0), ("torch-inductor", 3.0))
        for direction in ("forward", "backward")
    ]
    out = tmp_path / "bench.png"
    assert plot(measurements, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _flags_without_help(parser: argparse.ArgumentParser, prefix: str) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                missing += _flags_without_help(sub, f"{prefix} {name}")
        elif action.option_strings and not action.help:
            missing.append(f"{prefix} {action.option_strings[-1]}")
    return missing


def test_every_cli_flag_has_help():
    assert _flags_without_help(build_parser(), "attnres-ge") + _flags_without_help(bench.build_parser(),
                                                                                  "attnres-ge bench") == []


TINY_TWO_PHASE = {"T8_N2_S3_D64": (8, 2, 3, 64)}
TINY_BLOCKS = {"block_T8_N2_D64_R3": (8, 2, 64, 3), "block_T1_N3_D32_R2": (1, 3, 32, 2)}
TINY_STREAMS = {"stream_T8_D64_L5_B2": (8, 64, 5, 2)}


@pytest.fixture
def tiny_suites(monkeypatch):
    """The two-phase ops', the blocks' and the stream's named shapes, small enough for a test."""
    monkeypatch.setitem(registry.NAMED_SHAPES, "two-phase", TINY_TWO_PHASE)
    monkeypatch.setitem(registry.NAMED_SHAPES, "block", TINY_BLOCKS)
    monkeypatch.setitem(registry.NAMED_SHAPES, "stream", TINY_STREAMS)
    monkeypatch.setitem(registry.DEFAULT_SHAPES, "block", ("block_T1_N3_D32_R2",))


def test_two_phase_providers_blocks_and_streams_run_end_to_end(tmp_path, never_disturbed, tiny_suites, capsys):
    out = tmp_path / "bench.json"
    shapes = [*TINY_TWO_PHASE, *TINY_BLOCKS, *TINY_STREAMS]
    assert bench.main(["--shapes", *shapes, "--rounds", "3", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    timed = {(m["shape"], m["provider"]): m for m in report["results"]}
    expected = [(name, p) for name in TINY_TWO_PHASE for p in TWO_PHASE_PROVIDERS]
    expected += [(name, p) for name in TINY_BLOCKS for p in BLOCK_PROVIDERS]
    expected += [(name, p) for name in TINY_STREAMS for p in STREAM_PROVIDERS]
    assert sorted(timed) == sorted(expected)  # no per-layer shape: only named shapes are timed
    for (_, provider), m in timed.items():
        assert m["trusted"] and m["median_ms"] > 0 and m["direction"] == "forward" and m["dtype"] == "float32"
        runs_per_layer_op = provider in ("block-per-layer", "stream-per-layer")
        assert m["path"] == (paths.kernel_path() if runs_per_layer_op else paths.two_phase_path())
    tokens, blocks, readers, hidden = TINY_TWO_PHASE["T8_N2_S3_D64"]
    assert timed["T8_N2_S3_D64", "prepare-eager"]["traffic_bytes"] == 4 * (8 * 2 * 64 + 8 * 3 * 64 + 2 * 3 * 8)
    assert timed["T8_N2_S3_D64", "update-graph"]["traffic_bytes"] == 4 * (5 * 8 * 64 + 2 * 8)
    rows = {row["shape"]: row for row in report["blocks"]}
    assert set(rows) == set(TINY_BLOCKS) | set(TINY_STREAMS)
    for name, row in rows.items():
        kind = "block" if name in TINY_BLOCKS else "stream"
        per_layer, two_phase = timed[name, f"{kind}-per-layer"], timed[name, f"{kind}-two-phase"]
        assert row["speedup"] == pytest.approx(per_layer["median_ms"] / two_phase["median_ms"])
        assert row["traffic_ratio"] == pytest.approx(per_layer["traffic_bytes"] / two_phase["traffic_bytes"])
        if kind == "block":
            _, n, _, r = TINY_BLOCKS[name]
            assert row["traffic_ratio"] == pytest.approx(r * (n + 5) / (n + 6 * r))
    printed = capsys.readouterr().out
    assert printed.count("two-phase against per-layer reads") == 1
    assert sum("traffic model" in line and "speedup" in line for line in printed.splitlines()) == len(rows)


def test_traffic_formulas_count_each_plane_once():
    tokens, hidden = 4096, 2048
    plane = tokens * hidden
    assert prepare_traffic(tokens, 8, 8, hidden) == 16 * plane + 16 * tokens
    assert update_traffic(tokens, hidden) == 4 * 5 * plane + 8 * tokens  # float32 delta and h
    assert update_traffic(tokens, hidden, delta_size=2) == (12 + 4) * plane + 8 * tokens
    per_layer_8, two_phase_8 = block_traffic(tokens, 8, hidden, 8).values()
    assert (per_layer_8, two_phase_8) == (104 * plane, 56 * plane)
    ratio_32 = block_traffic(1, 32, hidden, 8)["block-per-layer"] / block_traffic(1, 32, hidden, 8)[
        "block-two-phase"]
    assert ratio_32 == pytest.approx(296 / 80)  # issue 23: about 2x (N=8) to 4x (N=32) fewer bytes


def test_stream_traffic_walks_the_schedule():
    """Two layers, a seal in each (counted by hand, in planes). Per-layer: seal 2, read 3 (1 sealed), add 3;
    read 3, seal 2, read 4 (2 sealed), add 3; the final read 4. Two-phase: live into float32 2, the first read 2,
    seal 3 + prepare 1 + 2, read 5; read 5, seal 3 + prepare 2 + 2, read 5; the final read 5."""
    assert stream_traffic(1, 1, 2, 1) == {"stream-per-layer": 24, "stream-two-phase": 37}
    assert stream_traffic(3, 5, 2, 1) == {"stream-per-layer": 24 * 15, "stream-two-phase": 37 * 15}


def test_stream_reads_agree_both_ways():
    """The stream's two providers compute the same forward (so the bench times one computation two ways)."""
    case = StreamCase((6, 48, 5, 2))
    per_layer, two_phase = (case.provider(name)["forward"]() for name in STREAM_PROVIDERS)
    torch.testing.assert_close(two_phase, per_layer, rtol=1e-5, atol=1e-5)


def test_block_reads_agree_both_ways():
    """The two providers of a block compute the same reads (so the bench times one computation two ways)."""
    shape = (5, 3, 48, 4)
    per_layer = BlockCase(shape).provider("block-per-layer")["forward"]()
    two_phase = BlockCase(shape).provider("block-two-phase")["forward"]()
    assert len(per_layer) == len(two_phase) == 4
    for left, right in zip(per_layer, two_phase, strict=True):
        torch.testing.assert_close(right, left, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("argv", "two_phase", "blocks", "streams"), [
    ([], list(TINY_TWO_PHASE), ["block_T1_N3_D32_R2"], list(TINY_STREAMS)),  # every suite's default
    (["--all-blocks"], list(TINY_TWO_PHASE), list(TINY_BLOCKS), list(TINY_STREAMS)),
    (["--shape", "4,1,16"], [], [], []),  # a per-layer shape alone times nothing else
    (["--shapes", "block_T8_N2_D64_R3"], [], ["block_T8_N2_D64_R3"], []),
    (["--shapes", "stream_T8_D64_L5_B2"], [], [], ["stream_T8_D64_L5_B2"]),
])
def test_named_shapes_pick_their_suite(argv, two_phase, blocks, streams, tiny_suites):
    args = bench.build_parser().parse_args(argv)
    per_layer = run.select_shapes(args)
    suites = args.suite_shapes
    assert list(suites["two-phase"]) == two_phase and sorted(suites["block"]) == sorted(blocks)
    assert list(suites["stream"]) == streams
    assert list(per_layer) == (list(registry.NAMED_SHAPES["per-layer"]) if not argv or argv == ["--all-blocks"] else
                               ["T4_N1_H16"] if "--shape" in argv else [])


def test_list_prints_each_named_shape_and_marks_the_defaults(capsys):
    assert bench.main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    shapes = registry.all_shapes()
    assert len(lines) == sum(len(named) for named in shapes.values()) + len(
        [op for op in registry.registry_ops() if op.name not in registry.bespoke_ops() | set(registry.generic_ops())])
    first = lines[0].split()
    assert first[:3] == ["per-layer", "T4096_N8_H2048", "T=4096"] and "default" in first
    assert first[-2:] == ["block_attention_residuals", "block_attention_residuals_backward"]
    block_lines = [line.split() for line in lines if line.startswith("block ")]
    assert sum("default" in line for line in block_lines) == len(registry.DEFAULT_SHAPES["block"])


def test_ops_the_generic_family_cannot_time_are_refused(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--ops", "block_attention_residuals"])  # it has a family of its own
    assert "--ops: block_attention_residuals not timed by the generic family" in capsys.readouterr().err


GENERIC_OP_SCRIPT = """
import dataclasses, json, sys

import torch

import attnres_ge
sys.path.insert(0, sys.argv[1])
import add_into  # defines the op and appends its registry entry to ops.OPS
from attnres_ge import bench
from attnres_ge.bench import harness
from attnres_ge.bench.cases import registry
from attnres_ge.ge_plugin import ops

harness.DISTURBED_COPY_FRACTION, harness.DISTURBED_SPREAD_TO_MEDIAN = 0.0, float("inf")  # the host's noise
harness.DISTURBED_ROUND_RATIO_SPREAD = float("inf")                                     # decides nothing


def inputs(dims, dtype):
    generator = torch.Generator().manual_seed(0)
    x, y = (torch.randn(dims["T"], dims["H"], generator=generator).to(dtype) for _ in range(2))
    return (x, y), {"alpha": 0.5}


assert "add_into" not in registry.generic_ops()  # no bench_inputs: listed as untimed
ops.OPS = tuple(dataclasses.replace(op, bench_inputs=inputs) if op.name == "add_into" else op for op in ops.OPS)
bench.main(["--list"])
registry.NAMED_SHAPES["add_into"] = {"add_into_T8_H64": (8, 64)}
bench.main(["--ops", "add_into", "--rounds", "3", "--dtypes", "float32", "bfloat16", "--json", sys.argv[2]])
"""


def test_the_generic_family_times_a_registry_op_added_at_run_time(tmp_path):
    """tests/third_op/add_into.py (x += y in place, returns z) appends its op to the registry; given bench_inputs,
    the bench lists it (with the default shape of its letters) and times it eagerly and through the graph, at a
    named shape of its own and the --dtypes its kernel takes. In a fresh process with the Python kernels."""
    out = tmp_path / "bench.json"
    env = dict(os.environ, ATTNRES_GE_KERNEL="python")
    third_op = Path(__file__).resolve().parent / "third_op"
    result = subprocess.run([sys.executable, "-c", GENERIC_OP_SCRIPT, str(third_op), str(out)], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    listed = [line.split() for line in result.stdout.splitlines() if line.startswith("op ")]
    assert listed == [["op", "add_into_T4096_H2048", "T=4096", "H=2048", "default", "add_into"]]
    assert "untimed    add_into: no family of its own and no bench_inputs" not in result.stdout
    assert "add_into_T8_H64 float32 (3 rounds)" in result.stdout
    assert "add_into_T8_H64 bfloat16" not in result.stdout  # the op takes float32 only
    results = json.loads(out.read_text())["results"]
    assert {(m["shape"], m["dtype"], m["provider"], m["direction"]) for m in results} == {
        ("add_into_T8_H64", "float32", provider, "forward") for provider in ("op-eager", "op-graph")}
    for m in results:
        assert m["path"] == "python" and m["traffic_bytes"] == 3 * 8 * 64 * 4 and m["median_ms"] > 0


TINY_READS = {"read_T8_N2_H64_S1": (8, 2, 64, 1), "read_T8_N2_H64_S3": (8, 2, 64, 3)}


@pytest.fixture
def tiny_reads(monkeypatch):
    """The read's named shapes, small enough for its float64 Python kernels in a test."""
    monkeypatch.setitem(registry.NAMED_SHAPES, "read", TINY_READS)


@pytest.fixture
def inkling2():
    return pytest.importorskip("transformers.models.inkling2.modeling_inkling2",
                               reason="transformers with Inkling2 (the `models` extra) is not installed")


def test_read_family_times_its_providers_and_judges_its_goals_from_the_measurements(
        tmp_path, never_disturbed, tiny_reads, inkling2, capsys):
    out = tmp_path / "bench.json"
    providers = ["op", "hf-eager", "fused", "unfused"]  # hf-inductor left out: its compile alone takes seconds
    assert bench.main(["--shapes", *TINY_READS, "--dtypes", "float32", "bfloat16", "--providers", *providers,
                       "--rounds", "3", "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    timed = {(m["shape"], m["dtype"], m["provider"]): m for m in written["results"]}
    one_query = [(name, dtype, p) for name in TINY_READS for dtype in ("float32", "bfloat16") for p in providers
                 if TINY_READS[name][3] == 1 or p in ("op", "hf-eager")]  # FLA's interface reads one query
    assert sorted(timed) == sorted(one_query)
    for (name, dtype, _), m in timed.items():
        tokens, blocks, hidden, queries = TINY_READS[name]
        size = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
        assert m["traffic_bytes"] == (blocks + 1 + queries) * tokens * hidden * size
        assert m["path"] == paths.kernel_path() and m["trusted"] and m["median_ms"] > 0
    rows = {(r["shape"], r["dtype"], r["provider"], r["against"]): r for r in written["read_goals"]}
    for (name, dtype, provider, against), row in rows.items():
        ours = timed[name, dtype, provider]
        expected = (ours["fraction_of_copy"] if against == report.COPY
                    else timed[name, dtype, against]["median_ms"] / ours["median_ms"])
        assert row["ratio"] == pytest.approx(expected)
        assert row["goal"] == (None if (provider, against) == ("fused", "unfused") and dtype == "float32"
                               else report.READ_GOALS[provider, against])
        assert row["met"] == (None if row["goal"] is None else row["ratio"] >= row["goal"])
    assert {key[2:] for key in rows} == {("op", "copy"), ("op", "hf-eager"), ("fused", "unfused")}
    assert len(rows) == 2 * 2 * 2 + 2  # op's two per shape and dtype; fused's at S=1
    printed = [line.split() for line in capsys.readouterr().out.splitlines()]
    table = [fields for fields in printed if len(fields) > 2 and fields[1] in TINY_READS]  # path, shape, ...
    assert len(table) == 4 and all(fields.count("timed") >= 1 for fields in table)  # hf-inductor: not timed


def test_read_goal_cells_show_ratios_verdicts_and_what_says_nothing():
    def measurement(provider, dtype, ms, fraction=0.5, disturbed=""):
        return harness.Measurement("read_T4096_N8_H2048_S1", dtype, provider, "forward", ms, 0.1, ms, 10**6, 1.0,
                                   2.0, fraction, 0.0, 3.0, 1, disturbed, "avx2")
    results = [measurement("op", "bfloat16", 2.0, fraction=0.9), measurement("hf-eager", "bfloat16", 30.0),
               measurement("hf-inductor", "bfloat16", 10.0, disturbed="spread 9 ms"),
               measurement("fused", "bfloat16", 1.0), measurement("unfused", "bfloat16", 1.1),
               measurement("fused", "float32", 1.0), measurement("unfused", "float32", 2.0),
               measurement("op", "float32", 1.0, fraction=0.7)]
    rows = report.read_goal_rows(results, {"read_T4096_N8_H2048_S1"})
    assert report.read_goal_rows(results, {"read_T4096_N8_H2048_S3"}) == []  # not a read shape of this run
    lines = report.read_goal_table(rows)
    cells = {line.split()[2]: [cell.strip() for cell in line[48:].split("  ") if cell.strip()] for line in lines[2:]}
    assert cells == {"bfloat16": ["90% met", "15.00x met", "disturbed", "1.10x NOT MET"],
                     "float32": ["70% NOT MET", "not timed", "not timed", "2.00x (no goal)"]}


def test_read_providers_compute_the_same_read(inkling2):
    """Each pair the read's goals compare computes one read, so the bench times one computation two ways."""
    from attnres_ge.bench.cases.read import ReadCase

    for queries in (1, 3):
        case = ReadCase((5, 3, 48, queries), torch.float32)
        ours, theirs = (case.provider(name)["forward"]() for name in ("op", "hf-eager"))
        torch.testing.assert_close(ours, torch.stack(theirs).reshape(ours.shape), rtol=1e-4, atol=1e-5)
    fused, unfused = (case.provider(name)["forward"]() for name in ("fused", "unfused"))
    torch.testing.assert_close(fused, unfused, rtol=1e-4, atol=1e-5)


def test_read_without_transformers_times_the_rest_and_says_what_is_missing(monkeypatch):
    from attnres_ge.bench.cases.read import ReadCase

    monkeypatch.setitem(sys.modules, "transformers.models.inkling2", None)  # its import now fails
    logged = []
    results = harness.measure_case(ReadCase((4, 1, 16, 1), torch.float32), "read_T4_N1_H16_S1", "float32",
                                   ["op", "hf-eager"], rounds=3, retries=0, log=logged.append)
    assert [m.provider for m in results] == ["op"]
    assert any(line.startswith("  hf-eager: unavailable (RuntimeError: needs transformers with Inkling2")
               for line in logged)


@pytest.mark.parametrize(("argv", "reads"), [([], list(TINY_READS)), (["--shapes", "read_T8_N2_H64_S3"],
                                                                        ["read_T8_N2_H64_S3"]),
                                             (["--shape", "4,1,16"], [])])
def test_read_shapes_are_named_shapes_of_their_own_family(argv, reads, tiny_reads):
    args = bench.build_parser().parse_args(argv)
    run.select_shapes(args)
    assert list(args.read_shapes) == reads


# The end-to-end run times a one-layer model (the quickest); the providers are compared on two layers, the second
# a full-attention layer (its 3-query read).
TINY_MODELS = {"inkling2_P0_T8_D64_L1_B1": (0, 8, 64, 1, 1), "inkling2_P8_T1_D64_L1_B1": (8, 1, 64, 1, 1)}


@pytest.fixture
def tiny_models(monkeypatch):
    """The Inkling2 model's named shapes, a prefill and a decode step small enough for a test."""
    monkeypatch.setitem(registry.NAMED_SHAPES, "inkling2-model", TINY_MODELS)


def test_model_family_times_stock_and_patched_and_reports_the_speedup_from_them(
        tmp_path, never_disturbed, tiny_models, inkling2, capsys):
    out = tmp_path / "bench.json"
    assert bench.main(["--shapes", *TINY_MODELS, "--providers", "stock", "patched", "--rounds", "2",
                       "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    timed = {(m["shape"], m["provider"]): m for m in written["results"]}
    assert sorted(timed) == sorted((name, p) for name in TINY_MODELS for p in ("stock", "patched"))
    for m in timed.values():
        assert m["dtype"] == "float32" and m["direction"] == "forward" and m["trusted"] and m["median_ms"] > 0
        assert m["path"] == paths.kernel_path() and m["traffic_bytes"] == timed[m["shape"], "stock"]["traffic_bytes"]
    rows = {row["shape"]: row for row in written["models"]}
    assert set(rows) == set(TINY_MODELS)
    for name, row in rows.items():
        stock, patched = timed[name, "stock"]["median_ms"], timed[name, "patched"]["median_ms"]
        assert (row["stock_ms"], row["patched_ms"]) == (stock, patched)
        assert row["speedup"] == pytest.approx(stock / patched)
    printed = capsys.readouterr().out.splitlines()
    table = [line.split() for line in printed if line.split()[1:2] and line.split()[1] in TINY_MODELS]
    assert [(fields[1], fields[-1]) for fields in table] == [(name, f"{rows[name]['speedup']:.2f}x")
                                                          for name in TINY_MODELS]


def test_model_providers_agree_and_every_decode_step_starts_from_the_prefill(inkling2):
    """stock and patched compute the same logits (float32 tolerance), so the bench times one model two ways; a
    cached step runs on a fresh copy of the prefilled cache each call, and refuses a call without one."""
    from attnres_ge.bench.cases.model import ModelCase

    for shape in ((0, 8, 64, 2, 1), (8, 1, 64, 2, 1)):
        case = ModelCase(shape)
        stock, patched = (case.provider(name)["forward"] for name in ("stock", "patched"))
        logits = []
        for call in (stock, patched, stock):
            getattr(call, "prepare", lambda: None)()
            logits.append(call())
        assert logits[0].shape == (1, shape[1], 1024)
        torch.testing.assert_close(logits[1], logits[0], rtol=1e-4, atol=1e-5)
        assert torch.equal(logits[2], logits[0])  # the same state each call: a decode step does not see the last
        if shape[0]:
            assert stock.prefilled.get_seq_length() == shape[0]
            with pytest.raises(RuntimeError, match="without prepare"):
                stock()


def test_model_without_transformers_reports_both_providers_unavailable(monkeypatch):
    from attnres_ge.bench.cases.model import ModelCase

    monkeypatch.setitem(sys.modules, "transformers.models.inkling2", None)  # its import now fails
    logged = []
    results = harness.measure_case(ModelCase((0, 4, 16, 1, 1)), "inkling2_P0_T4_D16_L1_B1", "float32",
                                   ["stock", "patched"], rounds=3, retries=0, log=logged.append)
    assert results == []
    assert [line.split(":")[0] for line in logged] == ["  stock", "  patched"]
    assert all("unavailable (RuntimeError: needs transformers with Inkling2" in line for line in logged)


def test_prepare_runs_before_every_call_and_outside_its_time(monkeypatch):
    """The harness runs a call's `prepare` before the call's paired copy, once per call, warm-up included."""
    events = []

    def call():
        events.append("call")

    call.prepare = lambda: events.append("prepare")
    harness.time_rounds({"stateful": call}, lambda: events.append("copy"), rounds=3, warmup=1)
    assert events == ["prepare", "copy", "call"] * 4
