"""`precision="auto"`: the faster of fp32 and bf16 by a GEMM probe on a CPU, bf16 on CUDA, never a guess."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from quail_native import precision, precision_record
from quail_native.precision import choose_precision, gemm_rate
from quail_native.precision_record import RECORDS_ENVIRONMENT, ProbeRecord, recall, record_path, remember
from quail_native.precision_rule import BF16_MARGIN

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def rates(fp32: float, bf16: float):
    return lambda dtype: fp32 if dtype == torch.float32 else bf16


@pytest.mark.parametrize(("fp32", "bf16", "chosen"), [
    (160e9, 0.2e9, torch.float32),             # a CPU without bf16 units (this project's machine)
    (150e9, 320e9, torch.bfloat16),            # AVX-512 bf16 / AMX: about twice as fast
    (100e9, 100e9 * BF16_MARGIN, torch.bfloat16),
    (100e9, 100e9 * BF16_MARGIN * 0.99, torch.float32),  # a marginal gain is not worth bf16's rounding
])
def test_auto_on_a_cpu_takes_bf16_only_when_the_probe_measures_it_clearly_faster(fp32, bf16, chosen):
    choice = choose_precision("auto", CPU, 640, 2048, rate=rates(fp32, bf16))
    assert choice.dtype == chosen
    assert f"bf16 {bf16 / 1e9:.3g} vs fp32 {fp32 / 1e9:.3g} GFLOP/s" in choice.reason


def test_configured_precisions_and_cuda_need_no_probe():
    def never(dtype: torch.dtype) -> float:
        raise AssertionError("no probe expected")

    assert choose_precision("fp32", CPU, 64, 128, rate=never).dtype == torch.float32
    assert choose_precision("bf16", CPU, 64, 128, rate=never).dtype == torch.bfloat16
    assert choose_precision("auto", CUDA, 64, 128, rate=never).reason == "bf16 (auto on CUDA)"


def test_the_probe_measures_a_positive_rate_in_both_dtypes():
    assert gemm_rate(torch.float32, CPU, 64, 128) > 0 and gemm_rate(torch.bfloat16, CPU, 64, 128) > 0


class CountingProbe:
    """The probe's GEMM, faked: bf16 `speedup` × as fast as fp32, and every measurement counted."""

    def __init__(self, speedup: float = 2.0) -> None:
        self.calls = 0
        self.speedup = speedup

    def __call__(self, dtype: torch.dtype, device: torch.device, hidden: int, width: int) -> float:
        self.calls += 1
        return 150e9 * (self.speedup if dtype == torch.bfloat16 else 1.0)


@pytest.fixture
def fresh_cpu(monkeypatch, tmp_path) -> CountingProbe:
    """A records directory where no probe is remembered yet, and a probe that counts its measurements."""
    monkeypatch.setenv(RECORDS_ENVIRONMENT, str(tmp_path / "records"))
    probe = CountingProbe()
    monkeypatch.setattr(precision, "gemm_rate", probe)
    return probe


def another_process(monkeypatch) -> None:
    """What a new process starts with: no record read or written yet."""
    monkeypatch.setattr(precision_record, "_KNOWN", {})


def test_the_first_probe_on_a_cpu_is_remembered_and_later_processes_take_it_without_measuring(
        fresh_cpu, monkeypatch):
    first = choose_precision("auto", CPU, 640, 2048)
    assert (first.dtype, fresh_cpu.calls) == (torch.bfloat16, 2)
    path = record_path(640, 2048)
    assert f"remembered in {path}" in first.reason

    def never(*args: object) -> float:
        raise AssertionError("a remembered probe is not measured again")

    monkeypatch.setattr(precision, "gemm_rate", never)
    another_process(monkeypatch)
    again = choose_precision("auto", CPU, 640, 2048)
    assert again == first
    assert "measured bf16 300 vs fp32 150 GFLOP/s on " in again.reason
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name], "no temporary file is left beside it"
    assert path.stat().st_mode & 0o777 == 0o644, "other users of a shared Quail home can read it"


def test_a_process_keeps_its_choice_when_the_record_is_deleted_under_it(fresh_cpu, monkeypatch):
    """The answer store's identity was planned with it and the engine computes in it: they must not part."""
    first = choose_precision("auto", CPU, 640, 2048)
    record_path(640, 2048).unlink()
    monkeypatch.setattr(precision, "gemm_rate", CountingProbe(speedup=0.5))
    assert choose_precision("auto", CPU, 640, 2048) == first
    another_process(monkeypatch)
    assert choose_precision("auto", CPU, 640, 2048).dtype == torch.float32, "a new process measures again"


def test_when_two_processes_probe_at_once_the_record_written_first_holds_for_both(fresh_cpu):
    path = record_path(640, 2048)
    first = ProbeRecord(bf16_flops=300e9, fp32_flops=150e9, measured_on="2026-12-03")
    later = ProbeRecord(bf16_flops=100e9, fp32_flops=150e9, measured_on="2026-12-03")
    assert remember(path, first) == first
    assert remember(path, later) == first, "the later prober takes the record already written"
    assert recall(path) == first
    assert json.loads(path.read_text())["bf16_flops"] == 300e9


def test_another_cpu_or_model_shape_is_probed_anew(fresh_cpu, monkeypatch):
    choose_precision("auto", CPU, 640, 2048)
    choose_precision("auto", CPU, 64, 128)
    assert fresh_cpu.calls == 4
    monkeypatch.setattr(precision_record, "cpu_features", lambda: "model name : another CPU")
    choose_precision("auto", CPU, 640, 2048)
    assert fresh_cpu.calls == 6
    assert len(list(record_path(640, 2048).parent.glob("probe-*.json"))) == 3


def test_the_choice_follows_the_rule_applied_to_the_remembered_rates(fresh_cpu, monkeypatch):
    """Records keep rates, not decisions: a changed margin applies to probes already remembered."""
    choose_precision("auto", CPU, 640, 2048)
    another_process(monkeypatch)
    monkeypatch.setattr("quail_native.precision_rule.BF16_MARGIN", 2.5)
    assert choose_precision("auto", CPU, 640, 2048).dtype == torch.float32
    assert fresh_cpu.calls == 2


@pytest.mark.parametrize("content", ["{not json", json.dumps({"bf16_flops": -1, "fp32_flops": 1,
                                                                "measured_on": "2026-01-01"}),
                                     json.dumps({"bf16_flops": 1e9}), json.dumps([1, 2]), "\udcff",
                                     '{"bf16_flops": Infinity, "fp32_flops": 1e9, "measured_on": "2026-01-01"}',
                                     '{"bf16_flops": 1e9, "fp32_flops": NaN, "measured_on": "2026-01-01"}'])
def test_a_record_that_cannot_be_read_is_measured_again_and_replaced(fresh_cpu, content):
    path = record_path(640, 2048)
    path.parent.mkdir(parents=True)
    path.write_text(content, errors="surrogateescape")
    assert choose_precision("auto", CPU, 640, 2048).dtype == torch.bfloat16
    assert fresh_cpu.calls == 2
    assert json.loads(path.read_text())["bf16_flops"] == 300e9


def test_a_directory_that_cannot_be_written_costs_a_probe_not_the_choice(fresh_cpu, monkeypatch, tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(RECORDS_ENVIRONMENT, str(blocker / "records"))  # cannot be made under a file
    with caplog.at_level(logging.WARNING, logger="quail_native.precision_record"):
        assert choose_precision("auto", CPU, 640, 2048).dtype == torch.bfloat16
    assert "could not remember the precision probe" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_a_rate_given_decides_alone_and_is_remembered_nowhere(fresh_cpu):
    choice = choose_precision("auto", CPU, 640, 2048, rate=rates(150e9, 100e9))
    assert choice.dtype == torch.float32 and "remembered" not in choice.reason
    assert fresh_cpu.calls == 0 and not record_path(640, 2048).exists()
