"""Where a catalog model's Hugging Face directory already is on this machine — found, never made.

Backends that hand a directory to a serving engine (vLLM, SGLang) need the same directory the
native backend loads, without importing it: a local `source` directory, Quail's cache of converted
embedded models, or the Hugging Face hub cache. Nothing is downloaded or converted here.
"""

from __future__ import annotations

import os
from pathlib import Path

from quail.catalog.models import ModelSpec
from quail.catalog.packaged import EMBEDDING_SOURCES, embedding_model_dir
from quail.errors import Refusal, RefusalError

EMBEDDED_PREFIX = "pypi:"


def quail_cache_home() -> Path:
    """`$QUAIL_HOME`, else the user cache directory (`~/.cache/quail`): where converted models live."""
    configured = os.environ.get("QUAIL_HOME", "").strip()
    if configured:
        return Path(configured).expanduser()
    try:
        import platformdirs
    except ImportError:
        return Path.home() / ".cache" / "quail"
    return Path(platformdirs.user_cache_dir("quail", appauthor=False))


def hub_cache() -> Path:
    home = os.environ.get("HF_HOME")
    return Path(home) / "hub" if home else Path.home() / ".cache" / "huggingface" / "hub"


def local_model_directory(spec: ModelSpec) -> Path:
    """A directory with config.json and weights for `spec`, or a Refusal saying how to get one. An embedding model's
    is its installed package's folder, checked against its pinned digests (`quail.catalog.packaged`)."""
    if spec.kind == "embedding" and spec.name in EMBEDDING_SOURCES:
        return embedding_model_dir(spec.name)
    for candidate in _candidates(spec):
        if (candidate / "config.json").is_file():
            return candidate
    if spec.source.startswith(EMBEDDED_PREFIX):
        hints = ("convert it once with the native backend's package: pip install 'quail-native[embedded]' && "
                 "python -c 'from quail_native.models.embedded import embedded_model_dir; embedded_model_dir()'",)
    else:
        hints = ("download the checkpoint beforehand (Quail never downloads at run time) and register "
                 "ModelSpec(..., source='/path/to/model_dir')",)
    raise RefusalError(Refusal(
        f"the weights of model {spec.name!r} are not on this machine as a Hugging Face directory",
        (f"looked in {', '.join(str(c) for c in _candidates(spec)) or 'no candidate place'}",), hints=hints,
    ))


def _candidates(spec: ModelSpec) -> list[Path]:
    if spec.source.startswith(EMBEDDED_PREFIX):
        return [quail_cache_home() / "models" / spec.name]
    path = Path(spec.source).expanduser()
    if spec.source.startswith(("/", ".", "~")) or path.is_dir():
        return [path]
    snapshots = hub_cache() / f"models--{spec.source.replace('/', '--')}" / "snapshots"
    return sorted(snapshots.iterdir(), reverse=True) if snapshots.is_dir() else []
