"""`quail bench` end to end at the tiny scale: every workload runs, outputs are written, ratios printed."""

from __future__ import annotations

import json

import pytest

import quail
from quail.cli import main
from quail_native.benchmark.steal import read_cpu_times

pytestmark = pytest.mark.slow


def test_bench_writes_report_results_and_chart_and_prints_the_ratio_lines_last(tmp_path, capsys):
    arguments = ["bench", "--model", "gemma-3-270m", "--scale", "tiny", "--out", str(tmp_path), "--backends",
                 "native,nope", "--repeats", "2",
                 "--precision", "fp32"]
    assert main(arguments) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert sum(" run 2/2: " in line for line in out) == 10, "every workload timed twice"
    assert any(line.startswith("reviews: 2 filters → join: native") and "× naive" in line for line in out)
    assert out[-5].startswith("ratio native/naive wall:")
    assert out[-4].startswith("ratio fresh/minimum tokens:")
    assert out[-3].startswith("ratio SoL/measured wall:")
    assert any(line.startswith("note: nope: skipped") for line in out)
    if read_cpu_times() is not None:  # Linux: the host's share of the timed runs
        assert any(line.startswith("note: host steal during the timed runs: ") for line in out)
    [cache] = [line for line in out if line.startswith("note: ratio warm/cold wall (answer cache, reviews: 1 filter")]
    assert cache.endswith(" → 0"), "the warm run reads every answer from the store"
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["gemm_peak_flops"] > 0
    assert len(results["rows"]) == 10 and all(r["backend"] == "native" for r in results["rows"])
    assert all(r["repeats"] == 2 and r["spread"] >= 0 for r in results["rows"])
    assert all(r["agreement"] >= 0.95 for r in results["rows"])
    assert all(0 < r["sol_s"] <= r["wall_s"] for r in results["rows"]), "the limit is below what was measured"
    assert (tmp_path / "chart.png").read_bytes()[:4] == b"\x89PNG"
    assert "| workload | backend |" in (tmp_path / "report.md").read_text()


def test_bench_runs_ray_beside_local_and_prints_the_ratio_with_each_shards_time(tmp_path, capsys):
    argv = ["bench", "--model", "gemma-3-270m", "--scale", "tiny", "--out", str(tmp_path), "--workloads",
            "2 filters,classification", "--compute", "ray", "--workers", "2"]
    try:
        assert main(argv) == 0
    finally:
        quail.release_engines()  # the bench started a local Ray cluster: stop it and its workers
    out = capsys.readouterr().out
    assert "ratio ray/local wall (native): " in out
    assert "reviews: classification on ray: shard walls " in out
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert sorted((r["workload"], r["compute"]) for r in rows) == sorted(
        (w, c) for w in ("reviews: 2 filters", "reviews: 2 filters → join", "reviews: classification")
        for c in ("local", "ray"))
    assert all(len(r["shard_walls"]) == 2 for r in rows if r["compute"] == "ray")
    assert all(r["agreement"] >= 0.95 for r in rows)
    assert "| reviews: classification | native on ray |" in (tmp_path / "report.md").read_text()


def test_speed_of_light_is_the_minimum_tokens_share_of_the_flops_at_the_measured_peak():
    from quail_native.benchmark.command import speed_of_light

    assert speed_of_light(4e9, fresh=200, minimum=100, peak=1e9) == pytest.approx(2.0)  # half the work was repeated
    assert speed_of_light(4e9, fresh=100, minimum=100, peak=2e9) == pytest.approx(2.0)
    assert speed_of_light(4e9, fresh=90, minimum=100, peak=1e9) == pytest.approx(4.0), "never above the work done"
    assert speed_of_light(None, fresh=100, minimum=100, peak=1e9) is None
    assert speed_of_light(4e9, fresh=0, minimum=0, peak=1e9) is None


@pytest.mark.parametrize(("probe", "winner"), [({"bf16": 300e9, "fp32": 150e9}, "bf16"),
                                               ({"bf16": 0.2e9, "fp32": 150e9}, "fp32"),
                                               ({"bf16": 160e9, "fp32": 150e9}, "fp32")])
def test_the_peak_is_the_best_of_squares_and_model_projections_in_the_dtype_auto_computes_in(
        monkeypatch, tmp_path, probe, winner):
    """The model's projections can outrun square GEMMs (the ceiling must not sit below what the model
    reaches); squares and projections are measured only in the dtype the engine's `auto` picks: never a
    model-sized bf16 GEMM on a CPU that multiplies bf16 at 0.2 GFLOP/s, and never a ceiling named after one
    dtype while the engine computes in the other (bf16 a little faster than fp32 is not worth its rounding)."""
    import torch

    from quail_native import precision
    from quail_native.benchmark import command
    from quail_native.precision_record import RECORDS_ENVIRONMENT

    names = {torch.bfloat16: "bf16", torch.float32: "fp32"}
    measured: list[tuple[str, int, int]] = []
    squared: list[str] = []
    monkeypatch.setenv(RECORDS_ENVIRONMENT, str(tmp_path))  # a CPU whose probe nothing remembers yet
    monkeypatch.setattr(precision, "gemm_rate", lambda dtype, device, hidden, width: probe[names[dtype]])

    def gemm_peak(device, dtype, sizes, repeats=8):
        squared.append(names[dtype])
        return 100e9

    def projection_rate(dtype, device, rows, inputs, outputs, repeats):
        measured.append((names[dtype], rows, inputs, outputs))
        return 150e9 if (inputs, outputs) == (640, 4096) else 50e9

    monkeypatch.setattr(command, "gemm_peak", gemm_peak)
    monkeypatch.setattr(command, "projection_rate", projection_rate)
    peak, name = command.device_peak(torch.device("cpu"), hidden=640, ffn=2048, rows=512)
    assert name == winner
    assert peak == 150e9
    assert squared == [winner]
    assert measured == [(winner, 512, 640, 4096), (winner, 512, 2048, 640)]  # a full pass of the run's rows


def test_quality_reports_each_model_with_and_without_examples_and_its_peak_memory(tmp_path, capsys):
    """`quail bench --quality` on the real Gemma 3 270M over 12 labeled reviews: every question with and without
    demonstrations, scored against the labels; the child process's peak memory is reported."""
    assert main(["bench", "--quality", "--models", "gemma-3-270m", "--reviews", "12", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| gemma-3-270m | Is this movie review positive? (mixed reviews left out) | 0 |" in out
    assert "| gemma-3-270m | Does the review discuss the ending? | 4 |" in out
    [run] = json.loads((tmp_path / "quality.json").read_text())
    assert run["model"] == "gemma-3-270m" and run["peak_rss_bytes"] > 100 << 20
    assert len(run["scores"]) == 9 and {s["examples"] for s in run["scores"]} == {0, 4}
    [join] = [s for s in run["scores"] if s["question"].startswith("Does the review speak well of the <aspect>?")]
    assert join["documents"] == 12 * 12 and join["examples"] == 0
    assert all(0.0 <= s["auc"] <= 1.0 and 0.0 <= s["raw_accuracy"] <= 1.0 for s in run["scores"])
    assert (tmp_path / "quality.md").read_text().startswith("Answer quality on the first 12")


def test_limits_runs_each_limit_query_early_and_whole_with_the_same_rows_and_fewer_tokens(tmp_path, capsys):
    from quail_native.benchmark.limits import RUBRIC, many_reviews, review_sentences, run_limits

    assert len(set(many_reviews(1000).column("body").to_pylist())) == 1000, "every document a text of its own"
    assert len(set(review_sentences(1000).column("body").to_pylist())) == 1000
    assert run_limits("gemma-3-270m", "fp32", tmp_path, documents=160, join_reviews=24) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "LIMIT 5 filter over 160 reviews", "LIMIT 10 join, 24 reviews × 12 aspects",
        "self-join with an inequality, 12 reviews of 6 movies",
        f"a {len(RUBRIC.split())}-word rubric AI.SCORE over 160 one-sentence reviews"]
    for line in lines:
        counts = line.split("fresh tokens ")[1].split(" with ")[0]
        early, whole = (int(n.replace(",", "")) for n in counts.split(" vs "))
        assert early < whole and "same" in line
        ratio = float(line.split("fresh / minimum tokens ")[1].split()[0])
        assert ratio <= 1.05 if "rubric" in line else 0.95 <= ratio <= 1.5, line
    assert sum("stopped after" in line for line in lines) == 2
    assert (tmp_path / "limits.md").read_text().count("\n* ") == 4


def test_generation_bench_measures_decoding_against_its_limit_and_extraction_beside_a_naive_loop(tmp_path, capsys):
    from quail_native.benchmark.generation import run_generation

    assert run_generation("gemma-3-270m", "fp32", tmp_path, ("native",), documents=4, tokens=8) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(",")[0] for line in lines] == ["decode", "decode", "aggregate", "extract"]
    single = float(lines[0].split("measured / limit ")[1].split()[0])
    assert 0.0 < single < 1.5, "a rate beside the weight-bandwidth limit measured in the same run"
    assert float(lines[1].split("(")[1].split("×")[0]) > 1.0, "four sequences decode faster than one"
    assert "naive transformers loop" in lines[3] and "× slower" in lines[3]
    assert (tmp_path / "generation.md").read_text().count("\n* ") == 4


def test_blocking_bench_asks_fewer_pairs_and_measures_the_recall_of_the_unblocked_answer(tmp_path, capsys):
    from quail_native.benchmark.blocking import run_blocking

    assert run_blocking("gemma-3-270m", "fp32", tmp_path, left=40, right=20, only=["review sentences"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("reviews × review sentences (800 pairs, k 2): model calls 800 → 80 + 32 sampled")
    (result,) = json.loads((tmp_path / "blocking.json").read_text())
    assert result["blocked"]["calls"] == 80 and result["unblocked"]["calls"] == 800
    assert result["recall"] is None or 0.0 <= result["recall"] <= 1.0
    assert (tmp_path / "blocking.md").read_text().count("\n* ") == 1
