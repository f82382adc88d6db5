"""A session with another model in place of its own: what a query answering with a model its call names runs on.

An AI call may name its model (`endpoint => 'm'`, `AI_COMPLETE('m', …)`, an embedding call's model); its query runs
on the asking session's tables, token store, backend and compute provider with that model, its tokenizer and its
identity in the answer store — the coordinator runs it exactly as a query of a session opened on that model, and
the compute provider keeps each model's engine warm beside the others.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from quail.backends.base import ModelBackend, TokenizerSource
from quail.cache.token_ids import remembered
from quail.catalog.devices import DeviceSpec
from quail.catalog.models import ModelSpec
from quail.compute.base import ComputeProvider
from quail.config import EngineConfig
from quail.data.database import Database
from quail.data.tokenizer import Tokenizer
from quail.data.tokens import TokenStore
from quail.errors import Refusal, RefusalError
from quail.plugins.registry import ExtensionRegistry
from quail.runtime.coordinator import QuerySession


@dataclass(frozen=True)
class ModelFacet:
    """The owner session with `model` (and a config naming it) in place of its own model."""

    config: EngineConfig
    registry: ExtensionRegistry
    model: ModelSpec
    device: DeviceSpec
    backend: ModelBackend
    compute: ComputeProvider
    database: Database
    token_store: TokenStore
    tokenizer: Tokenizer
    owner: QuerySession

    def check_open(self) -> None:
        self.owner.check_open()

    def with_model(self, model: ModelSpec) -> QuerySession:
        return self.owner.with_model(model)


def model_facet(session: QuerySession, model: ModelSpec) -> ModelFacet:
    """`session` answering with `model`: refused when its backend cannot run that model on its device, or offers no
    tokenizer for it."""
    backend = session.backend
    verdict = backend.supports(model, session.device, session.config.gpus)
    if not verdict.accepted:
        raise RefusalError(Refusal(f"backend {backend.name!r} cannot run model {model.name!r} on device "
                                   f"{session.device.name!r}", (verdict.reason or "no reason given",)))
    if not isinstance(backend, TokenizerSource):
        raise RefusalError(Refusal(f"no tokenizer for model {model.name!r}",
                                   (f"backend {backend.name!r} offers none",)))
    config = replace(session.config, model=model.name)
    return ModelFacet(config, session.registry, model, session.device, backend, session.compute, session.database,
                      session.token_store, remembered(backend.tokenizer(model), backend, config), session)
