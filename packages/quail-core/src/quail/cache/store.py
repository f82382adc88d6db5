"""AnswerStore: one SQLite file (WAL) of raw readouts, shared by every process on the machine.

Answers are keyed by `quail.cache.keys` and hold the raw readout as little-endian float64s
(a margin, a label log-probability per label, a calibration offset) — never a decision, so
calibration and thresholds still apply when they are read — followed by a CRC-32 of key and
readout: a damaged value is read as missing (and computed again), never as an answer. Writes are batches in one `BEGIN
IMMEDIATE` transaction each: a process killed mid-write leaves the last committed batch, never
half of one. Answer writers wait for each other (busy timeout); readers never wait (WAL); what is only
a cache of a cache (when answers were last used, token lists) never waits for a lock.

A store file carries Quail's marker: SQLite's `application_id` in its header (an older Quail's store,
without it, is known by its schema and gets it). Nothing else is ever opened for writing, changed or
deleted: a path that holds another application's database, a text file or a directory is refused
(`NotAnAnswerStore`) with what was found there. A new store is made whole in a temporary file beside it
and linked into place, so a file at the path without the marker was never Quail's.

The store keeps at most `limit` answers: past it, the least recently used (read or written) are
deleted in the same transaction that overflowed it. Every SQLite failure surfaces as `StoreError`
with the file's path; callers decide whether that stops them (the CLI) or only the store (queries).

Beside the answers it keeps token ids (`token_lists`): what a tokenizer made of a text, keyed by
(tokenizer identity, text) and checksummed like answers. Stored answers are keyed by prompt token
ids, so a query whose answers are all stored still needs its texts' ids; read from here, no tokenizer
is parsed (seconds for a 262k-entry vocabulary). Token lists are bounded by bytes (documents are
long; a row is counted with its key and overhead), least recently used evicted first. The table came
without a schema change: a Quail that does not know it reads the store as before, and a store that
cannot be written keeps its answers.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import sqlite3
import stat
import struct
import tempfile
import time
import urllib.parse
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from quail.cache.keys import Key, ReadoutKind, token_bytes
from quail.data.tokenizer import TokenIds

SCHEMA_VERSION = 1
APPLICATION_ID = 0x5155414C
"""SQLite's `application_id` of an answer store ("QUAL"): the marker that says Quail made the file."""
SQLITE_MAGIC = b"SQLite format 3\x00"
_QUAIL_TABLES = frozenset({"answers", "models", "files", "counts"})
"""The tables of every Quail store; an older one without the marker is known by them."""
BUSY_TIMEOUT_S = 5.0
"""How long a write waits for another process's write before the store gives up on that batch."""
LOOKUP_BATCH = 500
"""Keys per SELECT (SQLite limits the number of bound parameters)."""
EVICT_TO = 0.9
"""An overflowing store is trimmed to this fraction of its limit, so eviction does not run on every write."""
TOKEN_LIST_BYTES = 256 << 20
"""The most bytes of token lists a store keeps, counted as `_ROW_BYTES` each."""
ROW_OVERHEAD = 48
"""Bytes a token list's row costs besides its key and ids (its `used` time, index entry, record header)."""
_ROW_BYTES = f"length(key) + length(ids) + {ROW_OVERHEAD}"
KIND_CODES: dict[ReadoutKind, int] = {"margin": 1, "labels": 2, "calibration": 3, "generation": 4, "embedding": 5}
KIND_NAMES: dict[int, ReadoutKind] = {code: kind for kind, code in KIND_CODES.items()}
Readout = tuple[float, ...]
Value = TypeVar("Value", Readout, TokenIds)

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS answers (key BLOB PRIMARY KEY, model INTEGER NOT NULL, kind INTEGER NOT NULL, "
    "value BLOB NOT NULL, used INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS answers_by_use ON answers (used)",
    "CREATE TABLE IF NOT EXISTS models (id INTEGER PRIMARY KEY, identity TEXT NOT NULL UNIQUE, "
    "description TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS files (path TEXT PRIMARY KEY, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, "
    "digest TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS counts (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
)
_TOKEN_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS token_lists (key BLOB PRIMARY KEY, ids BLOB NOT NULL, used INTEGER NOT NULL) "
    "WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS token_lists_by_use ON token_lists (used)",
    "INSERT OR IGNORE INTO counts VALUES ('token_list_bytes', 0)",
)
Table = Literal["answers", "token_lists"]
"""The tables evicted by use: answers counted in rows (`counts` row `answers`), token lists in bytes
(`token_list_bytes`)."""


class StoreError(Exception):
    """The answer store could not be read or written (corrupt, locked, made by a newer Quail, unwritable)."""


def is_locked(error: BaseException) -> bool:
    """Whether the store failed because another process holds its write lock (SQLite's "locked" / "busy"): the
    store is sound and will serve again, so no advice may suggest deleting it."""
    text = str(error.__cause__ or error) + str(error)
    return "locked" in text or "busy" in text


class NotAnAnswerStore(StoreError):
    """The path holds something Quail did not make (another database, a text file, a directory): it is left
    exactly as it was, never opened for writing, never deleted."""


@dataclass(frozen=True)
class Answer:
    """One readout to store under its key."""

    key: Key
    kind: ReadoutKind
    value: Readout


@dataclass(frozen=True)
class ModelCount:
    identity: str
    description: str
    answers: dict[ReadoutKind, int]


@dataclass(frozen=True)
class StoreStats:
    path: Path
    bytes_on_disk: int
    answers: int
    models: tuple[ModelCount, ...]
    token_lists: int = 0


@dataclass(frozen=True)
class Cleared:
    """What `clear` removed, for the CLI to say."""

    answers: int
    token_lists: int


class AnswerStore:
    """An open store file. Not thread-safe: one per thread (queries open one per request)."""

    def __init__(self, connection: sqlite3.Connection, path: Path, limit: int) -> None:
        self._db = connection
        self.path = path
        self.limit = limit
        self._models: dict[str, int] = {}
        self._touched: dict[Table, set[Key]] = {"answers": set(), "token_lists": set()}
        self.damaged = 0
        """Values read so far whose checksum did not match (treated as missing, deleted at the next write)."""
        self._damaged_keys: dict[Table, set[Key]] = {"answers": set(), "token_lists": set()}
        self.token_list_bytes = TOKEN_LIST_BYTES
        self._token_lists_ready = False
        self.writable = True
        """False for a store this process may only read: writes are skipped, never attempted."""

    @classmethod
    def open(cls, path: Path, limit: int) -> AnswerStore:
        """Open (creating when missing) the store at `path`; StoreError when it is not a usable store,
        NotAnAnswerStore when the file there is not one Quail made."""
        with _failures(path, "open"):
            if identify(path) == "missing":
                _create(path)
            if not _writable(path):
                return cls._read_only(path, limit)
            connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        store = cls(connection, path, limit)
        try:
            with _failures(path, "open"):
                store._prepare()
        except StoreError:
            connection.close()
            raise
        return store

    @classmethod
    def _read_only(cls, path: Path, limit: int) -> AnswerStore:
        """A store this process may only read (its file or directory is not writable): its answers serve, and
        nothing is written — not an answer, not when one was used. Through SQLite's read-only mode, else (a
        WAL store whose index this process cannot create) as an immutable file: what was checkpointed."""
        quoted_path = urllib.parse.quote(str(path.resolve()))
        last: sqlite3.Error | None = None
        for mode in ("mode=ro", "mode=ro&immutable=1"):
            try:
                connection = sqlite3.connect(f"file:{quoted_path}?{mode}", uri=True, isolation_level=None)
            except sqlite3.Error as error:
                last = error
                continue
            store = cls(connection, path, limit)
            store.writable = False
            try:
                store._prepare_read_only()
                return store
            except sqlite3.Error as error:
                connection.close()
                last = error
        raise StoreError(f"could not open the read-only answer store {path}: {last}") from last

    def _prepare_read_only(self) -> None:
        version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"made by a newer Quail (schema {version}; this one reads {SCHEMA_VERSION})")
        self._db.execute("SELECT count(*) FROM answers WHERE 0").fetchone()
        self._token_lists_ready = bool(self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'token_lists'").fetchone())

    def _prepare(self) -> None:
        db = self._db
        db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"made by a newer Quail (schema {version}; this one reads {SCHEMA_VERSION})")
        if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        self._mark()
        self._token_lists_ready = self._ensure_token_lists()

    def _mark(self) -> None:
        """An older Quail's store (known by its schema) gets the marker; where it cannot be written now
        (read-only, locked) the schema still tells, next time too."""
        if int(self._db.execute("PRAGMA application_id").fetchone()[0]) == APPLICATION_ID:
            return
        with contextlib.suppress(sqlite3.OperationalError), self._without_waiting(), self._transaction():
            self._db.execute(f"PRAGMA application_id = {APPLICATION_ID}")

    def _ensure_token_lists(self) -> bool:
        """The token_lists table, created where missing; False where it cannot be (a store this process may
        only read): the answers still serve."""
        if self._db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'token_lists'").fetchone():
            return True
        try:
            with self._without_waiting(), self._transaction():
                for statement in _TOKEN_SCHEMA:
                    self._db.execute(statement)
        except sqlite3.OperationalError:  # read-only, or locked now: a later open tries again
            return False
        return True

    @contextlib.contextmanager
    def _without_waiting(self) -> Iterator[None]:
        """For writes that are only worth it when no other process holds the lock."""
        self._db.execute("PRAGMA busy_timeout = 0")
        try:
            yield
        finally:
            self._db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")

    def close(self) -> None:
        """Record when the values read were last used: best effort and without waiting for another writer's
        lock, since only the eviction order depends on it."""
        if self.writable and any(self._touched.values()):
            with contextlib.suppress(StoreError, sqlite3.Error), _failures(self.path, "update"), \
                    self._without_waiting(), self._transaction():
                self._touch()
        self._db.close()

    # -- answers ----------------------------------------------------------------------------------

    def get(self, keys: Iterable[Key]) -> dict[Key, Readout]:
        """The stored readouts among `keys` (absent keys are simply missing)."""
        return self._read("answers", "value", keys, _unpack)

    def put(self, model: str, description: str, answers: Sequence[Answer]) -> None:
        """Store one batch in one transaction (all or nothing), evicting past the limit (nothing, read-only)."""
        if not answers or not self.writable:
            return
        now = _clock()
        with _failures(self.path, "write"), self._transaction():
            self._forget_damaged()
            model_id = self._model_id(model, description)
            cursor = self._db.executemany(
                "INSERT OR IGNORE INTO answers VALUES (?, ?, ?, ?, ?)",
                [(a.key, model_id, KIND_CODES[a.kind], _pack(a.key, a.value), now) for a in answers])
            self._db.execute("UPDATE counts SET value = value + ? WHERE name = 'answers'", (max(cursor.rowcount, 0),))
            self._touch()
            self._evict_answers()

    # -- token ids ----------------------------------------------------------------------------------

    def token_lists(self, keys: Iterable[Key]) -> dict[Key, TokenIds]:
        """The stored token ids among `keys` (see `quail.cache.token_ids` for how texts are keyed)."""
        self._require_token_lists()
        return self._read("token_lists", "ids", keys, _unpack_ids)

    def put_token_lists(self, lists: Sequence[tuple[Key, TokenIds]]) -> None:
        """Store token ids in one transaction (all or nothing), evicting past `token_list_bytes`; StoreError
        at once, without waiting, when another process holds the lock (they are only a cache)."""
        self._require_token_lists()
        if not lists or not self.writable:
            return
        try:
            rows = [(key, _pack_ids(key, ids)) for key, ids in lists]
        except (OverflowError, TypeError) as error:  # an id outside 0 … 2³² − 1
            raise StoreError(f"token ids that the answer store {self.path} cannot hold: {error}") from error
        now = _clock()
        with _failures(self.path, "write"), self._without_waiting(), self._transaction():
            self._forget_damaged()
            added = 0
            for key, packed in rows:  # one by one: only the rows inserted count their bytes
                if self._db.execute("INSERT OR IGNORE INTO token_lists VALUES (?, ?, ?)", (key, packed, now)).rowcount:
                    added += len(key) + len(packed) + ROW_OVERHEAD
            self._db.execute("INSERT OR IGNORE INTO counts VALUES ('token_list_bytes', 0)")
            self._db.execute("UPDATE counts SET value = value + ? WHERE name = 'token_list_bytes'", (added,))
            self._touch()
            self._evict_token_lists()

    def _require_token_lists(self) -> None:
        if not self._token_lists_ready:
            raise StoreError(f"the answer store {self.path} has no table of token ids and could not be given one "
                             "when opened (read-only, or another process was writing)")

    # -- both tables ----------------------------------------------------------------------------------

    def _read(self, table: Table, column: str, keys: Iterable[Key],
              unpack: Callable[[Key, object], Value | None]) -> dict[Key, Value]:
        """The checksummed values stored under `keys`; a damaged one counts as missing and is deleted later."""
        wanted = list(dict.fromkeys(keys))
        found: dict[Key, Value] = {}
        with _failures(self.path, "read"):
            for start in range(0, len(wanted), LOOKUP_BATCH):
                batch = wanted[start:start + LOOKUP_BATCH]
                marks = ",".join("?" * len(batch))
                for key, stored in self._db.execute(f"SELECT key, {column} FROM {table} WHERE key IN ({marks})",
                                                    batch):
                    value = unpack(bytes(key), stored)
                    if value is None:
                        self.damaged += 1
                        self._damaged_keys[table].add(bytes(key))
                    else:
                        found[bytes(key)] = value
        self._touched[table].update(found)
        return found

    def _forget_damaged(self) -> None:
        """Delete the damaged values read so far, so they can be stored again."""
        answers, token_lists = self._damaged_keys["answers"], self._damaged_keys["token_lists"]
        if answers:
            removed = self._db.executemany("DELETE FROM answers WHERE key = ?", [(k,) for k in answers])
            self._db.execute("UPDATE counts SET value = value - ? WHERE name = 'answers'", (max(removed.rowcount, 0),))
            answers.clear()
        if token_lists:  # rare: the bytes are counted again
            self._db.executemany("DELETE FROM token_lists WHERE key = ?", [(k,) for k in token_lists])
            self._db.execute(f"UPDATE counts SET value = (SELECT coalesce(sum({_ROW_BYTES}), 0) FROM token_lists) "
                             "WHERE name = 'token_list_bytes'")
            token_lists.clear()

    def _touch(self) -> None:
        now = _clock()
        for table, keys in self._touched.items():
            if keys:
                self._db.executemany(f"UPDATE {table} SET used = ? WHERE key = ?", [(now, k) for k in keys])
                keys.clear()

    def _evict_answers(self) -> None:
        count = int(self._db.execute("SELECT value FROM counts WHERE name = 'answers'").fetchone()[0])
        if count <= self.limit:
            return
        excess = count - int(self.limit * EVICT_TO)
        cursor = self._db.execute(
            "DELETE FROM answers WHERE key IN (SELECT key FROM answers ORDER BY used LIMIT ?)", (excess,))
        self._db.execute("UPDATE counts SET value = value - ? WHERE name = 'answers'", (max(cursor.rowcount, 0),))

    def _evict_token_lists(self) -> None:
        total = int(self._db.execute("SELECT value FROM counts WHERE name = 'token_list_bytes'").fetchone()[0])
        if total <= self.token_list_bytes:
            return
        excess = total - int(self.token_list_bytes * EVICT_TO)
        doomed, freed = [], 0
        oldest = self._db.execute(f"SELECT key, {_ROW_BYTES} FROM token_lists ORDER BY used")
        for key, size in oldest:  # read only as far as needed
            if freed >= excess:
                break
            doomed.append((key,))
            freed += int(size)
        oldest.close()
        self._db.executemany("DELETE FROM token_lists WHERE key = ?", doomed)
        self._db.execute("UPDATE counts SET value = value - ? WHERE name = 'token_list_bytes'", (freed,))

    def _model_id(self, identity: str, description: str) -> int:
        found = self._models.get(identity)
        if found is None:
            self._db.execute("INSERT OR IGNORE INTO models (identity, description) VALUES (?, ?)",
                             (identity, description))
            found = int(self._db.execute("SELECT id FROM models WHERE identity = ?", (identity,)).fetchone()[0])
            self._models[identity] = found
        return found

    # -- file digests (model identities hash weights once per file version) ------------------------

    def file_digest(self, path: Path) -> str:
        """SHA-256 of a file's content, remembered by (path, size, mtime) so it is computed once per version."""
        status = path.stat()
        resolved = str(path.resolve())
        with _failures(self.path, "read"):
            row = self._db.execute("SELECT digest FROM files WHERE path = ? AND size = ? AND mtime_ns = ?",
                                   (resolved, status.st_size, status.st_mtime_ns)).fetchone()
        if row is not None:
            return str(row[0])
        digest = content_digest(path)
        if not self.writable:
            return digest
        with _failures(self.path, "write"), self._transaction():
            self._db.execute("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?)",
                             (resolved, status.st_size, status.st_mtime_ns, digest))
        return digest

    # -- the CLI's view -----------------------------------------------------------------------------

    def stats(self) -> StoreStats:
        """What the store holds, per model and readout kind (counted, not taken from the running count)."""
        with _failures(self.path, "read"):
            rows = self._db.execute("SELECT m.identity, m.description, a.kind, count(*) FROM answers a "
                                    "JOIN models m ON m.id = a.model GROUP BY a.model, a.kind ORDER BY m.id").fetchall()
        models: dict[str, ModelCount] = {}
        for identity, description, kind, count in rows:
            entry = models.setdefault(identity, ModelCount(identity, description, {}))
            entry.answers[KIND_NAMES.get(int(kind), "margin")] = int(count)
        total = sum(sum(m.answers.values()) for m in models.values())
        token_lists = 0
        if self._token_lists_ready:
            with _failures(self.path, "read"):
                token_lists = int(self._db.execute("SELECT count(*) FROM token_lists").fetchone()[0])
        return StoreStats(self.path, disk_bytes(self.path), total, tuple(models.values()), token_lists)

    def clear(self) -> Cleared:
        """Delete every answer and token list (file digests stay: they describe files, not answers)."""
        with _failures(self.path, "write"), self._transaction():
            answers = self._db.execute("DELETE FROM answers").rowcount
            self._db.execute("DELETE FROM models")
            self._db.execute("UPDATE counts SET value = 0 WHERE name = 'answers'")
            token_lists = 0
            if self._token_lists_ready:
                token_lists = self._db.execute("DELETE FROM token_lists").rowcount
                self._db.execute("UPDATE counts SET value = 0 WHERE name = 'token_list_bytes'")
        with _failures(self.path, "write"):
            self._db.execute("VACUUM")
        return Cleared(max(answers, 0), max(token_lists, 0))

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")


def content_digest(path: Path) -> str:
    """SHA-256 of a file, computed once per process and file version (path, size, mtime).

    Every answer store a process opens asks for the same weights' digests (the bench's temporary
    store, a session per test): hashing a 1 GB checkpoint takes a second or more each time.
    """
    resolved = path.resolve()
    status = resolved.stat()
    return _version_digest(resolved, status.st_size, status.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _version_digest(resolved: Path, size: int, mtime_ns: int) -> str:
    """A Hugging Face hub blob is named by its SHA-256 already: that name is used."""
    name = resolved.name
    if resolved.parent.name == "blobs" and len(name) == 64 and all(c in "0123456789abcdef" for c in name):
        return name
    with resolved.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def disk_bytes(path: Path) -> int:
    """The store file and its write-ahead log and shared-memory index."""
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm"))
               if p.exists())


def identify(path: Path) -> Literal["missing", "ours", "older"]:
    """What is at `path`: nothing, a store with Quail's marker, or an older Quail's store (its schema, no
    marker); NotAnAnswerStore for anything else. Reads the header, and the schema of a SQLite file without
    an application id through an immutable read-only connection: a foreign file is never changed."""
    try:
        status = path.stat()
    except FileNotFoundError:
        return "missing"
    if stat.S_ISDIR(status.st_mode):
        raise NotAnAnswerStore(f"{path} is a directory, not an answer store; name a file (Quail makes it)")
    if not stat.S_ISREG(status.st_mode):
        raise NotAnAnswerStore(f"{path} is not a regular file, so not an answer store; name a file (Quail makes it)")
    with path.open("rb") as handle:
        header = handle.read(100)
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        what = "an empty file" if not header else f"a file of {status.st_size:,} bytes that is no SQLite database"
        raise NotAnAnswerStore(f"{path} is not an answer store: it is {what}; Quail leaves it as it is "
                               "(name another path, or remove it yourself)")
    application = int.from_bytes(header[68:72], "big")
    version = int.from_bytes(header[60:64], "big")
    if application == APPLICATION_ID:
        return "ours"
    if application == 0 and version == SCHEMA_VERSION:
        tables = _tables(path)
        if _QUAIL_TABLES <= tables <= _QUAIL_TABLES | {"token_lists"}:
            return "older"
    else:
        tables = set()
    found = f"application_id {application:#x}, " if application else ""
    listed = f"; tables: {', '.join(sorted(tables))}" if tables else ""
    raise NotAnAnswerStore(f"{path} is not an answer store: it is a SQLite database Quail did not make "
                           f"({found}user_version {version}{listed}); Quail leaves it as it is")


def _writable(path: Path) -> bool:
    """Whether this process may write the store: its file, and its directory (SQLite's log and index)."""
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)


def _tables(path: Path) -> set[str]:
    """The table names of a SQLite file, read without a lock, a journal or any write."""
    uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro&immutable=1"
    try:
        connection = sqlite3.connect(uri, uri=True)
        try:
            rows = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        finally:
            connection.close()
    except sqlite3.Error:
        return set()
    return {str(name) for (name,) in rows if not str(name).startswith("sqlite_")}


def _create(path: Path) -> None:
    """A new store, made whole (marker, schema, WAL mode) in a temporary file beside `path` and linked into
    place: the path holds either nothing or a complete store. When another process links its store first,
    that one is used. The temporary file is removed on every exit."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".new", dir=path.parent)
    os.close(handle)
    temporary = Path(name)
    try:
        umask = os.umask(0)
        os.umask(umask)
        temporary.chmod(0o666 & ~umask)
        connection = sqlite3.connect(temporary, isolation_level=None)
        try:
            connection.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            connection.execute("BEGIN IMMEDIATE")
            for statement in (*_SCHEMA, *_TOKEN_SCHEMA):
                connection.execute(statement)
            connection.execute("INSERT OR IGNORE INTO counts VALUES ('answers', 0)")
            connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            connection.execute("COMMIT")
            connection.execute("PRAGMA journal_mode = WAL")
        finally:
            connection.close()
        with contextlib.suppress(FileExistsError):
            os.link(temporary, path)
    finally:
        for leftover in (temporary, temporary.with_name(temporary.name + "-wal"),
                         temporary.with_name(temporary.name + "-shm")):
            leftover.unlink(missing_ok=True)


def remove_files(path: Path) -> None:
    """Delete a damaged store, with its log and index — only one that carries Quail's marker (or an older
    Quail's schema): NotAnAnswerStore, and nothing deleted, for any other file."""
    identify(path)
    for candidate in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        candidate.unlink(missing_ok=True)


def _pack(key: Key, value: Readout) -> bytes:
    floats = struct.pack(f"<{len(value)}d", *value)
    return floats + struct.pack("<I", zlib.crc32(key + floats))


def _unpack(key: Key, value: object) -> Readout | None:
    """A readout, or None for a damaged value (not bytes, wrong length or checksum): read as a miss, never as an
    answer."""
    if not isinstance(value, bytes):
        return None
    floats, check = value[:-4], value[-4:]
    if not floats or len(floats) % 8 or struct.pack("<I", zlib.crc32(key + floats)) != check:
        return None
    return struct.unpack(f"<{len(floats) // 8}d", floats)


def _pack_ids(key: Key, ids: TokenIds) -> bytes:
    packed = token_bytes(ids)
    return packed + struct.pack("<I", zlib.crc32(key + packed))


def _unpack_ids(key: Key, value: object) -> TokenIds | None:
    """Token ids, or None for a damaged value (an empty list is a value: the ids of an empty text)."""
    if not isinstance(value, bytes):
        return None
    packed, check = value[:-4], value[-4:]
    if len(check) != 4 or len(packed) % 4 or struct.pack("<I", zlib.crc32(key + packed)) != check:
        return None
    return struct.unpack(f"<{len(packed) // 4}I", packed)


def _clock() -> int:
    return time.time_ns() // 1000


@contextlib.contextmanager
def _failures(path: Path, action: str) -> Iterator[None]:
    try:
        yield
    except (sqlite3.Error, OSError) as error:
        raise StoreError(f"could not {action} the answer store {path}: {error}") from error
