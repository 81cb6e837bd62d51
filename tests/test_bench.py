"""`attnres-ge bench` runs end to end on the decode-like shape and writes its JSON."""

from __future__ import annotations

import json

from attnres_ge import bench


def test_bench_writes_every_measurement(tmp_path):
    out = tmp_path / "bench.json"
    providers = ["op-eager", "op-graph", "kernel", "torch-eager"]
    status = bench.main(["--shapes", "T16_N8_H4096", "--dtypes", "float32", "--providers", *providers,
                         "--rounds", "3", "--json", str(out)])
    assert status == 0
    report = json.loads(out.read_text())
    keys = {(m["provider"], m["direction"]) for m in report["results"]}
    assert keys == {(p, d) for p in providers for d in ("forward", "backward")}
    for m in report["results"]:
        assert m["median_ms"] > 0 and m["copy_gbps"] > 0 and m["page_faults_per_call"] >= 0
    assert any(r["provider"] == "op-graph" and r["against"] == "torch-eager" for r in report["speedups"])
    assert {(r["provider"], r["direction"]) for r in report["overheads"]} == {
        (p, d) for p in ("op-eager", "op-graph", bench.COMPILED_EAGER) for d in ("forward", "backward")}
    assert report["machine"]["kernels"] in ("native", "python")
    compiled = [r for r in report["overheads"] if r["provider"] == bench.COMPILED_EAGER]
    assert all(r["overhead_us"] > 0 for r in compiled)  # a compiled call costs more than the kernel alone


def test_bench_plot_writes_a_png(tmp_path):
    measurement = bench.Measurement("T16_N8_H4096", "float32", "kernel", "forward", 1.0, 0.1, 0.9, 10**6, 1.0, 2.0,
                                    0.5, 0.0)
    out = tmp_path / "bench.png"
    assert bench.plot([measurement, bench.Measurement(**{**measurement.__dict__, "direction": "backward"})], str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
