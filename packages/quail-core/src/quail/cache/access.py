"""A store as a query uses it: opened for one model, degrading to "nothing stored" when it fails.

A query never fails, and never answers differently, because of its answer store: a store that
cannot be opened, read or written (corrupt, locked by another writer past the busy timeout,
unwritable) is dropped for the rest of the query with one `AnswerStoreWarning`, and everything it
would have answered is computed.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

from quail.backends.base import ModelBackend
from quail.cache.identity import ResolvedIdentity, named_identity, resolved
from quail.cache.keys import Key, Keys
from quail.cache.store import Answer, AnswerStore, NotAnAnswerStore, Readout, StoreError, is_locked
from quail.catalog.devices import DeviceSpec
from quail.catalog.locations import quail_cache_home
from quail.catalog.models import ModelSpec
from quail.config import EngineConfig

STORE_ENVIRONMENT = "QUAIL_ANSWER_STORE"
"""Where `cache="auto"` keeps the store when set (tests, or answers on another volume than models)."""
STORE_NAME = "answers.sqlite"


class AnswerStoreWarning(UserWarning):
    """The answer store was unusable; answers were computed instead."""


def store_location(config: EngineConfig) -> Path | None:
    """The store file `config.cache` names: None for `off`; `auto` is $QUAIL_ANSWER_STORE or $QUAIL_HOME's."""
    setting = config.cache.strip()
    if setting == "off":
        return None
    if setting in ("auto", "on"):
        configured = os.environ.get(STORE_ENVIRONMENT, "").strip()
        return Path(configured).expanduser() if configured else quail_cache_home() / STORE_NAME
    return Path(setting).expanduser()


class StoredAnswerAccess:
    """One model's answers in one store, for one query; every failure ends the store's part, never the query's."""

    def __init__(self, store: AnswerStore | None, identity: ResolvedIdentity | None) -> None:
        self._store = store if identity is not None else None
        self.identity = identity
        self.keys = Keys(identity.digest if identity is not None else "")

    @classmethod
    def open(cls, backend: ModelBackend, model: ModelSpec, device: DeviceSpec,
             config: EngineConfig) -> StoredAnswerAccess:
        """The store `config` names for what `backend` computes; an inactive one when off or unusable."""
        path = store_location(config)
        named = named_identity(backend, model, device, config) if path is not None else None
        if path is None or named is None:
            return cls(None, None)
        try:
            store = AnswerStore.open(path, config.cache_limit)
        except StoreError as error:
            warn_unusable(error)
            return cls(None, None)
        try:
            return cls(store, resolved(backend, model, named, store))
        except (StoreError, OSError) as error:
            store.close()
            warn_unusable(error)
            return cls(None, None)

    @property
    def active(self) -> bool:
        return self._store is not None

    def get(self, keys: Iterable[Key]) -> dict[Key, Readout]:
        if self._store is None:
            return {}
        damaged = self._store.damaged
        try:
            found = self._store.get(keys)
        except StoreError as error:
            self._drop(error)
            return {}
        if self._store.damaged > damaged:
            failed = self._store.damaged - damaged
            warn_unusable(StoreError(f"{failed} stored answers in {self._store.path} failed their checksum"))
        return found

    def put(self, answers: Sequence[Answer]) -> None:
        if self._store is None or self.identity is None or not answers:
            return
        try:
            self._store.put(self.identity.digest, self.identity.description, answers)
        except StoreError as error:
            self._drop(error)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    def _drop(self, error: StoreError) -> None:
        warn_unusable(error)
        store, self._store = self._store, None
        if store is not None:
            store.close()


def warn_unusable(error: Exception, computed: str = "answers", stacklevel: int = 3) -> None:
    """One warning that the store is dropped (for this query, or a while for a tokenizer) and why; `stacklevel`
    points it at the caller's caller outside the store's code."""
    warnings.warn(f"{error}; {computed} are computed instead of read or stored{_remedy(error)}", AnswerStoreWarning,
                  stacklevel=stacklevel)


def _remedy(error: Exception) -> str:
    """Advice only where it cannot destroy anything: never `clear` for another writer's lock or a foreign file."""
    if isinstance(error, NotAnAnswerStore):
        return " (set EngineConfig.cache or $QUAIL_ANSWER_STORE to a path of its own)"
    if is_locked(error):
        return " (another Quail process was writing to it; later queries use it again)"
    return " (`quail cache clear` starts a fresh store)"
