"""A tokenizer whose answers are remembered in the answer store, so a query answered from it parses none.

Stored answers are keyed by prompt token ids, so even a query whose every answer is stored needs the
ids of its texts, and a model's tokenizer file can take longer to parse (Gemma's 262k-entry vocabulary
and 515k merges: 1–2 s) than the rest of such a query. What a tokenizer made of a text is a function
of its identity (which covers everything that decides its ids) and the text, so it is stored under
exactly that and read back instead of asking the tokenizer; the tokenizer is asked (and parsed, the
first time) only for texts it has not seen. An unusable store costs a warning and the tokenizer's own
work, never an id.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from quail.backends.base import ModelBackend, ModelIdentitySource
from quail.cache.access import store_location, warn_unusable
from quail.cache.keys import KEY_BYTES, Key, TokenIds
from quail.cache.store import AnswerStore, StoreError
from quail.config import EngineConfig
from quail.data.tokenizer import Tokenizer

_PERSON = b"quail-tokens-1"
SHORT_TEXT = 256
"""Texts up to this many characters (prompt pieces, labels) and vocabulary look-ups are also kept in the
process: a query asks for the same few many times, and each store call opens the file."""
KEPT_IN_PROCESS = 4096
RETRY_AFTER_S = 60.0
"""A store that failed is left alone this long (a lock held by a long write would otherwise cost its busy
timeout on every call)."""


class RememberedTokenizer:
    """`tokenizer`, with what it encodes read from and written to the answer store at `path`. The store is
    opened for each call and closed after it, so the tokenizer holds no file open between queries and can
    be used from any thread."""

    def __init__(self, tokenizer: Tokenizer, path: Path, limit: int) -> None:
        self._tokenizer = tokenizer
        self._path = path
        self._limit = limit
        identity = tokenizer.identity.encode()
        self._start = hashlib.blake2b(digest_size=KEY_BYTES, person=_PERSON)
        self._start.update(len(identity).to_bytes(8, "little") + identity)
        self._kept: dict[Key, TokenIds] = {}
        self._failed_at: float | None = None

    @property
    def identity(self) -> str:
        return self._tokenizer.identity

    @property
    def bos_id(self) -> int | None:
        return self._tokenizer.bos_id

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        keys = [self._key("text", text) for text in texts]
        known = {key: self._kept[key] for key in keys if key in self._kept}
        if len(known) < len(set(keys)):
            with self._opened() as store:
                known.update(self._read(store, [key for key in keys if key not in known]))
                missing = [i for i, key in enumerate(keys) if key not in known]
                if missing:
                    computed = self._tokenizer.encode_batch([texts[i] for i in missing])
                    new = [(keys[i], tuple(ids)) for i, ids in zip(missing, computed, strict=True)]
                    known.update(new)
                    self._write(store, new)
        self._keep({key: known[key] for key, text in zip(keys, texts, strict=True) if len(text) <= SHORT_TEXT})
        return [list(known[key]) for key in keys]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids)

    def token_id(self, token: str) -> int | None:
        """Stored as a list of none or one id: a vocabulary without the entry is remembered too."""
        key = self._key("vocabulary entry", token)
        known = self._kept.get(key)
        if known is None:
            with self._opened() as store:
                known = self._read(store, [key]).get(key)
                if known is None:
                    found = self._tokenizer.token_id(token)
                    known = () if found is None else (found,)
                    self._write(store, [(key, known)])
            self._keep({key: known})
        return known[0] if known else None

    def _key(self, kind: str, text: str) -> Key:
        state = self._start.copy()
        state.update(kind.encode() + b"\0" + text.encode("utf-8", "surrogatepass"))
        return state.digest()

    def _keep(self, lists: dict[Key, TokenIds]) -> None:
        if len(self._kept) + len(lists) > KEPT_IN_PROCESS:
            self._kept.clear()
        self._kept.update(lists)

    @contextmanager
    def _opened(self) -> Iterator[AnswerStore | None]:
        """The store for one call (None while a failure is recent); a damaged value read in it is replaced when
        the call writes its ids again."""
        store = None
        if self._usable:
            try:
                store = AnswerStore.open(self._path, self._limit)
            except StoreError as error:
                self._drop(error)
        try:
            yield store
        finally:
            if store is not None:
                store.close()

    @property
    def _usable(self) -> bool:
        return self._failed_at is None or time.monotonic() - self._failed_at >= RETRY_AFTER_S

    def _read(self, store: AnswerStore | None, keys: list[Key]) -> dict[Key, TokenIds]:
        if store is None or not self._usable:
            return {}
        try:
            return store.token_lists(keys)
        except StoreError as error:
            self._drop(error)
            return {}

    def _write(self, store: AnswerStore | None, lists: list[tuple[Key, TokenIds]]) -> None:
        if store is None or not self._usable:
            return
        try:
            store.put_token_lists(lists)
        except StoreError as error:
            self._drop(error)

    def _drop(self, error: StoreError) -> None:
        """The store failed: one warning, then only the tokenizer's own work for RETRY_AFTER_S."""
        self._failed_at = time.monotonic()
        warn_unusable(error, computed="token ids", stacklevel=5)


def remembered(tokenizer: Tokenizer, backend: ModelBackend, config: EngineConfig) -> Tokenizer:
    """`tokenizer` remembering its ids in the store `config` names: for a backend that stores its answers
    there (it says what they depend on), itself otherwise or when the store is off."""
    location = store_location(config)
    if location is None or not isinstance(backend, ModelIdentitySource):
        return tokenizer
    return RememberedTokenizer(tokenizer, location, config.cache_limit)
