"""Token ids remembered in the answer store: a tokenizer is asked only for texts (and vocabulary entries) it
was never asked for under its identity; what is read back is exactly what it said; a damaged, foreign or
unusable store costs its own work, never a wrong id."""

from __future__ import annotations

import sqlite3
import warnings
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quail.cache import AnswerStore, AnswerStoreWarning, token_ids
from quail.cache import store as store_module
from quail.cache.store import Answer
from quail.cache.token_ids import RememberedTokenizer, remembered
from quail.cli import main
from quail.config import EngineConfig
from quail.testing import ByteTokenizer, KeywordBackend


class CountingTokenizer(ByteTokenizer):
    """Bytes as tokens, shifted by `shift` (another "vocabulary" under another identity), counting every
    text and vocabulary entry it is asked for."""

    def __init__(self, identity: str = "counting-v1", shift: int = 0) -> None:
        self.identity = identity
        self.shift = shift
        self.texts: list[str] = []
        self.entries: list[str] = []

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        self.texts.extend(texts)
        return [[i + self.shift for i in self.encode(t)] for t in texts]

    def token_id(self, token: str) -> int | None:
        self.entries.append(token)
        found = super().token_id(token)
        return None if found is None else found + self.shift


TEXTS = ["a great film", "", "dull — and long", "a great film", "ünïcödé 🎬"]


def expected(texts: Sequence[str], shift: int = 0) -> list[list[int]]:
    return [[i + shift for i in ByteTokenizer().encode(t)] for t in texts]


def test_a_second_tokenizer_reads_every_id_the_first_computed(tmp_path):
    store = tmp_path / "answers.sqlite"
    first, second = CountingTokenizer(), CountingTokenizer()
    assert RememberedTokenizer(first, store, 100).encode_batch(TEXTS) == expected(TEXTS)
    assert sorted(first.texts) == sorted(TEXTS)
    again = RememberedTokenizer(second, store, 100)
    assert again.encode_batch(TEXTS) == expected(TEXTS)
    assert [again.encode(t) for t in TEXTS] == expected(TEXTS)
    assert second.texts == []
    assert again.encode_batch(["a new text", "a great film"]) == expected(["a new text", "a great film"])
    assert second.texts == ["a new text"]


def test_vocabulary_entries_present_and_absent_are_remembered(tmp_path):
    store = tmp_path / "answers.sqlite"
    first, second = CountingTokenizer(shift=7), CountingTokenizer(shift=7)
    entries = ["a", "é", "TRUE", "<eos>", "<im_end>"]
    answers = [RememberedTokenizer(first, store, 100).token_id(e) for e in entries]
    assert answers == [ord("a") + 3 + 7, None, None, 2 + 7, None]
    assert [RememberedTokenizer(second, store, 100).token_id(e) for e in entries] == answers
    assert second.entries == []


def test_another_tokenizer_identity_never_reads_these_ids(tmp_path):
    store = tmp_path / "answers.sqlite"
    RememberedTokenizer(CountingTokenizer("one"), store, 100).encode_batch(TEXTS)
    other = CountingTokenizer("two", shift=100)
    assert RememberedTokenizer(other, store, 100).encode_batch(TEXTS) == expected(TEXTS, shift=100)
    assert sorted(other.texts) == sorted(TEXTS)


@settings(max_examples=40, deadline=None)
@given(texts=st.lists(st.text(max_size=30), max_size=8))
def test_ids_read_back_equal_the_tokenizers_own(tmp_path_factory, texts):
    store = tmp_path_factory.mktemp("tokens") / "answers.sqlite"
    written = RememberedTokenizer(CountingTokenizer(), store, 1000).encode_batch(texts)
    reader = CountingTokenizer()
    assert RememberedTokenizer(reader, store, 1000).encode_batch(texts) == written == expected(texts)
    assert reader.texts == []


def test_a_damaged_stored_list_is_computed_again_and_replaced(tmp_path):
    store = tmp_path / "answers.sqlite"
    RememberedTokenizer(CountingTokenizer(), store, 100).encode_batch(["abc", "xyz"])
    with sqlite3.connect(store) as db:
        db.execute("UPDATE token_lists SET ids = X'0500000006000000'")  # every value: a wrong checksum
    reader = CountingTokenizer()
    assert RememberedTokenizer(reader, store, 100).encode_batch(["abc", "xyz"]) == expected(["abc", "xyz"])
    assert sorted(reader.texts) == ["abc", "xyz"]
    third = CountingTokenizer()
    assert RememberedTokenizer(third, store, 100).encode_batch(["abc", "xyz"]) == expected(["abc", "xyz"])
    assert third.texts == []


def test_an_unusable_store_warns_once_and_the_tokenizer_answers(tmp_path):
    store = tmp_path / "answers.sqlite"
    store.write_bytes(b"this is not a database" * 100)
    inner = CountingTokenizer()
    tokenizer = RememberedTokenizer(inner, store, 100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert tokenizer.encode_batch(TEXTS) == expected(TEXTS)
        assert tokenizer.token_id("a") == ord("a") + 3
        assert tokenizer.encode("again") == expected(["again"])[0]
    assert [type(w.message) for w in caught] == [AnswerStoreWarning]
    assert "token ids are computed instead" in str(caught[0].message)


def test_token_lists_are_bounded_by_bytes_least_recently_used_first(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "TOKEN_LIST_BYTES", 400)  # each list below: 14 ids of 4 bytes, a checksum
    store = tmp_path / "answers.sqlite"
    writer = RememberedTokenizer(CountingTokenizer(), store, 100)
    for n in range(30):
        writer.encode(f"text number {n:02}")
    with sqlite3.connect(store) as db:  # the file as any SQLite reader sees it
        kept, stored_bytes = db.execute("SELECT count(*), sum(length(ids)) FROM token_lists").fetchone()
    assert 0 < kept < 30 and stored_bytes <= 400
    reader = CountingTokenizer()
    RememberedTokenizer(reader, store, 100).encode_batch(["text number 29", "text number 00"])
    assert reader.texts == ["text number 00"]  # the newest is kept, the oldest evicted


def test_a_store_without_the_token_table_gets_it_and_keeps_its_answers(tmp_path):
    """A store written by a Quail from before token ids were remembered (same schema version, no table)."""
    store = tmp_path / "answers.sqlite"
    opened = AnswerStore.open(store, 100)
    opened.put("model", "a model", [Answer(b"k" * 16, "margin", (1.5,))])
    opened.close()
    with sqlite3.connect(store) as db:
        db.execute("DROP TABLE token_lists")
        db.execute("DELETE FROM counts WHERE name = 'token_list_bytes'")
        assert db.execute("PRAGMA user_version").fetchone()[0] == 1
    assert RememberedTokenizer(CountingTokenizer(), store, 100).encode_batch(TEXTS) == expected(TEXTS)
    reopened = AnswerStore.open(store, 100)
    try:
        assert reopened.get([b"k" * 16]) == {b"k" * 16: (1.5,)}
        assert reopened.stats().token_lists == len(set(TEXTS))
    finally:
        reopened.close()


def test_while_another_process_holds_the_write_lock_stored_ids_are_read(tmp_path):
    store = tmp_path / "answers.sqlite"
    RememberedTokenizer(CountingTokenizer(), store, 100).encode_batch(TEXTS)
    other = sqlite3.connect(store, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        inner = CountingTokenizer()
        tokenizer = RememberedTokenizer(inner, store, 100)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert tokenizer.encode_batch(TEXTS) == expected(TEXTS)
            assert inner.texts == [] and caught == []
            assert tokenizer.encode_batch(["new", "a great film"]) == expected(["new", "a great film"])
            assert tokenizer.encode("newer") == expected(["newer"])[0]
            assert tokenizer.encode_batch(["dull — and long"]) == expected(["dull — and long"])
        assert inner.texts == ["new", "newer"]  # stored ids still read after the write that failed
        assert [type(w.message) for w in caught] == [AnswerStoreWarning]  # that write, at once; the next not tried
    finally:
        other.execute("ROLLBACK")
        other.close()


def test_a_failed_store_is_tried_again_after_a_while(tmp_path, monkeypatch):
    store = tmp_path / "answers.sqlite"
    store.write_bytes(b"not a database" * 100)
    tokenizer = RememberedTokenizer(CountingTokenizer(), store, 100)
    with pytest.warns(AnswerStoreWarning):
        tokenizer.encode("a text")
    store.unlink()
    tokenizer.encode("a second text")
    assert not store.exists()  # within the pause the store is left alone
    monkeypatch.setattr(token_ids, "RETRY_AFTER_S", 0.0)
    tokenizer.encode("a third text")
    reader = CountingTokenizer()
    RememberedTokenizer(reader, store, 100).encode("a third text")
    assert reader.texts == []


def test_short_texts_and_vocabulary_entries_are_kept_in_the_process(tmp_path):
    """A query asks for the same prompt pieces one at a time, many times: after the first, the store file is not
    opened."""
    store = tmp_path / "answers.sqlite"
    inner = CountingTokenizer()
    tokenizer = RememberedTokenizer(inner, store, 100)
    pieces = ["Is this review positive? ", "TRUE"]
    for piece in pieces:
        tokenizer.encode(piece)
    tokenizer.token_id("a")
    for path in tmp_path.iterdir():
        path.unlink()
    assert [tokenizer.encode(piece) for piece in pieces[::-1]] == expected(pieces[::-1])
    assert tokenizer.token_id("a") == ord("a") + 3
    assert not store.exists()
    assert sorted(inner.texts) == sorted(pieces) and inner.entries == ["a"]


def test_texts_the_process_keeps_and_uses_are_not_evicted_as_unused(tmp_path, monkeypatch):
    """Served from the process's kept texts, a prompt piece is still marked used in the store (the next time the
    store is opened), so filling the store evicts texts nobody asked for since, not it."""
    monkeypatch.setattr(store_module, "TOKEN_LIST_BYTES", 400)  # room for a few of these lists
    store = tmp_path / "answers.sqlite"
    tokenizer = RememberedTokenizer(CountingTokenizer(), store, 100)
    tokenizer.encode("prompt piece 00")  # stored first: the oldest
    for n in range(1, 30):
        tokenizer.encode("prompt piece 00")  # from the process's kept texts
        tokenizer.encode(f"text number {n:02}")  # opens the store
    reader = CountingTokenizer()
    RememberedTokenizer(reader, store, 100).encode_batch(["prompt piece 00", "text number 01"])
    assert reader.texts == ["text number 01"]  # used all along: kept; asked for once, long ago: evicted


def test_cache_clear_removes_the_token_ids_and_stats_counts_them(tmp_path, capsys):
    store = tmp_path / "answers.sqlite"
    RememberedTokenizer(CountingTokenizer(), store, 100).encode_batch(TEXTS)
    assert main(["cache", "stats", "--store", str(store)]) == 0
    assert f"{len(set(TEXTS))} texts' token ids" in capsys.readouterr().out
    assert main(["cache", "clear", "--store", str(store)]) == 0
    assert f"removed 0 answers and {len(set(TEXTS))} texts' token ids" in capsys.readouterr().out
    reader = CountingTokenizer()
    RememberedTokenizer(reader, store, 100).encode_batch(TEXTS)
    assert sorted(reader.texts) == sorted(TEXTS)


class BackendWithoutIdentity:
    """Says nothing about what its answers depend on: it gets no answer store, so no remembered ids."""

    name = "no-identity"


def test_only_a_session_whose_backend_stores_answers_remembers(tmp_path: Path):
    inner, stored = ByteTokenizer(), EngineConfig(cache=str(tmp_path / "answers.sqlite"))
    assert remembered(inner, KeywordBackend(), EngineConfig(cache="off")) is inner
    assert remembered(inner, BackendWithoutIdentity(), stored) is inner  # type: ignore[arg-type]
    assert isinstance(remembered(inner, KeywordBackend(), stored), RememberedTokenizer)
