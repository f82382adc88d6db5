"""`quail bench` end to end at the tiny scale: every workload runs, outputs are written, ratios printed."""

from __future__ import annotations

import json

import pytest

from quail.cli import main

pytestmark = pytest.mark.slow


def test_bench_writes_report_results_and_chart_and_prints_the_ratio_lines_last(tmp_path, capsys):
    arguments = ["bench", "--scale", "tiny", "--out", str(tmp_path), "--backends", "native,nope", "--repeats", "2",
                 "--precision", "fp32"]
    assert main(arguments) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert sum(" run 2/2: " in line for line in out) == 10, "every workload timed twice"
    assert any(line.startswith("reviews: 2 filters → join: native") and "× naive" in line for line in out)
    assert out[-5].startswith("ratio native/naive wall:")
    assert out[-4].startswith("ratio fresh/minimum tokens:")
    assert out[-3].startswith("ratio SoL/measured wall:")
    assert any(line.startswith("note: nope: skipped") for line in out)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["gemm_peak_flops"] > 0
    assert len(results["rows"]) == 10 and all(r["backend"] == "native" for r in results["rows"])
    assert all(r["repeats"] == 2 and r["spread"] >= 0 for r in results["rows"])
    assert all(r["agreement"] >= 0.95 for r in results["rows"])
    assert (tmp_path / "chart.png").read_bytes()[:4] == b"\x89PNG"
    assert "| workload | backend |" in (tmp_path / "report.md").read_text()
