#!/usr/bin/env bash
# The main job, from a fresh clone: sets up .venv and runs the demo query on the embedded model.
set -euo pipefail
. "$(dirname "$0")/env.sh"
quail demo
