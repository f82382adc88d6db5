"""`precision="auto"`: the faster of fp32 and bf16 by a GEMM probe on a CPU, bf16 on CUDA, never a guess."""

from __future__ import annotations

import pytest
import torch

from quail_native.precision import BF16_MARGIN, choose_precision, gemm_rate

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
