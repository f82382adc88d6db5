"""The answer store on the keyword backend: answers are never paid for twice, and never wrong.

Every corpus query gives the rows of an uncached run when its answers are computed and stored,
and again when they are all read back; changing the SELECT list computes nothing; an added filter
computes only its own prompts; a stored FALSE drops its document before model work; identical
prompts are computed once; answers are committed per backend call, so an interrupted query
resumes; a store that is corrupt or locked degrades to computing; the planner prices stored
answers at zero. (Real models, new processes and kill -9: packages/quail-native/tests/test_native_answer_store.py.)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.cases import ACTING, CASES, RECOMMEND, WORTH, Case, assert_matches_oracle, sql_prompt
from support.e2e_data import TABLES, arrow_table, normalized

import quail
from quail.backends.base import GpuContext, ModelIdentity, NodeInputs, NodeOutput
from quail.cache import STORE_ENVIRONMENT, AnswerStore, AnswerStoreWarning, store
from quail.cache.identity import digest
from quail.cache.keys import Keys
from quail.cache.store import Answer
from quail.catalog.devices import DeviceSpec
from quail.catalog.models import ModelSpec
from quail.cli import main
from quail.config import EngineConfig
from quail.physical import nodes as ph
from quail.testing import BASE_MODEL, ByteTokenizer, KeywordBackend
from quail.testing.backend import KeywordExecution

TOKENIZER = ByteTokenizer()


def keyword_session(cache: str = "auto", tables: dict[str, pa.Table] | None = None,
                    backend: KeywordBackend | None = None, **fields: Any) -> quail.Session:
    """A keyword session on this test's own store (the autouse fixture names it) or with `cache` as given."""
    registry = quail.ExtensionRegistry.with_built_ins()
    chosen = backend or KeywordBackend(TOKENIZER)
    registry.register_backend(chosen)
    session = quail.Session(quail.EngineConfig(model=BASE_MODEL, backend=chosen.name, cache=cache, **fields),
                            registry=registry,
                            tokenizer=TOKENIZER)
    for name, (_, id_column) in TABLES.items():
        table = (tables or {}).get(name, arrow_table(name))
        session.register(name, quail.DocumentProvider.from_table(table, id_column))
    return session


def run(sql: str, cache: str = "auto", order: str | None = None, **fields: Any) -> quail.QueryResult:
    with keyword_session(cache, **fields) as session:
        return session.sql(sql, order=order).run()


def answer_sets(result: quail.QueryResult) -> dict[str, Counter[tuple[Any, ...]]]:
    return {node: Counter(json.dumps(row, sort_keys=True) for row in table.to_pylist())
            for node, table in result.answer_tables.items()}


def node_of(query: quail.Query, kind: type[ph.PhysicalNode]) -> ph.PhysicalNode:
    [node] = [n for n in query.plan().graph.nodes if isinstance(n, kind)]
    return node


FILTER = f"SELECT r.id FROM reviews r WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')})"
TWO_FILTERS = (f"SELECT r.id FROM reviews r WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')}) "
               f"AND AI_FILTER({sql_prompt(RECOMMEND, 'r.body')})")


# -- the same rows whether answers are computed, stored or read back ------------------------------------------


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_every_corpus_query_gives_the_oracle_rows_cold_and_warm_and_reads_everything_back(case: Case):
    with keyword_session() as cold_session:
        cold = case.query(cold_session).run()
    with keyword_session() as warm_session:
        warm = case.query(warm_session).run()
    for result in (cold, warm):
        assert_matches_oracle(result.collect(), case.oracle)
    assert warm.report["fresh_tokens"] == 0
    assert warm.report["answers"]["computed"] == 0
    assert warm.report["answers"]["stored"] == cold.report["answers"]["computed"] + cold.report["answers"]["duplicates"]
    assert answer_sets(warm) == answer_sets(cold), "stored answers are the computed ones, margins included"


def test_changing_only_the_select_list_computes_nothing():
    run(FILTER)
    other = run(FILTER.replace("SELECT r.id", "SELECT r.title, r.stars"))
    assert other.report["fresh_tokens"] == 0 and other.report["answers"]["computed"] == 0
    assert other.count() == run(FILTER, cache="off").count()


def prompt_tokens(result: quail.QueryResult, query: quail.Query, position: int) -> int:
    """Σ prompt length of the answers a filter stage gave (the keyword backend counts exactly these)."""
    node = node_of(query, ph.AiFilter)
    assert isinstance(node, ph.AiFilter)
    [stage] = [k for k, s in enumerate(node.stages) if s.predicate.position == position]
    bodies = arrow_table("reviews").column("body").to_pylist()
    table = result.answer_tables[node.id]
    rows = [r for r, p in zip(table.column("r").to_pylist(), table.column("predicate").to_pylist(), strict=True)
            if p == position]
    return sum(len(node.prompt(tuple(TOKENIZER.encode(bodies[r])), stage)) for r in rows)


def test_adding_a_filter_computes_only_that_filters_prompts():
    first = run(FILTER)
    with keyword_session() as session:
        query = session.sql(TWO_FILTERS)
        second = query.run()
    acting_true = sum(first.answer_tables["filter_r"].column("answer").to_pylist())
    metrics = second.report["node_metrics"]["filter_r"]
    assert metrics["stored_answers"] == first.report["answers"]["computed"]
    assert metrics["computed_answers"] == acting_true, "the new filter asks only the documents the stored one keeps"
    assert second.report["fresh_tokens"] == prompt_tokens(second, query, 1) > 0
    assert second.collect().equals(run(TWO_FILTERS, cache="off").collect())


def test_a_stored_false_drops_its_document_before_any_model_work():
    recommend = f"SELECT r.id FROM reviews r WHERE AI_FILTER({sql_prompt(RECOMMEND, 'r.body')})"
    stored = run(recommend).answer_tables["filter_r"]
    falses = {r for r, a in zip(stored.column("r").to_pylist(), stored.column("answer").to_pylist(), strict=True)
              if not a}
    assert falses, "the corpus has documents the stored filter rejects"
    with keyword_session() as session:
        query = session.sql(TWO_FILTERS, order="as_written")  # the stored filter is written (and runs) second
        result = query.run()
    table = result.answer_tables["filter_r"]
    asked = {r for r, p in zip(table.column("r").to_pylist(), table.column("predicate").to_pylist(), strict=True)
             if p == 0}
    assert not asked & falses, "no document with a stored FALSE was asked the other filter"
    assert result.report["fresh_tokens"] == prompt_tokens(result, query, 0)
    assert result.collect().equals(run(TWO_FILTERS, cache="off", order="as_written").collect())


def test_calibrated_answers_read_back_with_their_stored_offsets():
    cold = run(TWO_FILTERS, calibration="on")
    warm = run(TWO_FILTERS, calibration="on")
    assert warm.report["fresh_tokens"] == 0
    assert warm.report["calibration"] == cold.report["calibration"] and cold.report["calibration"]
    assert warm.collect().equals(run(TWO_FILTERS, cache="off", calibration="on").collect())


# -- identical prompts are computed once -----------------------------------------------------------------------


def distinct_reviews(count: int) -> pa.Table:
    """`count` reviews: the corpus's, again and again, each copy with a suffix of its own."""
    reviews = arrow_table("reviews")
    table = reviews.take([i % reviews.num_rows for i in range(count)])
    bodies = [f"{body} (copy {i})" for i, body in enumerate(table.column("body").to_pylist())]
    table = table.set_column(table.schema.get_field_index("body"), "body", pa.array(bodies))
    ids = pa.array(range(count), table.schema.field("id").type)
    return table.set_column(table.schema.get_field_index("id"), "id", ids)


def doubled(name: str, id_column: str) -> pa.Table:
    """Every row twice, the copy under a new id."""
    table = arrow_table(name)
    copy = table.set_column(table.schema.get_field_index(id_column), id_column,
                            pa.array([v + 1000 for v in table.column(id_column).to_pylist()]))
    return pa.concat_tables([table, copy])


@pytest.mark.parametrize("cache", ["auto", "off"])
def test_duplicate_documents_are_computed_once(cache, tmp_path):
    single = run(TWO_FILTERS, cache=str(tmp_path / "other.sqlite") if cache == "auto" else "off")
    with keyword_session(cache, tables={"reviews": doubled("reviews", "id")}) as session:
        twice = session.sql(TWO_FILTERS).run()
    assert twice.report["fresh_tokens"] == single.report["fresh_tokens"]
    assert twice.report["answers"]["duplicates"] == single.report["answers"]["computed"]
    ids = sorted(twice.collect().column("id").to_pylist())
    assert ids == sorted([*single.collect().column("id").to_pylist(),
                          *(i + 1000 for i in single.collect().column("id").to_pylist())])


JOIN = ("SELECT r.id, a.aspect_id FROM reviews r JOIN aspects a "
        "ON AI_FILTER(PROMPT('Does the review {0} discuss {1}?', r.body, a.aspect))")
EXISTS = ("SELECT r.id FROM reviews r WHERE EXISTS (SELECT 1 FROM aspects a WHERE "
          "AI_FILTER(PROMPT('Does the review {0} discuss {1}?', r.body, a.aspect)))")


@pytest.mark.parametrize("sql", [JOIN, EXISTS], ids=["full", "exists"])
def test_repeated_join_tuples_are_computed_once_and_rows_follow_the_duplicates(sql):
    single = run(sql, cache="off")
    tables = {"reviews": doubled("reviews", "id"), "aspects": doubled("aspects", "aspect_id")}
    with keyword_session("off", tables=tables) as session:
        twice = session.sql(sql).run()
    assert twice.report["fresh_tokens"] <= single.report["fresh_tokens"]
    assert twice.report["answers"]["duplicates"] > 0

    def originals(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return normalized([tuple(v % 1000 for v in row.values()) for row in rows])

    expected = Counter(originals(single.to_rows()))
    copies = 4 if sql is JOIN else 2  # each pair appears once per copy of each side
    assert Counter(originals(twice.to_rows())) == Counter({row: n * copies for row, n in expected.items()})


# -- committed per call: an interrupted query resumes --------------------------------------------------------


class FailingExecution(KeywordExecution):
    """The keyword rule, failing on its `fail_at`-th backend call (a crash after some committed batches)."""

    def __init__(self, tokenizer: ByteTokenizer, fail_at: int) -> None:
        super().__init__(tokenizer)
        self.calls = 0
        self.fail_at = fail_at

    def execute(self, node: ph.PhysicalNode, inputs: NodeInputs) -> NodeOutput:
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("the engine died")
        return super().execute(node, inputs)


class FailingKeywordBackend(KeywordBackend):
    """Same name and identity as the keyword backend: it stores answers the plain one reads."""

    def start(self, context: GpuContext) -> FailingExecution:
        return FailingExecution(self._tokenizer, fail_at=4)


def test_answers_are_committed_per_backend_call_so_an_interrupted_query_resumes():
    quail.release_engines()
    tables = {"reviews": distinct_reviews(100)}
    full = run(TWO_FILTERS, cache="off", chunk_tokens=256, tables=tables)
    with keyword_session(backend=FailingKeywordBackend(TOKENIZER), chunk_tokens=256, tables=tables) as session, \
            pytest.raises(RuntimeError, match="the engine died"):
        session.sql(TWO_FILTERS).run()
    quail.release_engines()
    resumed = run(TWO_FILTERS, chunk_tokens=256, tables=tables)
    answers = resumed.report["answers"]
    assert answers["stored"] > 0 and answers["computed"] > 0, "three calls were committed before the failure"
    assert 0 < resumed.report["fresh_tokens"] < full.report["fresh_tokens"]
    assert resumed.collect().equals(full.collect())
    assert answer_sets(resumed) == answer_sets(full)


class ShapelessExecution(KeywordExecution):
    """Answers without the raw margin: not the standard shape."""

    def execute(self, node: ph.PhysicalNode, inputs: NodeInputs) -> NodeOutput:
        output = super().execute(node, inputs)
        return NodeOutput({"answers": output.tables["answers"].drop_columns(["margin"])}, output.metrics)


class ShapelessBackend(KeywordBackend):
    name = "shapeless"

    def start(self, context: GpuContext) -> ShapelessExecution:
        return ShapelessExecution(self._tokenizer)


def test_a_backend_answering_in_the_wrong_shape_is_a_clear_error_and_stores_nothing():
    with keyword_session(backend=ShapelessBackend(TOKENIZER)) as session, \
            pytest.raises(RuntimeError, match="AiFilter 'filter_r' with a table of the wrong shape: expected a 'ma"):
        session.sql(FILTER).run()
    with sqlite3.connect(os.environ[STORE_ENVIRONMENT]) as db:
        assert db.execute("SELECT count(*) FROM answers").fetchone()[0] == 0


def test_the_process_provider_stores_where_the_local_one_reads():
    quail.release_engines()
    query = EXISTS
    config = quail.EngineConfig(backend="example-keyword", compute="process")
    with quail.Session(config, tokenizer=TOKENIZER) as remote:
        for name, (_, id_column) in TABLES.items():
            remote.register(name, quail.DocumentProvider.from_table(arrow_table(name), id_column))
        cold = remote.sql(query).run()
    with quail.Session(quail.EngineConfig(backend="example-keyword"), tokenizer=TOKENIZER) as local:
        for name, (_, id_column) in TABLES.items():
            local.register(name, quail.DocumentProvider.from_table(arrow_table(name), id_column))
        warm = local.sql(query).run()
    quail.release_engines()
    assert cold.report["fresh_tokens"] > 0 and warm.report["fresh_tokens"] == 0
    assert warm.collect().equals(cold.collect())


# -- what is keyed: the model's identity --------------------------------------------------------------------


class AnonymousBackend(KeywordBackend):
    """A backend that cannot say what its answers depend on."""

    name = "anonymous"

    def model_identity(self, model: ModelSpec, device: DeviceSpec, config: EngineConfig) -> None:
        return None


def test_a_backend_without_an_identity_stores_nothing():
    for _ in range(2):
        with keyword_session(backend=AnonymousBackend(TOKENIZER)) as session:
            result = session.sql(FILTER).run()
        assert result.report["fresh_tokens"] > 0
        assert result.report["answers"]["stored"] is None
    assert not Path(os.environ[STORE_ENVIRONMENT]).exists()


def test_identities_follow_file_contents_and_settings_not_paths(tmp_path):
    one, same, other = (tmp_path / d / "w.safetensors" for d in "abc")
    for path, content in ((one, b"weights"), (same, b"weights"), (other, b"other weights")):
        path.parent.mkdir()
        path.write_bytes(content)
    opened = AnswerStore.open(tmp_path / "s.sqlite", 100)
    fp32 = (("precision", "fp32"),)
    try:
        base = digest("native", ModelIdentity((one,), fp32), opened)
        assert digest("native", ModelIdentity((same,), fp32), opened) == base
        assert digest("native", ModelIdentity((other,), fp32), opened) != base
        assert digest("native", ModelIdentity((one,), (("precision", "bf16"),)), opened) != base
        assert digest("vllm", ModelIdentity((one,), fp32), opened) != base
        one.write_bytes(b"new weights!")  # same path, new content (and size): hashed again
        assert digest("native", ModelIdentity((one,), fp32), opened) != base
    finally:
        opened.close()


def test_a_process_hashes_each_file_version_once_whichever_store_asks(tmp_path, monkeypatch):
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"weights one")
    hashed: list[str] = []
    real_file_digest = hashlib.file_digest

    def counting_file_digest(handle, algorithm):
        hashed.append(handle.name)
        return real_file_digest(handle, algorithm)

    monkeypatch.setattr(hashlib, "file_digest", counting_file_digest)
    identity = ModelIdentity((weights,), (("precision", "fp32"),))
    first, second = (AnswerStore.open(tmp_path / f"{name}.sqlite", 100) for name in ("first", "second"))
    try:
        before = digest("native", identity, first)
        assert digest("native", identity, second) == before
        assert len(hashed) == 1, "a second store in the same process reuses the digest"
        status = weights.stat()
        weights.write_bytes(b"weights two")  # same size, new content: a new version by its mtime
        os.utime(weights, ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000))
        assert digest("native", identity, second) != before
        assert len(hashed) == 2
    finally:
        first.close()
        second.close()


# -- the store itself ---------------------------------------------------------------------------------------


def test_readouts_round_trip_bit_for_bit_and_keys_hash_prompts_in_pieces(tmp_path):
    keys = Keys("model")
    prompt = tuple(range(300, 340))
    assert keys.prompt("margin", prompt[:10]).then(prompt[10:25]).then(prompt[25:]).key() == keys.margin(prompt)
    assert keys.margin(prompt) != Keys("other").margin(prompt)
    assert keys.labels(prompt, [(1, 2), (3,)]) != keys.labels(prompt, [(1,), (2, 3)])
    values = [(0.1 + 0.2,), (-0.0,), (math.pi, -1e-300, 5e300), (math.nextafter(1.0, 2.0),)]
    answers = [Answer(keys.margin((i,)), "labels", v) for i, v in enumerate(values)]
    opened = AnswerStore.open(tmp_path / "s.sqlite", 100)
    try:
        opened.put("model", "a model", answers)
        found = opened.get([a.key for a in answers])
    finally:
        opened.close()
    for answer in answers:
        assert [struct_bits(x) for x in found[answer.key]] == [struct_bits(x) for x in answer.value]


def struct_bits(value: float) -> bytes:
    return pa.array([value], pa.float64()).buffers()[1].to_pybytes()


def test_the_store_evicts_the_least_recently_used_answers_past_its_limit(tmp_path):
    keys = Keys("m")
    opened = AnswerStore.open(tmp_path / "s.sqlite", 10)
    try:
        opened.put("m", "m", [Answer(keys.margin((i,)), "margin", (float(i),)) for i in range(8)])
        opened.get([keys.margin((0,)), keys.margin((1,))])  # read: now the most recently used
        opened.put("m", "m", [Answer(keys.margin((i,)), "margin", (float(i),)) for i in range(8, 13)])
        kept = opened.get([keys.margin((i,)) for i in range(13)])
        stats = opened.stats()
    finally:
        opened.close()
    assert stats.answers == len(kept) <= 10
    assert keys.margin((0,)) in kept and keys.margin((1,)) in kept, "recently read answers are kept"
    assert keys.margin((2,)) not in kept, "the least recently used answer is evicted first"
    assert all(keys.margin((i,)) in kept for i in range(8, 13)), "the batch just written is kept"


def test_a_corrupt_store_warns_computes_the_right_rows_and_cli_clear_removes_it(capsys):
    path = Path(os.environ[STORE_ENVIRONMENT])
    run(TWO_FILTERS)
    damaged = path.read_bytes()
    path.write_bytes(damaged[:100] + b"this is not a database" * 200)  # Quail's header, its pages gone
    with pytest.warns(AnswerStoreWarning, match="malformed|not a database"):
        result = run(TWO_FILTERS)
    assert result.report["fresh_tokens"] > 0
    assert result.collect().equals(run(TWO_FILTERS, cache="off").collect())
    assert main(["cache", "stats"]) == 2
    assert "`quail cache clear` deletes it" in capsys.readouterr().err
    assert main(["cache", "clear"]) == 0
    assert "removed the unusable answer store" in capsys.readouterr().out
    run(TWO_FILTERS)
    assert run(TWO_FILTERS).report["fresh_tokens"] == 0, "a fresh store works again"


def _foreign_files(directory: Path) -> dict[str, Path]:
    """Files Quail did not make, at a path a user might give as the store."""
    text = directory / "notes.txt"
    text.write_text("my notes\n" * 50)
    other_app = directory / "app.sqlite"
    with sqlite3.connect(other_app) as db:
        db.execute("CREATE TABLE things (id INTEGER PRIMARY KEY, name TEXT)")
        db.execute("INSERT INTO things VALUES (1, 'one')")
        db.execute("PRAGMA user_version = 7")
    db.close()
    plain = directory / "plain.sqlite"
    with sqlite3.connect(plain) as db:  # user_version 0, no application id
        db.execute("CREATE TABLE answers (x)")
    db.close()
    look_alike = directory / "lookalike.sqlite"  # Quail's table names, another application's id
    with sqlite3.connect(look_alike) as db:
        for table in ("answers", "models", "files", "counts"):
            db.execute(f"CREATE TABLE {table} (x)")
        db.execute("PRAGMA user_version = 1")
        db.execute("PRAGMA application_id = 42")
    db.close()
    empty = directory / "empty.sqlite"
    empty.write_bytes(b"")
    return {"text": text, "other_app": other_app, "plain": plain, "look_alike": look_alike, "empty": empty}


@pytest.mark.parametrize("kind", ["text", "other_app", "plain", "look_alike", "empty"])
def test_cache_commands_and_queries_leave_a_file_quail_did_not_make_byte_identical(tmp_path, capsys, kind):
    path = _foreign_files(tmp_path)[kind]
    before = path.read_bytes()
    siblings = sorted(p.name for p in tmp_path.iterdir())
    for action in ("stats", "clear"):
        assert main(["cache", action, "--store", str(path)]) == 2
        err = capsys.readouterr().err
        assert str(path) in err and "not an answer store" in err and "clear` deletes" not in err
    with pytest.warns(AnswerStoreWarning, match="not an answer store"):
        result = run(FILTER, cache=str(path))
    assert result.collect().equals(run(FILTER, cache="off").collect())
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == siblings, "no journal, log or index left beside it"


def test_a_directory_given_as_the_store_is_refused_by_name(tmp_path, capsys):
    (tmp_path / "inside.txt").write_text("keep me")
    for action in ("stats", "clear"):
        assert main(["cache", action, "--store", str(tmp_path)]) == 2
        assert f"{tmp_path} is a directory, not an answer store" in capsys.readouterr().err
    assert (tmp_path / "inside.txt").read_text() == "keep me"


def test_a_store_of_an_older_quail_without_the_marker_is_kept_and_marked(tmp_path):
    path = tmp_path / "answers.sqlite"
    run(FILTER, cache=str(path))
    with sqlite3.connect(path) as db:  # what stores looked like before the marker
        db.execute("PRAGMA application_id = 0")
    db.close()
    assert run(FILTER, cache=str(path)).report["fresh_tokens"] == 0
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA application_id").fetchone()[0] == store.APPLICATION_ID
    db.close()


def test_a_new_store_leaves_no_temporary_file_and_two_openers_share_one(tmp_path):
    path = tmp_path / "answers.sqlite"
    first, second = AnswerStore.open(path, 10), AnswerStore.open(path, 10)
    first.close()
    second.close()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm"))) == ["answers.sqlite"]


def test_a_damaged_stored_value_is_computed_again_never_read_as_an_answer():
    run(FILTER)
    with sqlite3.connect(os.environ[STORE_ENVIRONMENT]) as db:  # flip a bit of every stored margin
        for key, value in db.execute("SELECT key, value FROM answers").fetchall():
            db.execute("UPDATE answers SET value = ? WHERE key = ?", (bytes([value[0] ^ 1]) + value[1:], key))
    with pytest.warns(AnswerStoreWarning, match="failed their checksum"):
        again = run(FILTER)
    assert again.report["answers"]["stored"] == 0 and again.report["fresh_tokens"] > 0
    assert answer_sets(again) == answer_sets(run(FILTER, cache="off"))
    assert run(FILTER).report["fresh_tokens"] == 0, "the damaged values were replaced by the recomputed ones"


def test_a_store_locked_by_another_writer_warns_and_computes(monkeypatch):
    monkeypatch.setattr(store, "BUSY_TIMEOUT_S", 0.2)
    run(FILTER)  # the store exists; another process now holds its write lock
    holder = sqlite3.connect(os.environ[STORE_ENVIRONMENT], isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.warns(AnswerStoreWarning, match="locked") as warned:
            result = run(TWO_FILTERS)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    said = " ".join(str(w.message) for w in warned)
    assert "another Quail process was writing" in said and "cache clear" not in said, (
        "no advice that would destroy the other writer's work")
    assert result.report["answers"]["stored"] > 0, "reads go on under another writer (WAL)"
    assert result.collect().equals(run(TWO_FILTERS, cache="off").collect())


def test_cache_stats_lists_answers_per_model_and_clear_empties_the_store(capsys):
    run(TWO_FILTERS)
    assert main(["cache", "stats"]) == 0
    out = capsys.readouterr().out
    assert f"answer store {os.environ[STORE_ENVIRONMENT]}" in out
    assert "gemma-3-270m on keyword (rule keyword-1, tokenizer quail-bytes-v1)" in out and "margin" in out
    assert main(["cache", "clear"]) == 0
    assert "removed" in capsys.readouterr().out
    assert run(TWO_FILTERS).report["fresh_tokens"] > 0


# -- the planner, the report and explain know what is stored ------------------------------------------------


def test_the_planner_prices_stored_answers_at_zero_and_says_so():
    with keyword_session() as session:
        before = session.sql(JOIN + f" WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')})").plan()
        session.sql(JOIN + f" WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')})").run()
        after = session.sql(JOIN + f" WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')})").plan()
        text = session.sql(JOIN + f" WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')})").explain()
    assert before.estimated_seconds > 0 and after.estimated_seconds == 0 and after.sol_seconds == 0
    assert "answer store: of 16 documents of r, still to compute #1 0" in text


def test_a_stored_filter_runs_first_because_it_costs_nothing():
    worth = f"SELECT r.id FROM reviews r WHERE AI_FILTER({sql_prompt(WORTH, 'r.body')}, {{'selectivity': 0.9}})"
    run(worth)
    both = worth + f" AND AI_FILTER({sql_prompt(ACTING, 'r.body')}, {{'selectivity': 0.1}})"
    with keyword_session("off") as session:
        assert session.sql(both).plan().remarks[0].startswith("filter order on r: #1"), "without the store"
    with keyword_session() as session:
        decisions = [r for r in session.sql(both).plan().remarks if r.startswith("filter order")]
    assert decisions[0].startswith("filter order on r: #0"), decisions


def test_explain_analyze_and_the_report_count_stored_computed_and_copied_answers():
    run(FILTER)
    with keyword_session() as session:
        text = session.sql(TWO_FILTERS).explain(analyze=True)
        report = session.sql(TWO_FILTERS).run().report
    assert "16 stored, 5 computed, 0 copied from identical prompts" in text
    assert report["answers"] == {"stored": 21, "computed": 0, "duplicates": 0}
    json.dumps(report)


# -- two processes, one store, at the same time --------------------------------------------------------------


@pytest.fixture
def many_reviews(tmp_path: Path) -> Path:
    """Six hundred distinct reviews as a Parquet file."""
    path = tmp_path / "reviews.parquet"
    pq.write_table(distinct_reviews(600), path)
    return path


def query_process(sql: str, table: Path, out: Path, cache: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "quail.cli", "query", sql, "-t", f"reviews={table}", "--backend",
               "example-keyword", "--chunk-tokens", "256", "--cache", cache, "--no-progress", "-o", str(out)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_two_processes_write_overlapping_queries_to_one_store_at_once(many_reviews, tmp_path):
    first = f"SELECT r.id FROM reviews r WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')})"
    second = TWO_FILTERS
    running = [query_process(sql, many_reviews, tmp_path / f"{i}.json", "auto") for i, sql in
               enumerate((first, second))]
    for process in running:
        _, err = process.communicate(timeout=240)
        assert process.returncode == 0, err.decode()
    expected = [query_process(sql, many_reviews, tmp_path / f"off{i}.json", "off") for i, sql in
                enumerate((first, second))]
    for process in expected:
        process.communicate(timeout=240)
    for i in range(2):
        assert json.loads((tmp_path / f"{i}.json").read_text()) == json.loads((tmp_path / f"off{i}.json").read_text())
    with sqlite3.connect(os.environ[STORE_ENVIRONMENT]) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("SELECT count(*) FROM answers").fetchone()[0] >= 600


@pytest.fixture(autouse=True)
def _no_engines() -> Iterator[None]:
    yield
    quail.release_engines()


@pytest.mark.parametrize("immutable", [False, True])
def test_a_store_this_process_cannot_write_is_read_and_left_unchanged(tmp_path, monkeypatch, immutable):
    """A shared store another user filled (its file or directory not writable here): its answers serve and
    nothing is written to it — neither answers nor when they were used. (As root every file is writable, so
    the permission check is what this test replaces.)"""
    store_path = tmp_path / "answers.sqlite"
    run(FILTER, cache=str(store_path))
    with sqlite3.connect(store_path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    before = store_path.read_bytes()
    monkeypatch.setattr(store, "_writable", lambda path: False)
    if immutable:  # a WAL store whose index cannot be made here: read as the file holds it
        real_connect = sqlite3.connect
        monkeypatch.setattr(store.sqlite3, "connect", lambda target, *a, **k: real_connect(target, *a, **k) if (
            "immutable" in str(target)) else (_ for _ in ()).throw(sqlite3.OperationalError("unable to open")))
    with warnings_as_errors():
        warm = run(FILTER, cache=str(store_path))
        added = run(TWO_FILTERS, cache=str(store_path))  # new answers are computed, and not stored
    assert warm.report["fresh_tokens"] == 0 and warm.count() == run(FILTER, cache="off").count()
    assert added.report["fresh_tokens"] > 0
    assert store_path.read_bytes() == before


@contextlib.contextmanager
def warnings_as_errors() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", AnswerStoreWarning)
        yield
