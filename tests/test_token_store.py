"""Token store: per-document tokens in mapped Arrow files, reused by key, removed on close, bounded memory."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quail import CompileError, DocumentProvider, QuailError
from quail.data.tokenizer import Tokenizer
from quail.data.tokens import LengthSummary, TokenColumn, TokenStore


class WordTokenizer:
    """Deterministic test tokenizer: each whitespace-separated word is one id from a stable hash."""

    def __init__(self, name: str = "words") -> None:
        self._name = name
        self.batches = 0
        self.texts = 0
        self._words: dict[int, str] = {}

    @property
    def identity(self) -> str:
        return f"test-{self._name}"

    @property
    def bos_id(self) -> int | None:
        return None

    def token_id(self, token: str) -> int | None:
        return zlib.crc32(token.encode()) % 30_000 + 1

    def encode(self, text: str) -> list[int]:
        return [self.token_id(word) for word in text.split()]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        self.batches += 1
        self.texts += len(texts)
        return [self.encode(text) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(self._words.get(i, "?") for i in ids)


BODIES = ["the cat sat", "", "a much longer review of the film with many words", "one", "x y"]


def _provider(bodies: Sequence[str | None] = BODIES) -> DocumentProvider:
    return DocumentProvider.from_table(pa.table({
        "id": list(range(len(bodies))),
        "body": pa.array(bodies, pa.string()),
        "title": [f"title {i}" for i in range(len(bodies))],
    }), "id")


def test_the_test_tokenizer_is_a_tokenizer():
    assert isinstance(WordTokenizer(), Tokenizer)


def test_tokens_equal_per_document_encode(tmp_path):
    tokenizer = WordTokenizer()
    with TokenStore(tmp_path, batch_rows=2) as store:
        column = store.tokens(_provider(), "body", tokenizer)
        assert len(column) == len(BODIES)
        assert [column.row(i) for i in range(len(BODIES))] == [tuple(tokenizer.encode(b)) for b in BODIES]
        assert column.path.parent == tmp_path
        assert column.path.exists()
        taken = column.take(pa.array([2, 0, 2], pa.int32()))
        assert isinstance(taken, pa.ListArray)
        assert taken.type == pa.list_(pa.int32())
        assert taken.to_pylist() == [tokenizer.encode(BODIES[i]) for i in (2, 0, 2)]
        assert column.take([]).to_pylist() == []


def test_batches_split_by_text_size_give_the_same_tokens(tmp_path):
    tokenizer = WordTokenizer()
    bodies = [" ".join(f"w{i}x{j}" for j in range(i % 7)) for i in range(50)]
    with TokenStore(batch_rows=16, batch_bytes=40) as store:
        column = store.tokens(_provider(bodies), "body", tokenizer)
        assert [column.row(i) for i in range(50)] == [tuple(tokenizer.encode(b)) for b in bodies]
        assert tokenizer.batches > 50 // 16 + 1


def test_file_is_arrow_ipc_with_one_token_list_per_document(tmp_path):
    with TokenStore(tmp_path) as store:
        column = store.tokens(_provider(), "body", WordTokenizer())
        with pa.memory_map(str(column.path)) as source:
            table = pa.ipc.open_file(source).read_all()
        assert table.schema == pa.schema([pa.field("tokens", pa.list_(pa.int32()))])
        assert table.num_rows == len(BODIES)


def test_same_key_is_reused_without_retokenizing(tmp_path):
    tokenizer = WordTokenizer()
    with TokenStore(tmp_path) as store:
        first = store.tokens(_provider(), "body", tokenizer)
        calls = tokenizer.batches
        assert calls >= 1
        assert store.tokens(_provider(), "body", tokenizer) is first  # equal identity, another provider
        assert tokenizer.batches == calls
        assert len(list(tmp_path.glob("*.arrow"))) == 1


def test_key_includes_column_tokenizer_and_content(tmp_path):
    words, other = WordTokenizer("words"), WordTokenizer("other")
    with TokenStore(tmp_path) as store:
        body = store.tokens(_provider(), "body", words)
        title = store.tokens(_provider(), "title", words)
        again = store.tokens(_provider(), "body", other)
        changed = store.tokens(_provider([*BODIES[:-1], "changed text"]), "body", words)
        assert len({body.path, title.path, again.path, changed.path}) == 4
        assert title.row(0) == tuple(words.encode("title 0"))
        assert words.batches == 3
        assert other.batches == 1


def test_files_and_temporary_directory_removed_on_close():
    store = TokenStore()
    assert store.directory is None  # nothing created until needed
    column = store.tokens(_provider(), "body", WordTokenizer())
    directory = store.directory
    assert directory is not None
    assert directory.name.startswith("quail-")
    assert column.path.exists()
    store.close()
    assert not column.path.exists()
    assert not directory.exists()
    assert store.closed
    store.close()  # idempotent
    with pytest.raises(QuailError, match="closed"):
        store.tokens(_provider(), "body", WordTokenizer())


def test_files_removed_when_the_with_block_raises(tmp_path):
    paths: list[Path] = []
    with pytest.raises(RuntimeError, match="boom"), TokenStore(tmp_path) as store:
        paths.append(store.tokens(_provider(), "body", WordTokenizer()).path)
        paths.append(store.tokens(_provider(), "title", WordTokenizer()).path)
        raise RuntimeError("boom")
    assert paths and not any(path.exists() for path in paths)
    assert tmp_path.exists()  # a directory the store was given is left in place
    assert list(tmp_path.iterdir()) == []


def test_temporary_directory_removed_when_the_with_block_raises():
    with pytest.raises(RuntimeError), TokenStore() as store:
        store.tokens(_provider(), "body", WordTokenizer())
        directory = store.directory
        raise RuntimeError("boom")
    assert directory is not None and not directory.exists()


def test_a_given_directory_keeps_files_of_other_stores(tmp_path):
    tokenizer = WordTokenizer()
    with TokenStore(tmp_path) as first:
        path = first.tokens(_provider(), "body", tokenizer).path
        with TokenStore(tmp_path) as second:
            assert second.tokens(_provider(), "body", tokenizer).row(0) == tuple(tokenizer.encode(BODIES[0]))
            assert tokenizer.batches == 1  # the complete file written by the first store was reused
        assert path.exists()  # the second store did not create it, so it did not remove it
    assert not path.exists()


def test_null_text_is_data_with_a_null_token_list_and_is_never_tokenized(tmp_path):
    bodies = [f"doc {i}" for i in range(10)]
    bodies[7] = None
    bodies[2] = ""
    tokenizer = WordTokenizer()
    with TokenStore(tmp_path, batch_rows=3) as store:
        column = store.tokens(_provider(bodies), "body", tokenizer)
        assert column.tokens[7].as_py() is None
        assert column.row(2) == ()  # an empty string is a document like any other
        assert column.null_count == 1
        assert column.present().to_pylist() == [i != 7 for i in range(10)]
        assert column.lengths()[7].as_py() == 0
        assert len(column.present_lengths()) == 9
        assert tokenizer.texts == sum(1 for b in bodies if b is not None)


def test_only_text_columns_are_tokenized(tmp_path):
    with TokenStore(tmp_path) as store:
        with pytest.raises(CompileError, match="column 'id' holds int64, not text"):
            store.tokens(_provider(), "id", WordTokenizer())
        with pytest.raises(CompileError, match=r"unknown column 'nope'; columns are \['id', 'body', 'title'\]"):
            store.tokens(_provider(), "nope", WordTokenizer())


def test_lengths_and_summaries(tmp_path):
    with TokenStore(tmp_path, batch_rows=2) as store:
        column = store.tokens(_provider(), "body", WordTokenizer())
        lengths = [len(body.split()) for body in BODIES]
        assert isinstance(column.lengths(), pa.Int32Array)
        assert column.lengths().to_pylist() == lengths
        assert column.summary() == LengthSummary(
            count=5, total=sum(lengths), total_squares=sum(n * n for n in lengths), maximum=max(lengths))
        assert column.summary().mean == sum(lengths) / 5
        assert column.summary_of(pa.array([0, 3], pa.int32())) == LengthSummary(2, 4, 10, 3)
        assert column.summary_of([]) == LengthSummary(0, 0, 0, 0)


def test_empty_provider(tmp_path):
    with TokenStore(tmp_path) as store:
        column = store.tokens(_provider([]), "body", WordTokenizer())
        assert len(column) == 0
        assert column.lengths().to_pylist() == []
        assert column.summary() == LengthSummary(0, 0, 0, 0)


def test_token_column_is_a_value(tmp_path):
    with TokenStore(tmp_path) as store:
        column = store.tokens(_provider(), "body", WordTokenizer())
        assert column == TokenColumn.open(column.path)
        with pytest.raises(AttributeError):
            column.path = tmp_path  # type: ignore[misc]
        with pytest.raises(IndexError):
            column.row(len(BODIES))


# -- memory: a corpus on disk is tokenized without holding it ----------------------------------

WORDS = [f"w{(i * 7919) % 997}" for i in range(20_000)]


def _corpus(path: Path, documents: int, start: int) -> Path:
    """Write `documents` generated reviews (60 to 139 words) as Parquet, 10,000 at a time."""
    schema = pa.schema([("id", pa.int64()), ("body", pa.string())])
    with pq.ParquetWriter(path, schema) as writer:
        for chunk in range(start, start + documents, 10_000):
            ids = range(chunk, min(chunk + 10_000, start + documents))
            bodies = [" ".join(WORDS[i * 31 % 19_000:i * 31 % 19_000 + 60 + i % 80]) for i in ids]
            writer.write_table(pa.table({"id": pa.array(ids, pa.int64()), "body": bodies}, schema=schema))
    return path


def _rss() -> int:
    """Resident bytes after returning what the allocators only cache (their caches do not grow with a corpus)."""
    gc.collect()
    pa.default_memory_pool().release_unused()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)  # glibc only
    return psutil.Process().memory_info().rss


def _tokenize(path: Path, store: TokenStore) -> TokenColumn:
    column = store.tokens(DocumentProvider.from_parquet(path, "id"), "body", CachingWordTokenizer())
    column.summary()
    return column


class CachingWordTokenizer(WordTokenizer):
    """The same ids, remembered per word: keeps the large test fast."""

    def __init__(self) -> None:
        super().__init__()
        self._ids: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        ids = self._ids
        return [ids.get(word) or ids.setdefault(word, self.token_id(word) or 0) for word in text.split()]


@pytest.mark.slow
def test_resident_memory_does_not_grow_with_the_corpus(tmp_path):
    small = _corpus(tmp_path / "small.parquet", 10_000, 0)
    large = _corpus(tmp_path / "large.parquet", 100_000, 1_000_000)
    with TokenStore(tmp_path / "tokens") as store:
        _tokenize(_corpus(tmp_path / "warm.parquet", 10_000, 5_000_000), store)  # allocator and imports warm
        base = _rss()
        small_column = _tokenize(small, store)
        small_growth = _rss() - base
        began = time.perf_counter()
        large_column = _tokenize(large, store)
        seconds = time.perf_counter() - began
        large_growth = _rss() - base
        summary = large_column.summary()
        print(f"\n10k: +{small_growth / 2**20:.1f} MiB, 100k: +{large_growth / 2**20:.1f} MiB, "
              f"100k tokenized in {seconds:.1f}s, {summary.total:,} tokens")
        assert summary.count == 100_000
        # The tokens (~40 MB) and the text (~45 MB) would both be resident if either were held.
        assert large_column.path.stat().st_size > 35 * 2**20
        assert large_growth < small_growth + 40 * 2**20
        first = pq.read_table(small).column("body")[0].as_py()
        assert small_column.row(0) == tuple(WordTokenizer().encode(first))
