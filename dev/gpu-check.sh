#!/usr/bin/env bash
# On a machine with one CUDA GPU (prepared by dev/gpu-prepare.sh): the native executor's exactness tests on
# CUDA, then the benchmark's two-filter + join and trace workloads beside the naive baseline on the GPU.
# The embedded weights (250 MB) cannot travel, so the benchmark runs random weights of exactly the embedded
# model's shape: speed depends on the shape only, and agreement is checked against the same weights.
# Numbers land in $OUT (default gpu-out/): exactness.log, bench.log, bench/report.md, bench/results.json.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .gpu/wheels/*.whl
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
device="$(python3 -c 'import torch; n = torch.cuda.get_device_name(0).lower(); print("h200" if "h200" in n else "h100-sxm" if "h100" in n else "a100-80gb" if "a100" in n else "l40s")')"
echo "device: $device" | tee -a "$OUT/gpu.txt"

timeout 240 env QUAIL_TEST_DEVICE="$device" python3 -m pytest -q -p no:cacheprovider \
    packages/quail-native/tests/test_exactness.py packages/quail-native/tests/test_arena.py 2>&1 | tee "$OUT/exactness.log" | tail -25

python3 - <<'PY'
import torch
from transformers import AutoConfig, AutoModelForCausalLM
config = AutoConfig.from_pretrained(".gpu/model")
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
model.save_pretrained("/tmp/gemma-shaped")
PY
cp .gpu/model/tokenizer.json .gpu/model/tokenizer_config.json /tmp/gemma-shaped/

timeout 300 python3 -c 'import sys; from quail.cli import main; sys.exit(main(sys.argv[1:]))' bench --scale xlarge \
    --device "$device" --model-dir /tmp/gemma-shaped --chunk-tokens 8192 \
    --workloads "2 filters → join,traces" --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log" | tail -12
