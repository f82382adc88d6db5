"""Ctrl-C and SIGTERM on the command line: exit 128 + n, no traceback, no files left in TMPDIR.

Each test's process signals itself at a chosen moment (while pyarrow loads, while the model works),
so the moment is exact; the signal itself is real and goes through the real handlers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quail.data.database import translated
from quail.errors import CompileError
from quail.interrupts import Terminated

REVIEWS = pa.table({"id": [1, 2, 3], "body": ["great acting", "dull plot", "the acting shines"]})
FILTER = "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Does {0} mention \"acting\"?', r.body))"


def run_script(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(body)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120, check=False, preexec_fn=ctrl_c_as_in_a_terminal)


def ctrl_c_as_in_a_terminal() -> None:
    """A child whose Ctrl-C behaves as in a terminal, even when the tests run as a background job (which
    starts with SIGINT ignored, a disposition children inherit and Quail rightly respects)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_while_the_libraries_load_exits_130_without_a_traceback(tmp_path):
    result = run_script(tmp_path, """
        import importlib.abc, os, signal, sys

        class CtrlCWhilePyarrowLoads(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == "pyarrow":
                    os.kill(os.getpid(), signal.SIGINT)
                return None

        sys.meta_path.insert(0, CtrlCWhilePyarrowLoads())
        from quail.cli import main
        sys.exit(main(["backends"]))
    """)
    assert result.returncode == 130, result.stderr
    assert "interrupted" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(("signal_number", "code", "word"), [
    (signal.SIGINT, 130, "interrupted"),
    (signal.SIGTERM, 128 + signal.SIGTERM, "terminated"),
])
def test_a_signal_while_the_model_works_cleans_up_and_exits_128_plus_n(tmp_path, signal_number, code, word):
    pq.write_table(REVIEWS, tmp_path / "reviews.parquet")
    (tmp_path / "rows.json").write_text("previous rows\n")
    result = run_script(tmp_path, f"""
        import os, sys, time
        import quail.serving.runner

        def signalled_midway(self, *args, **kwargs):
            assert any(os.scandir(os.environ["TMPDIR"])), "the session has written its token files"
            os.kill(os.getpid(), {int(signal_number)})
            time.sleep(30)

        quail.serving.runner.Runner.run = signalled_midway
        from quail.cli import main
        sys.exit(main(["query", {FILTER!r}, "--table", "reviews=reviews.parquet", "--output", "rows.json",
                       "--backend", "example-keyword", "--no-progress"]))
    """)
    assert result.returncode == code, result.stderr
    assert word in result.stderr and "Traceback" not in result.stderr
    assert list((tmp_path / "tmpdir").iterdir()) == []
    assert (tmp_path / "rows.json").read_text() == "previous rows\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reviews.parquet", "rows.json", "tmpdir"]


@pytest.mark.parametrize("interruption", [KeyboardInterrupt(), Terminated(15)], ids=["ctrl-c", "sigterm"])
def test_a_signal_landing_while_duckdb_reads_python_data_is_that_signal_not_an_error_in_the_sql(interruption):
    """DuckDB runs Python code while it reads a registered Arrow object and reports an exception raised
    there as an input error: a Ctrl-C / SIGTERM that lands there must stay the interruption it was (the
    command line exits 130 / 143), not become a CompileError (exit 2, "fix your SQL")."""
    schema = pa.schema([("id", pa.int64())])

    def batches():
        yield pa.record_batch([pa.array([1, 2])], schema=schema)
        raise interruption

    connection = duckdb.connect()
    connection.register("answers", pa.RecordBatchReader.from_batches(schema, batches()))
    with pytest.raises(type(interruption)) as raised, translated():
        connection.sql("SELECT * FROM answers").fetchall()
    if isinstance(interruption, Terminated):
        assert raised.value.signal_number == 15


def test_a_python_error_inside_duckdb_is_still_a_compile_error_naming_it():
    schema = pa.schema([("id", pa.int64())])

    def batches():
        yield pa.record_batch([pa.array([1])], schema=schema)
        raise ValueError("the answers file is truncated")

    connection = duckdb.connect()
    connection.register("answers", pa.RecordBatchReader.from_batches(schema, batches()))
    with pytest.raises(CompileError, match="the answers file is truncated"), translated():
        connection.sql("SELECT * FROM answers").fetchall()


NEVER_ENDING = ("WITH RECURSIVE counter(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM counter) "
                "SELECT r.id, (SELECT count(*) FROM counter) AS c "
                "FROM reviews r WHERE AI_FILTER(PROMPT('Does {0} mention \"acting\"?', r.body))")


def _start_never_ending_query(tmp_path: Path, scratch: Path) -> subprocess.Popen[str]:
    """`quail query` whose relational part never ends; it touches `tail-started` once DuckDB runs it."""
    script = f"""
        import sys
        from pathlib import Path
        import quail.data.database as database

        original = database.Database.run
        def announced(self, *args, **kwargs):
            Path("tail-started").touch()
            return original(self, *args, **kwargs)
        database.Database.run = announced
        from quail.cli import main
        sys.exit(main(["query", {NEVER_ENDING!r}, "--table", "reviews=reviews.parquet",
                       "--backend", "example-keyword", "--no-progress", "--cache", "off"]))
    """
    env = {**os.environ, "TMPDIR": str(scratch), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            preexec_fn=ctrl_c_as_in_a_terminal)


@pytest.mark.slow
@pytest.mark.parametrize(("signal_number", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)],
                         ids=["sigint", "sigterm"])
def test_a_never_ending_relational_part_stops_on_a_signal_within_2_s_ten_times_in_ten(tmp_path, signal_number,
                                                                                      code):
    import time

    pq.write_table(REVIEWS, tmp_path / "reviews.parquet")
    outcomes = []
    for attempt in range(10):
        scratch = tmp_path / f"tmpdir{attempt}"
        scratch.mkdir()
        marker = tmp_path / "tail-started"
        marker.unlink(missing_ok=True)
        process = _start_never_ending_query(tmp_path, scratch)
        try:
            deadline = time.monotonic() + 60
            while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert marker.exists(), process.communicate(timeout=10)
            time.sleep(0.3)  # well inside DuckDB's never-ending query
            signalled = time.monotonic()
            process.send_signal(signal_number)
            _, err = process.communicate(timeout=30)
            took = time.monotonic() - signalled
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        outcomes.append((process.returncode, round(took, 2), "Traceback" in err, sorted(os.listdir(scratch)),
                         err[-600:]))
    assert all(rc == code and took < 2.0 and not traceback and left == []
               for rc, took, traceback, left, _ in outcomes), outcomes
