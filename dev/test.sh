#!/usr/bin/env bash
# Every test, from a fresh clone: sets up .venv, installs the test-only plugin and tools, lints, tests.
set -euo pipefail
. "$(dirname "$0")/env.sh"
pip_quiet -r dev/requirements-test.txt -e tests/example_plugin
ruff check .
python -m pytest "$@"
