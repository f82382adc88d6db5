"""One execution path: every backend's model work goes through `execute_request` on a compute provider.

Each backend — the installed example plugin's, the keyword test backend, vLLM and SGLang behind
fake engines, native on a tiny random model — answers the end-to-end query set through `local`
(in-process) and `process` (a worker process, everything crossing as data), with the rows it
returns through either equal to the oracle (or, for a real model, to each other). A `process`
worker that dies mid-query is a clear error, the session stays usable, and nothing is left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pyarrow as pa
import pytest
from support.cases import CASE_BY_ID, CASES, KEPT_ENGINES, assert_matches_oracle, keyword_session, result_rows
from support.compute_setup import MARGINS_FILE, register_fakes, register_slow, save_margins
from support.e2e_data import TABLES, arrow_table
from support.request_helpers import TOKENIZER, classifies, teach
from test_signals import ctrl_c_as_in_a_terminal

import quail
from quail.errors import RefusalError, WorkerLostError
from quail.testing import BASE_MODEL, ByteTokenizer

PROVIDERS = ["local", "process"]
NATIVE_TESTS = Path(__file__).resolve().parents[1] / "packages" / "quail-native" / "tests"
REQUEST_CASES = [c for c in CASES if not classifies(c)]


def worker_pids() -> set[int]:
    """This process's compute workers."""
    return {p.pid for p in psutil.Process().children(recursive=True)
            if "quail.compute.worker" in " ".join(p.cmdline())}


def registered_tables(session: quail.Session) -> quail.Session:
    for name, (_, id_column) in TABLES.items():
        session.register(name, quail.DocumentProvider.from_table(arrow_table(name), id_column))
    return session


@pytest.fixture(autouse=True, scope="module")
def released() -> Iterator[None]:
    """Every module starts and ends without engines or workers."""
    quail.release_engines()
    yield
    quail.release_engines()


# -- backends an installed plugin provides --------------------------------------------------------------


@pytest.mark.parametrize("compute", PROVIDERS)
@pytest.mark.parametrize("backend", ["example", "example-keyword"])
def test_an_installed_plugins_backends_answer_the_query_set_through_each_provider(backend, compute):
    config = quail.EngineConfig(model=BASE_MODEL, backend=backend, compute=compute, engines_per_device=KEPT_ENGINES)
    with registered_tables(quail.Session(config, tokenizer=ByteTokenizer())) as session:
        for case in CASES:
            assert_matches_oracle(case.query(session).collect(), case.oracle)


# -- backends registered in code: the same setup hook builds the caller's and the worker's registry ------


@pytest.fixture(scope="module")
def taught(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The fake engines' margin table over every request-backend query, written before any worker starts."""
    margins: dict[tuple[int, ...], float] = {}
    registry = quail.ExtensionRegistry.with_built_ins()
    register_fakes_with(registry, margins)
    config = quail.EngineConfig(model=BASE_MODEL, backend="fake_vllm", calibration="off")
    with quail.Session(config, registry=registry, tokenizer=TOKENIZER) as session:
        registered_tables(session)
        for case in REQUEST_CASES:
            teach(margins, case.query(session))
    path = tmp_path_factory.mktemp("margins") / "margins.json"
    save_margins(margins, path)
    previous = os.environ.get(MARGINS_FILE)
    os.environ[MARGINS_FILE] = str(path)
    yield
    quail.release_engines()
    if previous is None:
        del os.environ[MARGINS_FILE]
    else:
        os.environ[MARGINS_FILE] = previous


def register_fakes_with(registry: quail.ExtensionRegistry, margins: dict[tuple[int, ...], float]) -> None:
    """`register_fakes` over an in-memory table (for planning, before the file exists)."""
    path = Path(tempfile.mkdtemp()) / "margins.json"
    save_margins(margins, path)
    previous = os.environ.get(MARGINS_FILE)
    os.environ[MARGINS_FILE] = str(path)
    try:
        register_fakes(registry)
    finally:
        os.environ.pop(MARGINS_FILE) if previous is None else os.environ.update({MARGINS_FILE: previous})
        path.unlink()
        path.parent.rmdir()


def hooked_session(backend: str, compute: str) -> quail.Session:
    registry = quail.ExtensionRegistry.with_built_ins()
    register_fakes(registry)
    config = quail.EngineConfig(model=BASE_MODEL, backend=backend, compute=compute,
                                worker_setup="support.compute_setup:register_fakes",
                                engines_per_device=KEPT_ENGINES, calibration="off")
    return registered_tables(quail.Session(config, registry=registry, tokenizer=TOKENIZER))


@pytest.fixture(scope="module")
def keyword_reference() -> Iterator[quail.Session]:
    with registered_tables(quail.Session(quail.EngineConfig(backend="keyword", engines_per_device=KEPT_ENGINES),
                                         registry=_keyword_registry(), tokenizer=TOKENIZER)) as session:
        yield session


def _keyword_registry() -> quail.ExtensionRegistry:
    registry = quail.ExtensionRegistry.with_built_ins()
    registry.register_backend(quail.testing.KeywordBackend(TOKENIZER))
    return registry


@pytest.mark.plugins
@pytest.mark.parametrize("compute", PROVIDERS)
@pytest.mark.parametrize("backend", ["keyword", "fake_vllm", "fake_sglang"])
def test_backends_registered_in_code_answer_the_query_set_through_each_provider(taught, keyword_reference,
                                                                               backend, compute):
    cases = CASES if backend == "keyword" else REQUEST_CASES
    with hooked_session(backend, compute) as session:
        for case in cases:
            got = case.query(session).collect()
            assert_matches_oracle(got, case.oracle)
            if case.oracle.limit is None:
                expected = case.query(keyword_reference).collect()
                assert sorted(result_rows(got, got.column_names)) == \
                    sorted(result_rows(expected, expected.column_names))


def test_a_backend_the_worker_does_not_have_is_refused_by_name_and_the_session_stays_usable():
    config = quail.EngineConfig(backend="keyword", compute="process", engines_per_device=KEPT_ENGINES)
    with registered_tables(quail.Session(config, registry=_keyword_registry(), tokenizer=TOKENIZER)) as session:
        case = CASE_BY_ID["one_keyword_filter"]
        with pytest.raises(RefusalError, match="unknown backend 'keyword'"):
            case.query(session).run()
        local = quail.Session(quail.EngineConfig(backend="keyword"), registry=session.registry, tokenizer=TOKENIZER)
        with registered_tables(local):
            assert_matches_oracle(case.query(local).collect(), case.oracle)


def test_a_process_worker_keeps_its_engine_warm_across_sessions():
    quail.release_engines()
    config = quail.EngineConfig(backend="example-keyword", compute="process", cache="off")  # both runs compute
    kinds = []
    for _ in range(2):
        with registered_tables(quail.Session(config, tokenizer=ByteTokenizer())) as session:
            kinds.append(CASE_BY_ID["join_full"].query(session).run().report["boot_kind"])
    assert kinds == ["cold", "warm"]
    assert len(worker_pids()) == 1
    quail.release_engines()
    assert not worker_pids()


# -- native on a tiny random model ------------------------------------------------------------------------


TINY_SQL = [
    "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Does the review praise the acting? {0}', r.body)) "
    "AND AI_FILTER(PROMPT('Is {0} a positive review?', r.body))",
    "SELECT r.id, a.aspect FROM reviews r JOIN aspects a ON AI_FILTER(PROMPT('Does {0} discuss {1}?', r.body, "
    "a.aspect)) WHERE AI_FILTER(PROMPT('Is {0} a positive review?', r.body))",
    "SELECT r.id, AI_CLASSIFY(r.body, ['good', 'bad']) AS verdict FROM reviews r",
]
TINY_REVIEWS = ["the acting is superb and the cast loved the music", "awful plot with boring dialogue",
                "a funny movie the story is fast", "the ending is sad but the acting is superb",
                "boring boring the movie is slow", "superb director with a great cast"]
TINY_ASPECTS = ["the acting", "the music", "the plot"]


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[quail.ModelSpec]:
    pytest.importorskip("torch")
    sys.path.insert(0, str(NATIVE_TESTS))
    try:
        from naive_reference import build_tiny_model

        yield build_tiny_model("qwen3", tmp_path_factory.mktemp("tiny") / "qwen3").spec
    finally:
        sys.path.remove(str(NATIVE_TESTS))


def native_results(model: quail.ModelSpec, compute: str) -> list[quail.runtime.results.QueryResult]:
    registry = quail.ExtensionRegistry.with_built_ins()
    registry.register_model(model)
    config = quail.EngineConfig(model=model.name, compute=compute, precision="fp32", calibration="off",
                                cache="off")  # both providers compute: their engines' answers are compared
    with quail.Session(config, registry=registry) as session:
        session.register("reviews", quail.DocumentProvider.from_table(
            pa.table({"id": range(len(TINY_REVIEWS)), "body": TINY_REVIEWS}), "id"))
        session.register("aspects", quail.DocumentProvider.from_table(
            pa.table({"id": range(len(TINY_ASPECTS)), "aspect": TINY_ASPECTS}), "id"))
        return [session.sql(sql).run() for sql in TINY_SQL]


def test_native_answers_equal_through_local_and_process(tiny_qwen3):
    local, remote = native_results(tiny_qwen3, "local"), native_results(tiny_qwen3, "process")
    for mine, theirs in zip(local, remote, strict=True):
        assert mine.collect().equals(theirs.collect())
        assert mine.answer_tables.keys() == theirs.answer_tables.keys()
        for node, table in mine.answer_tables.items():
            assert table.equals(theirs.answer_tables[node]), node
        assert mine.report["fresh_tokens"] == theirs.report["fresh_tokens"] > 0
    assert remote[0].report["boot_kind"] == "cold" and remote[1].report["boot_kind"] == "warm"


@pytest.mark.parametrize(("bf16", "fp32"), [(1000e9, 1e9), (1e9, 1000e9)])
def test_a_process_worker_computes_in_the_precision_its_callers_answer_store_names(
        tiny_qwen3, tmp_path, monkeypatch, bf16, fp32):
    """`auto` on a CPU: the caller keys stored answers by the precision it reads from the CPU's probe record
    and the worker computes in the precision it reads from the same record. One of the two records is the
    opposite of what a probe of its own would measure on any CPU, so a worker probing alone would differ."""
    from quail_native.backend import precision_name
    from quail_native.precision_record import RECORDS_ENVIRONMENT, ProbeRecord, record_path, remember

    quail.release_engines()  # a worker started before would read the suite's records, not this test's
    monkeypatch.setenv(RECORDS_ENVIRONMENT, str(tmp_path))
    monkeypatch.setattr("quail_native.precision_record._KNOWN", {})  # this process has read no record yet
    path = record_path(tiny_qwen3.hidden, tiny_qwen3.ffn)
    record = remember(path, ProbeRecord(bf16, fp32, "2026-12-03"))
    registry = quail.ExtensionRegistry.with_built_ins()
    registry.register_model(tiny_qwen3)
    config = quail.EngineConfig(model=tiny_qwen3.name, compute="process", precision="auto", calibration="off")
    try:
        with quail.Session(config, registry=registry) as session:
            session.register("reviews", quail.DocumentProvider.from_table(
                pa.table({"id": range(len(TINY_REVIEWS)), "body": TINY_REVIEWS}), "id"))
            report = session.sql(TINY_SQL[0]).run().report
            stored_under = precision_name(config, session.device, tiny_qwen3)
    finally:
        quail.release_engines()
    assert stored_under == record.precision
    assert report["engine"][0] == f"native engine computes in {record.reason(path)}"


# -- a worker that dies, a caller that is interrupted ------------------------------------------------------


def slow_session(registry: quail.ExtensionRegistry | None = None) -> quail.Session:
    config = quail.EngineConfig(backend="slow-keyword", compute="process",
                                worker_setup="support.compute_setup:register_slow")
    registry = registry or quail.ExtensionRegistry.with_built_ins()
    register_slow(registry)
    return registered_tables(quail.Session(config, registry=registry, tokenizer=ByteTokenizer()))


def test_killing_the_worker_mid_query_is_a_clear_error_and_the_next_query_starts_a_new_worker(
        tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    quail.release_engines()
    killed: list[tuple[int, float]] = []

    def kill_on_first_progress(node: object, done: int, total: int) -> None:
        if not killed:
            [pid] = worker_pids()
            os.kill(pid, signal.SIGKILL)
            killed.append((pid, time.perf_counter()))

    registry = quail.ExtensionRegistry.with_built_ins()
    registry.register_progress_listener(kill_on_first_progress)
    case = CASE_BY_ID["join_with_filters_on_both_sides"]
    with slow_session(registry) as session:
        with pytest.raises(WorkerLostError, match=r"killed by signal SIGKILL.*next query starts a new worker"):
            case.query(session).run()
        pid, at = killed[0]
        assert time.perf_counter() - at < 5.0
        assert not psutil.pid_exists(pid), "the dead worker is reaped, not left a zombie"
        assert_matches_oracle(case.query(session).collect(), case.oracle)
        [replacement] = worker_pids()
        assert replacement != pid
    quail.release_engines()
    assert not worker_pids() and not psutil.pid_exists(replacement)
    assert not list(tmp_path.iterdir()), "no temporary file or directory is left"


SCRIPT = """
import sys, time, psutil, quail
sys.path[:0] = {paths!r}
from test_compute import CASE_BY_ID, slow_session
pids = []

def announce(node, done, total):
    if not pids:
        pids.extend(p.pid for p in psutil.Process().children() if "quail.compute.worker" in " ".join(p.cmdline()))
        print("worker", pids[0], flush=True)

registry = quail.ExtensionRegistry.with_built_ins()
registry.register_progress_listener(announce)
with slow_session(registry) as session:
    query = CASE_BY_ID["join_with_filters_on_both_sides"].query(session)
    while True:
        query.run()
"""


def run_script(tmp_path: Path) -> tuple[subprocess.Popen[str], int]:
    """A caller process looping over a slow query on a `process` worker; (the caller, its worker's pid)."""
    script = tmp_path / "caller.py"
    script.write_text(textwrap.dedent(SCRIPT.format(paths=[p for p in sys.path if p])))
    environment = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))  # a SIGKILL leaves its temp files
    caller = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=environment, preexec_fn=ctrl_c_as_in_a_terminal)
    assert caller.stdout is not None
    line = caller.stdout.readline()
    assert line.startswith("worker "), (line, caller.stderr.read() if caller.stderr else "")
    return caller, int(line.split()[1])


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.1)
    return False


def test_ctrl_c_in_the_caller_stops_its_worker(tmp_path):
    caller, worker = run_script(tmp_path)
    try:
        caller.send_signal(signal.SIGINT)
        _, errors = caller.communicate(timeout=30)
    finally:
        caller.kill()  # a caller that outlived the test would loop on for ever
        caller.wait(timeout=10)
    assert caller.returncode != 0 and "KeyboardInterrupt" in errors
    assert gone_within(worker, 10.0)


def test_a_killed_caller_never_leaves_its_worker_behind(tmp_path):
    caller, worker = run_script(tmp_path)
    caller.kill()
    caller.communicate(timeout=30)
    assert gone_within(worker, 10.0)


def test_a_session_that_exists_names_its_provider_and_an_unknown_one_is_refused():
    with keyword_session() as session:
        assert session.compute.name == "local"
    with pytest.raises(RefusalError, match=r"unknown compute provider 'cluster'.*local, process"):
        quail.Session(quail.EngineConfig(backend="example", compute="cluster"))


def test_every_registered_backend_answers_through_execute_request_or_is_refused_before_it(tiny_qwen3):
    """No backend's execute_request may refuse: each installed one either runs a query through it, on both
    providers, or says in `supports()` (before any query) why it cannot run here."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    registry = quail.ExtensionRegistry.with_built_ins()
    registry.register_model(tiny_qwen3)
    cpu = registry.device("cpu")
    ran, refused = [], []
    for name, backend in sorted(registry.backends.items()):
        verdict = backend.supports(tiny_qwen3, cpu, 1)
        if not verdict.accepted:
            refused.append(name)
            assert verdict.reason
            continue
        results = []
        for compute in PROVIDERS:
            config = quail.EngineConfig(model=tiny_qwen3.name, backend=name, compute=compute, precision="fp32",
                                        calibration="off", kv_budget_bytes=64 << 20)
            with quail.Session(config, registry=registry) as session:
                session.register("reviews", quail.DocumentProvider.from_table(
                    pa.table({"id": range(len(TINY_REVIEWS)), "body": TINY_REVIEWS}), "id"))
                result = session.sql(TINY_SQL[0]).run()
            assert result.report["fresh_tokens"] is None or result.report["fresh_tokens"] >= 0
            results.append(result.collect())
        assert results[0].equals(results[1]), name
        ran.append(name)
        quail.release_engines()
    assert {"native", "vllm", "stock_vllm", "example", "example-keyword"} <= set(ran), (ran, refused)
    assert "sglang" in refused, "SGLang needs a CUDA GPU"


def test_two_threads_running_model_work_on_local_take_the_engines_in_turn(monkeypatch):
    """Sessions in one process share the local provider's engines (a server's planning session explaining a blocked
    join while the other runs a query): their requests never overlap on them."""
    import threading

    from quail.compute import local

    inside, most = [0], [0]
    serve = local.serve

    def counted(context):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        time.sleep(0.05)
        try:
            return serve(context)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(local, "serve", counted)
    sql = "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Does the review praise the acting? {0}', r.body))"
    sessions = [keyword_session(), keyword_session()]
    answers: list[int] = []
    threads = [threading.Thread(target=lambda s=s: answers.append(s.sql(sql).run().collect().num_rows))
               for s in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for session in sessions:
        session.close()
    assert len(answers) == 2 and answers[0] == answers[1]
    assert most[0] == 1
