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
from quail.cache.keys import KEY_BYTES, Key
from quail.cache.store import AnswerStore, StoreError
from quail.config import EngineConfig
from quail.data.tokenizer import TokenIds, Tokenizer

_PERSON = b"quail-tokens-1"
KEPT_IN_PROCESS = 4096
"""Texts asked for one at a time (prompt pieces, labels) and vocabulary look-ups also kept in the process, at
most this many: a query asks for the same few many times, and each store call opens the file. Documents
come in batches and are not kept. A kept text served is read from the store again (which marks it used) the
next time the store is opened, so the store's eviction does not take the texts a process uses most for
unused ones."""
RETRY_AFTER_S = 60.0
"""A store that failed to open or read is left alone this long; one that failed a write (locked, read-only)
is still read, and written to again after this long."""


class RememberedTokenizer:
    """`tokenizer`, with what it encodes read from and written to the answer store at `path`. The store is
    opened for each call that is not answered from the process's own few kept texts, and closed after it,
    so the tokenizer holds no file open between queries and can be used from any thread."""

    def __init__(self, tokenizer: Tokenizer, path: Path, limit: int) -> None:
        self._tokenizer = tokenizer
        self._path = path
        self._limit = limit
        identity = tokenizer.identity.encode()
        self._start = hashlib.blake2b(digest_size=KEY_BYTES, person=_PERSON)
        self._start.update(len(identity).to_bytes(8, "little") + identity)
        self._kept: dict[Key, TokenIds] = {}
        self._served: set[Key] = set()  # kept texts served since the store last saw them
        self._failed_at: float | None = None
        self._write_failed_at: float | None = None

    @property
    def identity(self) -> str:
        return self._tokenizer.identity

    @property
    def bos_id(self) -> int | None:
        return self._tokenizer.bos_id

    def encode(self, text: str) -> list[int]:
        key = self._key("text", text)
        known = self._kept.get(key)
        if known is None:
            known = self._lists([key], [text])[key]
            self._keep(key, known)
        else:
            self._served.add(key)
        return list(known)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        keys = [self._key("text", text) for text in texts]
        known = self._lists(keys, texts)
        return [list(known[key]) for key in keys]

    def _lists(self, keys: list[Key], texts: Sequence[str]) -> dict[Key, TokenIds]:
        """The ids of `texts` (keyed `keys`): stored ones read, the rest from the tokenizer, then stored."""
        with self._opened() as store:
            known = self._read(store, keys)
            missing = [i for i, key in enumerate(keys) if key not in known]
            if missing:
                computed = self._tokenizer.encode_batch([texts[i] for i in missing])
                new = [(keys[i], tuple(ids)) for i, ids in zip(missing, computed, strict=True)]
                known.update(new)
                self._write(store, new)
        return known

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
            self._keep(key, known)
        else:
            self._served.add(key)
        return known[0] if known else None

    def _key(self, kind: str, text: str) -> Key:
        state = self._start.copy()
        state.update(kind.encode() + b"\0" + text.encode("utf-8", "surrogatepass"))
        return state.digest()

    def _keep(self, key: Key, ids: TokenIds) -> None:
        if len(self._kept) >= KEPT_IN_PROCESS:
            self._kept.clear()
        self._kept[key] = ids

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
        return _long_ago(self._failed_at)

    def _read(self, store: AnswerStore | None, keys: list[Key]) -> dict[Key, TokenIds]:
        """The stored ids among `keys`; the kept texts served since the last read are read along (and so marked
        used) but not returned."""
        if store is None or not self._usable:
            return {}
        served, self._served = self._served, set()
        try:
            found = store.token_lists([*keys, *served])
        except StoreError as error:
            self._drop(error)
            return {}
        return {key: found[key] for key in keys if key in found}

    def _write(self, store: AnswerStore | None, lists: list[tuple[Key, TokenIds]]) -> None:
        if store is None or not self._usable or not _long_ago(self._write_failed_at):
            return
        try:
            store.put_token_lists(lists)
        except StoreError as error:
            self._write_failed_at = time.monotonic()
            warn_unusable(error, computed="new token ids", stacklevel=4)

    def _drop(self, error: StoreError) -> None:
        """The store failed to open or read: one warning, then only the tokenizer's own work for RETRY_AFTER_S."""
        self._failed_at = time.monotonic()
        warn_unusable(error, computed="token ids", stacklevel=4)


def _long_ago(failed_at: float | None) -> bool:
    return failed_at is None or time.monotonic() - failed_at >= RETRY_AFTER_S


def remembered(tokenizer: Tokenizer, backend: ModelBackend, config: EngineConfig) -> Tokenizer:
    """`tokenizer` remembering its ids in the store `config` names: for a backend that stores its answers
    there (it says what they depend on), itself otherwise or when the store is off."""
    location = store_location(config)
    if location is None or not isinstance(backend, ModelIdentitySource):
        return tokenizer
    return RememberedTokenizer(tokenizer, location, config.cache_limit)
