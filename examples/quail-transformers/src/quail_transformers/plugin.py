"""The entry point Quail loads (group `quail`): it registers the backend; torch loads only when it boots."""

from quail.extend import Registrar, hookimpl
from quail_transformers.backend import TransformersBackend


@hookimpl
def quail_register(registry: Registrar) -> None:
    registry.register_backend(TransformersBackend())
