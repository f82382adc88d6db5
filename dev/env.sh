# Sourced by the dev scripts: creates .venv once and installs every Quail package into it.
# torch comes first and pinned to the CPU wheel this image carries; quail-native then finds it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
pip_quiet() { python -m pip install --quiet --disable-pip-version-check "$@" 2>&1 | grep -v "^WARNING: Location" || true; }
pip_quiet "torch==2.13.0"
pip_quiet -e "packages/quail-core[serve]" -e "packages/quail-native[embedded,qwen-coder-0-5b,bench,embeddings]" -e packages/quail-vllm -e packages/quail-sglang \
    -e packages/quail-ray
