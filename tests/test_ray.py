"""The `ray` provider on a local Ray cluster this module starts itself (2 CPUs, 2 workers, no network).

The end-to-end query set answers exactly as on `local` — through an installed plugin's backend, and
through a backend registered in code that reaches the workers by the setup hook; workers boot once
and stay warm; a worker killed mid-query has its shard re-run elsewhere with the same rows; a LIMIT
cancels the shards it no longer needs; a missing resource is refused by name; releasing leaves no
actor behind; `quail query --compute ray` works with its progress bar; and a filter → join on the
embedded Gemma 3 270M gives local's rows and margins.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray
from support.cases import CASE_BY_ID, CASES, assert_matches_oracle
from support.e2e_data import TABLES, arrow_table

import quail
from quail import datasets
from quail.cli import main
from quail.errors import RefusalError
from quail.physical import editing
from quail.physical import nodes as ph
from quail.testing import ByteTokenizer
from quail_ray.provider import POOL

pytestmark = pytest.mark.plugins  # it needs the first-party plugins (or ray) installed

TESTS = Path(__file__).resolve().parent
WORKERS = 2


@pytest.fixture(scope="module", autouse=True)
def cluster() -> Iterator[None]:
    """One local cluster for the module: the test helpers reach its workers through the runtime env."""
    quail.release_engines()
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR,
             runtime_env={"env_vars": {"PYTHONPATH": str(TESTS)}})
    yield
    quail.release_engines()
    ray.shutdown()


def worker_processes() -> list[psutil.Process]:
    """This process's Ray actors: workers and their progress queue (the local cluster is its descendant)."""
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            command = " ".join(process.cmdline())
            if ("QuailWorker" in command or "_QueueActor" in command) and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.NoSuchProcess:
            continue
    return found


def session_on(compute: str, backend: str = "example-keyword", **options: object) -> quail.Session:
    config = quail.EngineConfig(backend=backend, compute=compute, **options)  # type: ignore[arg-type]
    session = quail.Session(config, registry=registry_with_test_backends(), tokenizer=ByteTokenizer())
    for name, (_, id_column) in TABLES.items():
        session.register(name, quail.DocumentProvider.from_table(arrow_table(name), id_column))
    return session


def registry_with_test_backends() -> quail.ExtensionRegistry:
    """The caller's registry: the installed plugins plus what the workers get from `ray_setup`."""
    from support.ray_setup import register_unhurried

    registry = quail.ExtensionRegistry.with_built_ins()
    register_unhurried(registry)
    return registry


def ray_session(backend: str = "example-keyword", **options: object) -> quail.Session:
    hook = {} if backend == "example-keyword" else {"worker_setup": "support.ray_setup:register_unhurried"}
    return session_on("ray", backend, **{"workers": WORKERS, **hook, **options})


# -- the query set ---------------------------------------------------------------------------------------


def test_an_installed_plugins_backend_answers_the_query_set_on_ray_as_on_local():
    with ray_session() as remote, session_on("local") as local:
        for case in CASES:
            result = case.query(remote).run()
            assert result.collect().equals(case.query(local).collect()), case.id
            assert_matches_oracle(result.collect(), case.oracle)
            assert {s["worker"] for s in result.report["shards"]} == {w.name for w in POOL.live()}, case.id


def test_a_backend_registered_in_code_reaches_the_workers_through_the_setup_hook():
    with ray_session("keyword") as remote, session_on("local", "keyword") as local:
        for case_id in ("two_filters", "join_with_filters_on_both_sides", "not_exists_with_equality",
                        "score_output_over_join_and_classify", "limit_join"):
            case = CASE_BY_ID[case_id]
            assert case.query(remote).collect().equals(case.query(local).collect()), case_id


def test_a_missing_setup_hook_is_refused_by_name():
    with ray_session("keyword", worker_setup="no_such_module:register") as session, \
            pytest.raises(RefusalError, match="worker setup hook 'no_such_module:register' failed on ray worker"):
        CASE_BY_ID["two_filters"].query(session).run()


# -- workers: warm engines, faults, cancellation ------------------------------------------------------------


def test_each_worker_boots_its_engine_once_and_later_sessions_find_it_warm():
    quail.release_engines()
    kinds = []
    for _ in range(2):
        with ray_session(cache="off") as session:  # the second session computes again, on warm engines
            shards = CASE_BY_ID["join_full"].query(session).run().report["shards"]
            kinds.append(sorted((s["worker"], s["boot_kind"]) for s in shards))
    workers = {worker for worker, _ in kinds[0]}
    assert len(workers) == WORKERS
    assert kinds == [sorted((w, "cold") for w in workers), sorted((w, "warm") for w in workers)]


def test_a_worker_killed_mid_query_has_its_shard_rerun_and_the_rows_do_not_change():
    case = CASE_BY_ID["join_with_filters_on_both_sides"]
    killed: list[str] = []

    def kill_on_first_progress(node: object, done: int, total: int) -> None:
        if not killed:
            victim = POOL.live()[0]
            killed.append(victim.name)
            ray.kill(victim.actor)

    with ray_session("unhurried-keyword") as session, session_on("local", "keyword") as local:
        expected = case.query(local).collect()
        session.registry.register_progress_listener(kill_on_first_progress)
        result = case.query(session).run()
        assert killed, "the query reported progress"
        assert result.collect().equals(expected)
        assert result.report["retries"] == 1
        [rerun] = [s for s in result.report["shards"] if s["retries"]]
        assert rerun["worker"] != killed[0]
        again = case.query(session).run()
        assert again.collect().equals(expected)
        assert len(POOL.live()) == WORKERS and killed[0] not in {w.name for w in POOL.live()}
        assert again.report["retries"] == 0


def test_a_limit_cancels_the_shards_it_no_longer_needs():
    case = CASE_BY_ID["limit_filter"]
    with ray_session("unhurried-keyword") as session, session_on("local", "keyword") as local:
        result = case.query(session).run()
        assert result.collect().equals(case.query(local).collect())
        shards = result.report["shards"]
        assert any(s["cancelled"] for s in shards) and not shards[0]["cancelled"]
        assert "cancelled: the LIMIT had its rows" in result.explain()


def test_a_plan_that_cannot_be_split_runs_whole_on_one_worker():
    case = CASE_BY_ID["one_keyword_filter"]
    with ray_session() as session, session_on("local") as local:
        query = case.query(session)
        edited = editing.insert(query.plan().graph, ph.Limit(id="early", count=5), after="scan_r")
        result = query.run(plan=edited)
        assert result.collect().equals(case.query(local).run(plan=edited).collect())
        [shard] = result.report["shards"]
        assert shard["alias"] is None
    assert "phase 0 shard 0 (unsplit) on ray worker" in result.explain()


# -- explain, refusals, release, the command line ------------------------------------------------------------


def test_explain_shows_the_documents_and_tokens_per_worker_and_the_balance():
    with ray_session() as session:
        text = CASE_BY_ID["join_with_filters_on_both_sides"].query(session).explain()
    assert "== Shards over workers ==\ncompute 'ray': 2 worker(s); 2 phase(s)" in text
    assert "phase 1: filter_a, join_0 — split on a; balance" in text
    assert "shard 1 → worker 1: rows" in text and "tokens" in text


@pytest.mark.parametrize(("options", "message"), [
    ({"worker_gpus": 1.0}, r"no room for 2 worker\(s\) of 1 GPU\(s\) each; needed 2 GPUs, available 0 GPUs"),
    ({"workers": 3}, r"no room for 3 worker\(s\) of 1 CPU\(s\) each; needed 3 CPUs, available 2 CPUs"),
])
def test_a_missing_resource_is_refused_by_name_and_the_cluster_stays_usable(options, message):
    with ray_session(**options) as session, pytest.raises(RefusalError, match=message):
        CASE_BY_ID["two_filters"].query(session).run()
    with ray_session() as session:
        assert_matches_oracle(CASE_BY_ID["two_filters"].query(session).collect(), CASE_BY_ID["two_filters"].oracle)


def test_releasing_engines_leaves_no_worker_behind():
    with ray_session() as session:
        session.sql(CASES[0].sql).run()
    assert len(worker_processes()) == WORKERS + 1, "the workers and their progress queue"
    quail.release_engines()
    assert not POOL.live()
    deadline = time.monotonic() + 30
    while worker_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not worker_processes()


def test_quail_query_runs_on_ray_with_its_progress_bar(tmp_path, capsys):
    pq.write_table(pa.table({"id": [11, 12, 13, 14], "body": ["The acting was superb", "a boring plot",
                                                               "great acting, weak plot", "lovely music"]}),
                   tmp_path / "reviews.parquet")
    sql = "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Does {0} mention \"acting\"?', r.body))"
    code = main(["query", sql, "--table", f"reviews={tmp_path / 'reviews.parquet'}", "--backend", "example-keyword",
                 "--compute", "ray", "--workers", "2"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    rows = captured.out.split("-- report --")[0]
    assert "11" in rows and "13" in rows and "12" not in rows
    assert "AiFilter r" in captured.err and "4/4" in captured.err


# -- the embedded Gemma 3 270M --------------------------------------------------------------------------------

GEMMA_SQL = """SELECT r.id, a.aspect FROM reviews r JOIN aspects a
  ON AI_FILTER(PROMPT('Does the review {0} speak well of the {1}?', r.body, a.aspect))
WHERE AI_FILTER(PROMPT('Is this movie review positive? {0}', r.body))"""


def gemma_run(compute: str) -> quail.runtime.results.QueryResult:
    options = {"workers": WORKERS} if compute == "ray" else {}
    config = quail.EngineConfig(model="gemma-3-270m", compute=compute, precision="fp32", **options)
    with quail.Session(config) as session:
        session.register("reviews", quail.DocumentProvider.from_table(datasets.reviews().slice(0, 12), "id"))
        session.register("aspects", quail.DocumentProvider.from_table(datasets.aspects().slice(0, 3), "id"))
        query = session.sql(GEMMA_SQL)
        if compute == "ray":
            [phase] = [line for line in query.explain().splitlines() if line.startswith("phase 0:")]
            assert float(phase.split("balance ")[1].split()[0]) <= 1.1, phase
        return query.run()


def margins(table: pa.Table) -> dict[tuple[int, ...], float]:
    keys = [c for c in table.column_names if c not in ("answer", "margin")]
    return {tuple(row[k] for k in keys): row["margin"] for row in table.to_pylist()}


@pytest.mark.slow
def test_a_filter_then_join_on_the_embedded_gemma_equals_local():
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    local, remote = gemma_run("local"), gemma_run("ray")
    assert remote.collect().equals(local.collect())
    assert local.answer_tables.keys() == remote.answer_tables.keys()
    for node, table in local.answer_tables.items():
        mine, theirs = margins(remote.answer_tables[node]), margins(table)
        assert mine.keys() == theirs.keys(), node
        assert all(abs(mine[k] - theirs[k]) <= 1e-4 for k in theirs), node
    assert len({s["worker"] for s in remote.report["shards"]}) == WORKERS
