#!/usr/bin/env bash
# Here (CPU machine): gather what dev/gpu-check.sh needs on a GPU machine that can fetch nothing,
# into .gpu/ (git-ignored, < 64 MiB): wheels of Quail and of sqlglot, the embedded model's config and tokenizer.
# Then: device run with carry [".gpu"] and command "bash dev/gpu-check.sh".
set -euo pipefail
. "$(dirname "$0")/env.sh"
rm -rf .gpu && mkdir -p .gpu/wheels .gpu/model
pip wheel --quiet --no-deps --wheel-dir .gpu/wheels packages/quail-core packages/quail-native
python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
    --dest .gpu/wheels "sqlglot==$(python -c 'import sqlglot; print(sqlglot.__version__)')"
model="$(python -c 'from quail_native.models.embedded import embedded_model_dir; print(embedded_model_dir())')"
cp "$model"/config.json "$model"/tokenizer.json "$model"/tokenizer_config.json .gpu/model/
du -sh .gpu
