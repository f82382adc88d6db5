#!/usr/bin/env bash
# The main job, from a fresh clone: sets up .venv and shows the installed backends on this machine.
set -euo pipefail
. "$(dirname "$0")/env.sh"
quail backends
