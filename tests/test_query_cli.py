"""`quail query`: every option, and the exit codes (0 success, 2 user error, 1 internal error)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from quail.cli import main

REVIEWS = pa.table({
    "id": [11, 12, 13, 14],
    "body": ["The acting was superb", "a boring plot", "great acting, weak plot", "lovely music"],
})
ASPECTS = pa.table({"key": [1, 2], "aspect": ["acting", "plot"]})
FILTER = "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Does {0} mention \"acting\"?', r.body))"
JOIN = ("SELECT r.id, a.aspect FROM reviews r JOIN aspects a "
        "ON AI_FILTER(PROMPT('Does {0} discuss {1}?', r.body, a.aspect))")
BACKEND = ["--backend", "example-keyword", "--no-progress"]


@pytest.fixture
def files(tmp_path):
    pq.write_table(REVIEWS, tmp_path / "reviews.parquet")
    pa_csv.write_csv(REVIEWS, tmp_path / "reviews.csv")
    (tmp_path / "reviews.jsonl").write_text("".join(json.dumps(r) + "\n" for r in REVIEWS.to_pylist()))
    pq.write_table(ASPECTS, tmp_path / "aspects.parquet")
    return tmp_path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["query", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("name", ["reviews.parquet", "reviews.csv", "reviews.jsonl"])
def test_runs_sql_over_each_file_format_and_prints_rows_and_report(files, capsys, name):
    code, out, _ = run(capsys, FILTER, "--table", f"reviews={files / name}", *BACKEND)
    assert code == 0
    assert out.startswith("id\n") and "11" in out and "13" in out and "12" not in out.split("-- report --")[0]
    assert "-- report --" in out and "backend: example-keyword" in out


def test_reads_the_query_from_a_file_and_takes_an_id_column(files, capsys):
    (files / "q.sql").write_text(JOIN)
    code, out, _ = run(capsys, "--file", str(files / "q.sql"), "--table", f"reviews={files / 'reviews.parquet'}",
                       "--table", f"aspects={files / 'aspects.parquet'}:key", *BACKEND)
    assert code == 0 and "acting" in out


def test_bigquery_dialect_and_order_option(files, capsys):
    sql = FILTER.replace("AI_FILTER", "AI.IF")
    code, out, _ = run(capsys, sql, "--dialect", "bigquery", "--order", "as_written",
                       "--table", f"reviews={files / 'reviews.parquet'}", *BACKEND)
    assert code == 0 and "order_rule: as_written" in out


def test_explain_prints_the_plan_and_runs_nothing(files, capsys):
    code, out, _ = run(capsys, FILTER, "--explain", "--table", f"reviews={files / 'reviews.parquet'}", *BACKEND)
    assert code == 0
    assert "== Logical plan" in out and "== Physical plan" in out and "-- report --" not in out


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".json", ".jsonl"])
def test_output_writes_the_rows(files, capsys, suffix):
    target = files / f"out{suffix}"
    code, out, _ = run(capsys, FILTER, "--table", f"reviews={files / 'reviews.parquet'}", "--output", str(target),
                       *BACKEND)
    assert code == 0 and f"wrote 2 rows to {target}" in out
    if suffix == ".parquet":
        assert sorted(pq.read_table(target).column("id").to_pylist()) == [11, 13]
    elif suffix == ".csv":
        assert sorted(pa_csv.read_csv(target).column("id").to_pylist()) == [11, 13]
    elif suffix == ".json":
        assert sorted(row["id"] for row in json.loads(target.read_text())) == [11, 13]
    else:
        assert sorted(json.loads(line)["id"] for line in target.read_text().splitlines()) == [11, 13]


def test_model_and_device_options_select_the_engine(files, capsys):
    code, out, _ = run(capsys, FILTER, "--model", "qwen3-0.6b", "--device", "cpu",
                       "--table", f"reviews={files / 'reviews.parquet'}", *BACKEND)
    assert code == 0 and "model: qwen3-0.6b" in out


def test_progress_bar_is_drawn_on_stderr(files, capsys):
    code, _, err = run(capsys, FILTER, "--table", f"reviews={files / 'reviews.parquet'}", "--backend",
                       "example-keyword")
    assert code == 0 and "AiFilter r" in err and "4/4" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["SELECT 1 UNION SELECT 2 UNION"], "syntax error"),
    (["SELECT * FROM nowhere n WHERE AI_FILTER(PROMPT('{0}', n.x))"], "unknown table 'nowhere'"),
    ([FILTER, "--table", "reviews"], "write name=path[:id_col]"),
    ([FILTER, "--table", "reviews=/no/such/file.parquet"], "no file or directory"),
    ([FILTER, "--file", "/no/such/query.sql"], "--file"),
    ([], "either as an argument or with --file"),
    ([FILTER, "--output", "rows.xlsx"], "--output"),
    ([FILTER, "--backend", "nope"], "unknown backend 'nope'"),
    ([FILTER, "--compute", "nope"], "unknown compute provider 'nope'"),
    ([FILTER, "--compute", "ray", "--workers", "0"], "--workers must be None or at least 1, got 0"),
    ([FILTER, "--embedding-model", "gemma-3-270m"], "(--embedding-model) 'gemma-3-270m' is not an embedding model"),
    ([FILTER, "--model", "all-minilm-l6-v2"], "is an embedding model"),
])
@pytest.mark.plugins
def test_user_errors_exit_2_with_a_message_and_no_traceback(files, capsys, argv, message):
    code, _, err = run(capsys, *argv, "--no-progress")
    assert code == 2
    assert message in err and "Traceback" not in err


def test_an_internal_error_exits_1_with_the_traceback(files, capsys, monkeypatch):
    import quail.query_cli

    def broken(*_args: object) -> None:
        raise RuntimeError("a bug inside quail")

    monkeypatch.setattr(quail.query_cli, "write_output", broken)
    code, _, err = run(capsys, FILTER, "--table", f"reviews={files / 'reviews.parquet'}",
                       "--output", str(files / "o.csv"), *BACKEND)
    assert code == 1
    assert "internal error" in err and "a bug inside quail" in err and "Traceback" in err


def test_reads_a_table_of_a_duckdb_database(files, capsys):
    import duckdb

    database = files / "films.duckdb"
    connection = duckdb.connect(str(database))
    connection.register("source", REVIEWS)
    connection.execute("CREATE TABLE critics AS SELECT * FROM source")
    connection.close()
    sql = FILTER.replace("WHERE", "WHERE r.id > 11 AND")
    code, out, _ = run(capsys, sql, "--table", f"reviews={database}:critics", *BACKEND)
    assert code == 0
    rows = out.split("-- report --")[0]
    assert "13" in rows and "11" not in rows.replace("r.id", "")


@pytest.mark.plugins
def test_a_duckdb_database_without_a_table_name_is_a_user_error(files, capsys):
    import duckdb

    duckdb.connect(str(files / "films.duckdb")).close()
    code, _, err = run(capsys, FILTER, "--table", f"reviews={files / 'films.duckdb'}", "--no-progress")
    assert code == 2 and "is a DuckDB database" in err and "Traceback" not in err


def test_model_aliases_name_the_models_a_statement_may_use(files, capsys):
    sql = "SELECT r.id, AI_COMPLETE('llama3.1-8b', PROMPT('Summarize {0}', r.body)) AS s FROM reviews r"
    table = ["--table", f"reviews={files / 'reviews.parquet'}", *BACKEND, "--model", "gemma-3-270m", "--explain"]
    code, out, _ = run(capsys, sql, *table, "--model-alias", "llama3.1-8b=qwen2.5-coder-0.5b-instruct")
    assert code == 0 and "model 'llama3.1-8b' stands for qwen2.5-coder-0.5b-instruct" in out
    assert "model qwen2.5-coder-0.5b-instruct;" in out
    code, _, err = run(capsys, sql, *table)
    assert code == 2 and "--model-alias llama3.1-8b=gemma-3-270m" in err
    with pytest.raises(SystemExit) as exited:
        run(capsys, sql, *table, "--model-alias", "llama3.1-8b")
    assert exited.value.code == 2 and "write NAME=MODEL" in capsys.readouterr().err
    code, _, err = run(capsys, sql, *table, "--model-alias", "llama3.1-8b=nothing")
    assert code == 2 and "'llama3.1-8b' stands for 'nothing', which is not one of Quail's models" in err
