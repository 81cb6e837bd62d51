"""`attnres-ge bench` runs end to end, writes its JSON and plot, and never reports disturbed rounds as results."""

from __future__ import annotations

import argparse
import json

import pytest

from attnres_ge import bench
from attnres_ge.cli import build_parser

SMALL = ["--shape", "8,2,64", "--dtypes", "float32", "--rounds", "3", "--overhead-rounds", "5"]


@pytest.fixture
def never_disturbed(monkeypatch):
    """This shared host's noise must not decide a test: no copy rate or spread counts as disturbed."""
    monkeypatch.setattr(bench, "DISTURBED_COPY_FRACTION", 0.0)
    monkeypatch.setattr(bench, "DISTURBED_SPREAD_TO_MEDIAN", float("inf"))


def test_bench_writes_every_measurement(tmp_path, never_disturbed, capsys):
    out = tmp_path / "bench.json"
    providers = ["op-eager", "op-graph", "kernel", "torch-eager"]
    status = bench.main(["--shapes", "T16_N8_H4096", "--dtypes", "float32", "--providers", *providers,
                         "--rounds", "3", "--overhead-rounds", "21", "--json", str(out)])
    assert status == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "kernels: " in header and "kernel threads" in header
    report = json.loads(out.read_text())
    keys = {(m["provider"], m["direction"]) for m in report["results"]}
    assert keys == {(p, d) for p in providers for d in ("forward", "backward")}
    for m in report["results"]:
        assert m["median_ms"] > 0 and m["copy_gbps"] > 0 and m["page_faults_per_call"] >= 0
        assert m["trusted"] and m["attempts"] == 1 and m["quiet_copy_gbps"] > 0
    assert any(r["provider"] == "op-graph" and r["against"] == "torch-eager" for r in report["speedups"])
    assert {(r["provider"], r["direction"]) for r in report["overheads"]} == {
        (p, d) for p in ("op-eager", "op-graph", bench.COMPILED_EAGER) for d in ("forward", "backward")}
    assert report["machine"]["kernels"] in ("native", "python")
    assert report["machine"]["kernels"] and report["machine"]["kernel_threads"] >= 1
    compiled = [r for r in report["overheads"] if r["provider"] == bench.COMPILED_EAGER]
    assert all(r["overhead_us"] > 0 for r in compiled)  # a compiled call costs more than the kernel alone


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
    monkeypatch.setattr(bench, "quiet_copy_gbps", lambda copy, copy_bytes: 1e6)  # a quiet copy no pair can match
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
    assert bench.disturbance(quiet, copy_gbps=40.0, quiet_gbps=50.0) == ""
    assert "under 50% of the quiet copy's 100.0 GB/s" in bench.disturbance(quiet, 40.0, 100.0)
    noisy = [1e-3, 1e-3, 1e-3, 1e-3, 9e-3, 9e-3, 9e-3, 9e-3]  # interquartile range above the median
    assert bench.disturbance(noisy, 40.0, 50.0).startswith("spread")


def test_bench_plot_writes_a_png(tmp_path):
    measurements = [
        bench.Measurement("T16_N8_H4096", "float32", provider, direction, ms, 0.1, 0.9 * ms, 10**6, 1.0, 2.0, 0.5,
                          0.0, 3.0, 1, "" if provider != "op-graph" else "paired copy too slow")
        for provider, ms in (("kernel", 1.0), ("op-graph", 1.2), ("torch-eager", 9.0), ("torch-inductor", 3.0))
        for direction in ("forward", "backward")
    ]
    out = tmp_path / "bench.png"
    assert bench.plot(measurements, str(out))
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
