"""Which model computed an answer: a hash of the backend, its files' contents and its numeric settings.

Two tiny random checkpoints registered under the same name, or one checkpoint run in fp32 and in
bf16, get different identities, so one never reads the other's answers. A backend that cannot say
what its readouts depend on (no `model_identity`, or None) gets no identity and no store.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from quail.backends.base import ModelBackend, ModelIdentity, ModelIdentitySource
from quail.cache.store import AnswerStore
from quail.catalog.devices import DeviceSpec
from quail.catalog.models import ModelSpec
from quail.config import EngineConfig


@dataclass(frozen=True)
class ResolvedIdentity:
    """A model identity as stored: its hash, and a line saying what it is for `quail cache stats`."""

    digest: str
    description: str


def named_identity(backend: ModelBackend, model: ModelSpec, device: DeviceSpec,
                   config: EngineConfig) -> ModelIdentity | None:
    """What `backend` says its readouts for `model` on `device` under `config` depend on; None when it cannot say."""
    if not isinstance(backend, ModelIdentitySource):
        return None
    return backend.model_identity(model, device, config)


def resolved(backend: ModelBackend, model: ModelSpec, identity: ModelIdentity, store: AnswerStore) -> ResolvedIdentity:
    return ResolvedIdentity(digest(backend.name, identity, store), describe(backend.name, model, identity))


def digest(backend: str, identity: ModelIdentity, store: AnswerStore) -> str:
    """SHA-256 over the backend's name, every setting, and every file's name and content digest."""
    state = hashlib.sha256(f"backend={backend}\n".encode())
    for name, value in sorted(identity.settings):
        state.update(f"setting {name}={value}\n".encode())
    for path in sorted(identity.files, key=lambda p: p.name):
        state.update(f"file {path.name}={store.file_digest(path)}\n".encode())
    return state.hexdigest()


def describe(backend: str, model: ModelSpec, identity: ModelIdentity) -> str:
    settings = ", ".join(f"{name} {value}" for name, value in sorted(identity.settings))
    return f"{model.name} on {backend} ({settings})" if settings else f"{model.name} on {backend}"
