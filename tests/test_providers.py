"""Document providers: every source, id validation, bounded column-pruned scans, take, identity."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from quail import CompileError, DocumentProvider
from quail.data.providers import TableSchema

N = 23


def _table(n: int = N) -> pa.Table:
    return pa.table({
        "id": pa.array(range(100, 100 + n), pa.int64()),
        "body": [f"document number {i}" for i in range(n)],
        "score": [i * 0.5 for i in range(n)],
    })


def _write_parquet(table: pa.Table, path: Path) -> None:
    pq.write_table(table, path, row_group_size=5)


def _write_ipc(table: pa.Table, path: Path) -> None:
    feather.write_feather(table, path, chunksize=5)


def _write_csv(table: pa.Table, path: Path) -> None:
    pacsv.write_csv(table, path)


def _write_jsonl(table: pa.Table, path: Path) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in table.to_pylist()))


Writer = Callable[[pa.Table, Path], None]
FILES: dict[str, tuple[Writer, Callable[[Path, str], DocumentProvider]]] = {
    "parquet": (_write_parquet, DocumentProvider.from_parquet),
    "ipc": (_write_ipc, DocumentProvider.from_ipc),
    "csv": (_write_csv, DocumentProvider.from_csv),
    "jsonl": (_write_jsonl, DocumentProvider.from_jsonl),
}


def _provider(kind: str, table: pa.Table, tmp_path: Path) -> DocumentProvider:
    if kind == "table":
        return DocumentProvider.from_table(table, "id")
    if kind == "dataset":
        return DocumentProvider.from_dataset(ds.dataset(table), "id")
    write, read = FILES[kind]
    path = tmp_path / f"docs.{kind}"
    write(table, path)
    return read(path, "id")


KINDS = ["table", "dataset", *FILES]


@pytest.mark.parametrize("kind", KINDS)
def test_every_source_reads_the_same_documents(kind, tmp_path):
    provider = _provider(kind, _table(), tmp_path)
    assert provider.id_column == "id"
    assert provider.columns == ("id", "body", "score")
    assert provider.num_rows == N
    assert provider.schema("docs") == TableSchema("docs", ("id", "body", "score"), "id")
    got = provider.to_table(["id", "body"])
    assert got.column("id").to_pylist() == list(range(100, 100 + N))
    assert got.column("body").to_pylist() == [f"document number {i}" for i in range(N)]


@pytest.mark.parametrize("kind", KINDS)
def test_scan_returns_only_requested_columns_in_bounded_batches_and_stable_order(kind, tmp_path):
    provider = _provider(kind, _table(), tmp_path)
    batches = list(provider.scan(["body"], batch_rows=4))
    assert all(batch.schema.names == ["body"] for batch in batches)
    assert all(0 < batch.num_rows <= 4 for batch in batches)
    bodies = [text for batch in batches for text in batch.column(0).to_pylist()]
    assert bodies == [f"document number {i}" for i in range(N)]
    again = [text for batch in provider.scan(["body"], batch_rows=7) for text in batch.column(0).to_pylist()]
    assert again == bodies


def test_scan_keeps_the_requested_column_order():
    provider = DocumentProvider.from_table(_table(), "id")
    (first, *_) = provider.scan(["score", "id"])
    assert first.schema.names == ["score", "id"]
    assert next(provider.scan("body")).schema.names == ["body"]


@pytest.mark.parametrize("kind", KINDS)
def test_take_returns_rows_by_position_in_the_given_order(kind, tmp_path):
    provider = _provider(kind, _table(), tmp_path)
    rows = pa.array([22, 0, 7, 7, 13], pa.int32())
    got = provider.take(rows, ["id", "body"])
    assert got.schema.names == ["id", "body"]
    assert got.column("id").to_pylist() == [122, 100, 107, 107, 113]
    assert got.column("body").to_pylist()[0] == "document number 22"


def test_take_of_nothing_and_out_of_range():
    provider = DocumentProvider.from_table(_table(), "id")
    empty = provider.take(pa.array([], pa.int32()), ["body"])
    assert empty.num_rows == 0
    assert empty.schema.names == ["body"]
    assert provider.take([3, 1]).column("id").to_pylist() == [103, 101]
    with pytest.raises(IndexError, match=f"row {N} is out of range"):
        provider.take(pa.array([0, N], pa.int32()))
    with pytest.raises(IndexError, match="row -1"):
        provider.take([-1])


def test_take_from_a_multi_file_dataset_crosses_files(tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    table = _table(30)
    for part in range(3):
        pq.write_table(table.slice(part * 10, 10), folder / f"part-{part}.parquet")
    provider = DocumentProvider.from_parquet(folder, "id")
    assert provider.num_rows == 30
    assert provider.take([29, 10, 9, 0], ["id"]).column("id").to_pylist() == [129, 110, 109, 100]


@pytest.mark.parametrize("kind", KINDS)
def test_unknown_columns_are_named_with_the_columns_there_are(kind, tmp_path):
    provider = _provider(kind, _table(), tmp_path)
    message = r"unknown column 'title'; columns are \['id', 'body', 'score'\]"
    with pytest.raises(CompileError, match=message):
        provider.scan(["body", "title"])
    with pytest.raises(CompileError, match=message):
        provider.take([0], ["title"])
    with pytest.raises(CompileError, match=message):
        provider.to_table(["title"])


ID_SOURCES = ["table", "parquet", "csv", "ipc", "jsonl"]


@pytest.mark.parametrize("kind", ID_SOURCES)
def test_missing_id_column(kind, tmp_path):
    table = _table()
    with pytest.raises(CompileError, match=r"id column 'key' is missing; columns are \['id', 'body', 'score'\]"):
        if kind == "table":
            DocumentProvider.from_table(table, "key")
        else:
            write, read = FILES[kind]
            write(table, tmp_path / "docs")
            read(tmp_path / "docs", "key")


@pytest.mark.parametrize("kind", ID_SOURCES)
def test_null_id_names_its_row(kind, tmp_path):
    ids = list(range(N))
    ids[17] = None
    table = _table().set_column(0, "id", pa.array(ids, pa.int64()))
    with pytest.raises(CompileError, match=r"id column 'id' has a null at row 17$"):
        _provider(kind, table, tmp_path)


@pytest.mark.parametrize("kind", ID_SOURCES)
def test_duplicate_id_names_the_first_repeat_and_where_it_was_first_seen(kind, tmp_path):
    ids = [f"d{i}" for i in range(N)]
    ids[12] = "d9"   # first repeat in row order
    ids[20] = "d2"   # an earlier value, repeated later
    table = _table().set_column(0, "id", pa.array(ids))
    with pytest.raises(CompileError, match=r"id column 'id' repeats the value 'd9' at row 12 \(first seen at row 9\)"):
        _provider(kind, table, tmp_path)


def test_duplicate_ids_found_across_batches():
    n = 200_000
    ids = pa.array(range(n), pa.int64())
    table = pa.table({"id": pa.concat_arrays([ids, pa.array([150_000], pa.int64())])})
    with pytest.raises(CompileError, match=r"repeats the value 150000 at row 200000 \(first seen at row 150000\)"):
        DocumentProvider.from_table(table, "id")


def test_construction_reads_only_the_id_column(tmp_path):
    table = _table().append_column("broken", pa.array([None] * N, pa.string()))
    provider = _provider("parquet", table, tmp_path)
    assert provider.num_rows == N


def test_identity_of_tables_follows_content_not_chunking():
    table = _table()
    rechunked = pa.Table.from_batches(table.to_batches(max_chunksize=3))
    same = DocumentProvider.from_table(table, "id")
    assert same.identity == DocumentProvider.from_table(rechunked, "id").identity
    assert same.identity == DocumentProvider.from_dataset(ds.dataset(table), "id").identity
    changed = table.set_column(1, "body", pa.array(["other"] * N))
    assert DocumentProvider.from_table(changed, "id").identity != same.identity
    assert DocumentProvider.from_table(table.slice(0, N - 1), "id").identity != same.identity


@pytest.mark.parametrize("kind", list(FILES))
def test_identity_of_files_changes_when_the_file_changes(kind, tmp_path):
    write, read = FILES[kind]
    path = tmp_path / f"docs.{kind}"
    write(_table(), path)
    first = read(path, "id")
    before = first.identity
    assert read(path, "id").identity == before
    write(_table(N + 1), path)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert read(path, "id").identity != before
    assert first.identity != before  # the provider read its file again


def test_empty_table():
    provider = DocumentProvider.from_table(_table(0), "id")
    assert provider.num_rows == 0
    assert list(provider.scan(["body"])) == []
    assert provider.to_table(["body"]).num_rows == 0


def test_bad_arguments():
    provider = DocumentProvider.from_table(_table(), "id")
    with pytest.raises(ValueError, match="batch_rows"):
        provider.scan(["body"], batch_rows=0)
    with pytest.raises(TypeError, match="pyarrow"):
        DocumentProvider.from_table({"id": [1]}, "id")
    with pytest.raises(FileNotFoundError, match=r"nowhere\.parquet"):
        DocumentProvider.from_parquet("nowhere.parquet", "id")
