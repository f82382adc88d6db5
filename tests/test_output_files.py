"""`quail query --output`: the destination is checked before the model runs, and a failed write loses nothing."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import quail.query_cli
import quail.runtime.coordinator
from quail.cli import main

REVIEWS = pa.table({"id": [1, 2, 3], "body": ["great acting", "dull plot", "the acting shines"]})
FILTER = "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Does {0} mention \"acting\"?', r.body))"
PREVIOUS = '[{"r.id": "the previous run"}]\n'


@pytest.fixture
def reviews(tmp_path):
    path = tmp_path / "reviews.parquet"
    pq.write_table(REVIEWS, path)
    return path


@pytest.fixture
def no_model_work(monkeypatch):
    """A query that reaches the model fails the test: a bad destination must be refused before."""

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the model ran before the output destination was checked")

    monkeypatch.setattr(quail.runtime.coordinator.Query, "run", refuse)


def query(capsys, reviews: Path, output: str) -> tuple[int, str]:
    code = main(["query", FILTER, "--table", f"reviews={reviews}", "--output", output,
                 "--backend", "example-keyword", "--no-progress"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("where", "message"), [
    ("missing/rows.json", "does not exist"),
    ("a-directory.json", "is a directory"),
    ("a-file/rows.json", "is not a directory"),
])
def test_a_destination_that_cannot_be_written_is_refused_before_the_model_runs(
        tmp_path, reviews, capsys, no_model_work, where, message):
    (tmp_path / "a-directory.json").mkdir()
    (tmp_path / "a-file").write_text("")
    code, err = query(capsys, reviews, str(tmp_path / where))
    assert code == 2 and message in err and "Traceback" not in err


def test_a_destination_in_proc_is_refused_before_the_model_runs(reviews, capsys, no_model_work):
    code, err = query(capsys, reviews, "/proc/self/rows.json")
    assert code == 2 and "cannot create a file" in err and "Traceback" not in err


def test_a_write_that_fails_midway_keeps_the_previous_file_and_leaves_no_temporary(
        tmp_path, reviews, capsys, monkeypatch):
    target = tmp_path / "rows.json"
    target.write_text(PREVIOUS)

    def disk_full(table: pa.Table, path: Path, suffix: str) -> None:
        path.write_text('[{"r.id": 1},')  # half the rows, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(quail.query_cli, "write_output", disk_full)
    code, err = query(capsys, reviews, str(target))
    assert code == 2 and "No space left on device" in err and "unchanged" in err
    assert target.read_text() == PREVIOUS
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reviews.parquet", "rows.json"]


def test_a_successful_write_replaces_the_file_and_keeps_its_permissions(tmp_path, reviews, capsys):
    target = tmp_path / "rows.json"
    target.write_text(PREVIOUS)
    target.chmod(0o640)
    code, _ = query(capsys, reviews, str(target))
    assert code == 0
    assert sorted(row["id"] for row in json.loads(target.read_text())) == [1, 3]
    assert target.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reviews.parquet", "rows.json"]


def test_a_file_size_limit_reached_midway_keeps_the_previous_file(tmp_path):
    """A real RLIMIT_FSIZE (`ulimit -f`): the kernel refuses the write past the limit."""
    target = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"previous": [1, 2, 3]}), target)
    script = textwrap.dedent(f"""
        import resource, sys
        from pathlib import Path
        import pyarrow as pa
        from quail.errors import UsageError
        from quail.outputs import OutputTarget
        from quail.query_cli import write_output

        target = OutputTarget.checked(Path({str(target)!r}))
        big = pa.table({{"text": ["x" * 1000 + str(i) for i in range(5000)]}})
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
        try:
            target.write(big, write_output)
        except UsageError as error:
            print(error)
            sys.exit(2)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert result.returncode == 2, result.stderr
    assert "writing failed" in result.stdout and "unchanged" in result.stdout
    assert pq.read_table(target).column_names == ["previous"]
    assert [p.name for p in tmp_path.iterdir()] == ["rows.parquet"]
