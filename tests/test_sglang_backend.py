"""The sglang backend through SGLangEngine over a fake sglang.Engine faithful to SGLang 0.5's API.

Every strategy must return the rows the CPU test backend (KeywordBackend) returns over the
end-to-end query set: the fake answers each exact prompt with the keyword rule, so any difference
is the adapter, the request planning or a schedule losing, duplicating or misrouting an answer.
No SGLang is needed: the fake speaks its argument names and output dicts (see fake_sglang.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cases import CASES, assert_matches_oracle, keyword_session, result_rows
from support.fake_sglang import FakeSGLang
from support.request_helpers import (
    LABELS,
    TOKENIZER,
    VOCAB,
    assert_keyword_rows,
    classifies,
    join_case,
    request_session,
    teach,
)

import quail
from quail.errors import RefusalError
from quail.physical import nodes as ph
from quail.requests import EngineRequest, RequestStrategy
from quail.testing.backend import KeywordExecution
from quail_sglang.backend import PIPELINED, SGLangBackend
from quail_sglang.engine import EngineSettings, SGLangEngine

pytestmark = pytest.mark.plugins  # it needs the first-party plugins (or ray) installed

STRATEGIES = {
    "sglang": PIPELINED,
    "operator+anchor_major": RequestStrategy("operator", "anchor_major"),
    "operator+suffix_major": RequestStrategy("operator", "suffix_major"),
    "pipelined+anchor_major": RequestStrategy("pipelined", "anchor_major"),
}


class Fake:
    """The fake engine of one session, booted with the server args the adapter really passes."""

    def __init__(self, capacity: int) -> None:
        self.margins: dict[tuple[int, ...], float] = {}
        self.generations: dict[tuple[int, ...], list[int]] = {}
        self.capacity = capacity
        self.engine: FakeSGLang | None = None
        self.boots = 0

    def boot(self, context: quail.GpuContext) -> SGLangEngine:
        self.boots += 1
        settings = EngineSettings(Path("/models/fake"), kv_tokens=self.capacity, context_length=4096)
        self.engine = FakeSGLang(self.margins, LABELS, vocab=VOCAB, generations=self.generations,
                                 **settings.server_args())
        return SGLangEngine(self.engine)  # type: ignore[arg-type]

    def backend(self, strategy: RequestStrategy) -> SGLangBackend:
        return SGLangBackend("fake_sglang", strategy, boot=self.boot)


def session_on(fake: Fake, strategy: RequestStrategy, use: str | None = None,
               calibration: str = "off") -> quail.Session:
    return request_session(fake.backend(strategy), use, calibration)


@pytest.fixture(scope="module")
def keyword() -> Iterator[quail.Session]:
    with keyword_session() as session:
        yield session


@pytest.fixture(scope="module", params=list(STRATEGIES), ids=list(STRATEGIES))
def strategy_session(request: pytest.FixtureRequest) -> Iterator[tuple[Fake, quail.Session]]:
    fake = Fake(capacity=1 << 20)
    with session_on(fake, STRATEGIES[request.param]) as session:
        yield fake, session


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES if not classifies(c)])
def test_every_sglang_strategy_returns_the_keyword_backends_rows(strategy_session, keyword, case):
    fake, session = strategy_session
    query = case.query(session)
    teach(fake.margins, query)
    assert_keyword_rows(query, case, keyword)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES if classifies(c)][:1])
def test_sglang_refuses_classification_at_plan_time(case):
    with session_on(Fake(1 << 20), PIPELINED) as session, pytest.raises(RefusalError, match=r"AI\.CLASSIFY"):
        case.query(session).plan()


def longest_prompt(margins: dict[tuple[int, ...], float]) -> int:
    return max(len(prompt) for prompt in margins)


@pytest.mark.parametrize("room", [1, 1 << 20], ids=["kv-holds-one-long-prompt", "kv-holds-everything"])
def test_the_kv_pool_caps_live_prompts_without_changing_rows(room):
    """Pipelined requests in flight never hold more prompt tokens than the pool (max_total_num_tokens)."""
    probe = Fake(1 << 20)
    with session_on(probe, PIPELINED) as session:
        teach(probe.margins, join_case().query(session))
    capacity = longest_prompt(probe.margins) + 7 + room  # the engine takes prompts up to min(pool − 1) − 5
    fake = Fake(capacity)
    with session_on(fake, PIPELINED) as session:
        query = join_case().query(session)
        teach(fake.margins, query)
        assert_matches_oracle(query.run().collect(), join_case().oracle)
    assert fake.engine is not None and fake.engine.peak_tokens <= capacity
    if room > 1:
        assert fake.engine.peak_single > 1


def test_a_prompt_too_long_for_the_kv_pool_is_refused_by_the_engine():
    fake = Fake(40)
    with session_on(fake, PIPELINED) as session:
        query = join_case().query(session)
        teach(fake.margins, query)
        with pytest.raises(ValueError, match="exceeds the maximum allowed length"):
            query.run()


def test_the_kv_capacity_is_the_server_infos_max_total_num_tokens():
    fake = Fake(12345)
    engine = fake.boot(None)  # type: ignore[arg-type]
    assert engine.kv_capacity_tokens() == 12345


def test_suffix_major_waves_compute_each_anchor_once_where_anchor_major_batches_compute_it_again():
    """SGLang caches a prompt's KV only when it finishes: requests of one wave cannot share it."""
    cached = {}
    for name in ("operator+suffix_major", "operator+anchor_major"):
        fake = Fake(1 << 20)
        with session_on(fake, STRATEGIES[name]) as session:
            query = join_case().query(session)
            teach(fake.margins, query)
            cached[name] = query.run().report["cached_tokens"]
    assert cached["operator+suffix_major"] > cached["operator+anchor_major"]


def test_report_counts_fresh_and_cached_tokens_from_meta_info():
    fake = Fake(1 << 20)
    with session_on(fake, PIPELINED) as session:
        query = join_case().query(session)
        teach(fake.margins, query)
        report = query.run().report
    assert fake.engine is not None
    assert report["fresh_tokens"] + report["cached_tokens"] == sum(len(p) for p in fake.engine.prompts)
    assert report["cached_tokens"] > 0
    assert report["backend"] == "fake_sglang" and report["boot_kind"] == "cold" and report["boot_s"] is not None


def test_the_engine_boots_once_serves_later_sessions_and_shuts_down_when_released():
    quail.release_engines()
    fake = Fake(1 << 20)
    for _ in range(2):
        with session_on(fake, PIPELINED) as session:
            for _ in range(2):
                query = join_case().query(session)
                teach(fake.margins, query)
                query.run()
    assert fake.boots == 1 and fake.engine is not None and not fake.engine.closed
    quail.release_engines()
    assert fake.engine.closed


def test_calibrated_requests_decide_like_the_calibrated_keyword_backend():
    fake = Fake(1 << 20)
    with session_on(fake, PIPELINED, calibration="on") as session, \
            session_on(fake, PIPELINED, "keyword", calibration="on") as reference:
        query = join_case().query(session)
        teach(fake.margins, query)
        result = query.run()
        expected = join_case().query(reference).run()
    assert result.report["calibration"] == pytest.approx(expected.report["calibration"])
    got, want = result.collect(), expected.collect()
    assert sorted(result_rows(got, got.column_names)) == sorted(result_rows(want, want.column_names))


# -- the adapter against the engine's API --------------------------------------------------------


@pytest.fixture
def engine() -> SGLangEngine:
    margins = {(5, 6, 7): 2.5, (5, 6, 8): -1.0, (5, 9): 0.5}
    fake = FakeSGLang(margins, LABELS, vocab=VOCAB, **EngineSettings(Path("/m")).server_args())
    return SGLangEngine(fake)  # type: ignore[arg-type]


def test_a_batch_is_answered_per_request_with_margins_and_cache_counts(engine):
    requests = [EngineRequest(k, t, LABELS) for k, t in enumerate([(5, 6, 7), (5, 6, 8), (5, 9)])]
    first = engine.generate(requests)
    assert [(a.key, a.margin, a.prompt_tokens) for a in first] == [(0, 2.5, 3), (1, -1.0, 3), (2, 0.5, 2)]
    assert [a.cached_tokens for a in first] == [0, 0, 0]  # one wave: nothing finished before it
    again = engine.generate(requests[:1])
    assert again[0].cached_tokens == 2  # the whole prompt but its last token, from the radix cache


def test_submitted_requests_come_back_through_step_on_the_engines_loop(engine):
    for key, tokens in enumerate([(5, 6, 7), (5, 6, 8), (5, 9)]):
        engine.submit(EngineRequest(key, tokens, LABELS))
    answers = []
    while len(answers) < 3:
        answers += engine.step()
    assert sorted((a.key, a.margin) for a in answers) == [(0, 2.5), (1, -1.0), (2, 0.5)]
    assert engine.step() == []


def test_boot_passes_only_server_args_sglang_knows():
    args = EngineSettings(Path("/m"), dtype="bfloat16", kv_tokens=1000, context_length=513).server_args()
    assert args["disable_radix_cache"] is False and args["max_total_tokens"] == 1000
    assert args["context_length"] == 513 and "mem_fraction_static" not in args
    FakeSGLang({}, LABELS, vocab=VOCAB, **args)
    with pytest.raises(TypeError, match="enable_prefix_caching"):
        FakeSGLang({}, LABELS, vocab=VOCAB, **args, enable_prefix_caching=True)


@pytest.mark.parametrize(("call", "error"), [
    ({"input_ids": [(5, 6, 7)]}, "list of ints"),
    ({"input_ids": []}, "cannot be empty"),
    ({"input_ids": [5, 6, 7], "sampling_params": {"max_tokens": 1}}, "Unexpected keyword argument 'max_tokens'"),
    ({"input_ids": [5, 6, 7], "sampling_params": {"temperature": -1.0}}, "temperature must be non-negative"),
    ({"input_ids": [5, 6, 7], "logprob_start_len": 4}, "higher than the number of input tokens"),
    ({"input_ids": [5, 6, 7], "token_ids_logprob": [VOCAB]}, "out-of-vocabulary"),
])
def test_the_fake_refuses_what_sglang_refuses(call, error):
    fake = FakeSGLang({}, LABELS, vocab=VOCAB, model_path="/m")
    with pytest.raises((TypeError, ValueError), match=error):
        fake.generate(**call)


def test_the_fake_refuses_an_async_request_awaited_off_the_engines_loop():
    fake = FakeSGLang({(5, 6, 7): 1.0}, LABELS, vocab=VOCAB, model_path="/m")
    with pytest.raises(RuntimeError, match=r"Engine\.loop"):
        asyncio.run(fake.async_generate(input_ids=[5, 6, 7]))


GENERATIONS = [
    "SELECT r.id, AI_COMPLETE(PROMPT('Summarize {0}', r.body), {'max_tokens': 400}) AS g FROM reviews r",
    "SELECT r.id, AI_EXTRACT(r.body, {'what': 'What is it about?', 'words': 'How long is it?'}) AS x FROM reviews r",
]


@pytest.mark.parametrize("sql", GENERATIONS)
def test_generations_through_sglang_equal_the_keyword_backends(keyword, sql):
    """Greedy generations go to SGLang as one batch (`stop_token_ids`, `json_schema` for a schema); the fake writes
    what the keyword rule would, so the rows equal the keyword backend's."""
    fake = Fake(1 << 20)
    with session_on(fake, PIPELINED) as session:
        query = session.sql(sql)
        [node] = [n for n in query.plan().graph.nodes if isinstance(n, ph.AiGenerate)]
        texts = keyword.sql("SELECT body FROM reviews").run().collect().column("body").to_pylist()
        for text in (t for t in texts if t is not None):
            fake.generations[node.document_prompt(tuple(TOKENIZER.encode(text)))] = TOKENIZER.encode(
                KeywordExecution.generated(node, text))
        rows = query.run().to_rows()
    assert rows == keyword.sql(sql).run().to_rows()
    assert any(row[list(row)[1]] is not None for row in rows)
