"""Exactness of the native executor: every answer equals a naive evaluation of its full prompt.

The naive reference (naive_reference.NaiveModel) is Hugging Face transformers, fp32, eager attention, one
plain forward pass over the full canonical prompt of each (document, predicate) or tuple — no
packing, no KV reuse, no rewinds. The engine runs the same tiny Qwen3 / Gemma 3 checkpoints (Gemma
with a 16-token sliding window; every document is longer) in fp32 with forward-pass budgets small
enough to force many packed passes. For every query we check

* each answer's raw margin (and score / label log-probability) within TOL of the naive one, and
  the answer itself equal to the naive answer;
* which (document, stage) / tuple the engine evaluated, against the semantics (stage k+1 only for
  documents TRUE at stage k; every candidate pair of a full join);
* the final rows, against a plain nested-loop evaluation of the query over the naive answers.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pytest
import torch
from naive_reference import WINDOW, NaiveModel, TinyModel

import quail
from quail.logical.expressions import AiPredicate, ColumnRef, Prompt
from quail.physical import nodes as ph
from quail.physical.graph import PhysicalGraph
from quail.prompts import filter_tail
from quail_native.executor import labels as labels_scheduler
from quail_native.models import kernels, projection
from quail_native.precision_rule import BF16_MARGIN

TOL = 1e-4
DEVICE = os.environ.get("QUAIL_TEST_DEVICE", "cpu")
"""The engine's device (dev/gpu-check.sh sets a CUDA one); the naive reference always runs on the CPU."""
KINDS = ("qwen2", "qwen3", "gemma3")
CHUNKS = (96, 160, 4096)
BQ = "bigquery"

# -- data: short reviews from the tokenizer's words, a few out-of-vocabulary words -------------------

REVIEWS = [
    "the acting is superb and the cast loved the music",
    "awful plot with boring dialogue and a zorblax ending",
    "a funny movie the story is fast and the score is great",
    "the ending is sad but the acting is superb",
    "boring boring the movie is slow and the plot is awful",
    "superb director with a great cast and funny dialogue",
    "the story is about one task loved the quokka music",
    "negative review the acting is awful and the scene is boring",
    "a sad movie with slow pacing and kerfuffle music",
    "the plot is fast the ending is superb the director is great",
    "hated the film the dialogue is awful and the story is slow",
    "funny and positive the movie has superb acting",
    "the music of the film is sad and the score is slow",
    "one review about the cast and serendipity",
    "great acting great music great plot the pacing is fast",
    "the scene is boring and the dialogue of the film is sad",
    "a positive review of the cast the ending is funny",
    "slow pacing and awful music the story is about hope",
    "the director loved the score and the sad ending",
    "the dialogue is fast and funny the plot is superb",
]
FILMS = ["f1", "f2", "f3", "f4"]
ASPECTS = ["the acting", "the music", "the plot", "the dialogue"]
GENRES = ["a sad story", "a funny film", "a fast movie"]
NOTES = [("f1", "great cast"), ("f1", "slow music"), ("f2", "boring plot"), ("f3", "sad ending"),
         ("f5", "superb director")]
STEPS = 6
TRACE_LOGS = [" ".join(REVIEWS[session * STEPS: session * STEPS + step + 1])
              for session in range(3) for step in range(STEPS)]
"""Cumulative traces: within a session each log is the previous one plus one more review."""

TABLES = {
    "reviews": pa.table({"id": [100 + i for i in range(len(REVIEWS))], "body": REVIEWS,
                         "film": [FILMS[i % len(FILMS)] for i in range(len(REVIEWS))]}),
    "aspects": pa.table({"aid": list(range(len(ASPECTS))), "aspect": ASPECTS}),
    "genres": pa.table({"gid": list(range(len(GENRES))), "description": GENRES}),
    "notes": pa.table({"nid": list(range(len(NOTES))), "film": [f for f, _ in NOTES], "note": [n for _, n in NOTES]}),
    "traces": pa.table({"tid": [500 + i for i in range(len(TRACE_LOGS))], "log": TRACE_LOGS}),
}
ID_COLUMNS = {"reviews": "id", "aspects": "aid", "genres": "gid", "notes": "nid", "traces": "tid"}
TEXT_COLUMNS = {"reviews": "body", "aspects": "aspect", "genres": "description", "notes": "note", "traces": "log"}
IDS = {name: table.column(ID_COLUMNS[name]).to_pylist() for name, table in TABLES.items()}
TEXTS = {name: table.column(TEXT_COLUMNS[name]).to_pylist() for name, table in TABLES.items()}
ALIASES = {"r": "reviews", "a": "aspects", "g": "genres", "n": "notes"}
N = len(REVIEWS)

ACTING = "Does the review praise the acting? {0}"
MUSIC = "Is {0} about the music?"
BORING = "Is the story of {0} boring?"
POSITIVE = "Is {0} a positive review?"
DISCUSS = "Does the review {0} discuss {1}?"
THREE = "Does {0} discuss {1} the way {2} would?"
AGREE = "Does {0} agree with {1}?"


def sql_prompt(template: str, *refs: str) -> str:
    return f"PROMPT('{template}', {', '.join(refs)})"


# -- running a query on the engine -------------------------------------------------------------------


@dataclass
class Run:
    """One query run (on a fresh session, or after another run on its session) and the naive reference."""

    session: quail.Session
    query: quail.Query
    result: quail.QueryResult | None
    naive: NaiveModel
    log: list[float]

    @property
    def graph(self) -> PhysicalGraph:
        return self.query.plan().graph

    @property
    def report(self) -> dict:
        assert self.result is not None
        return self.result.report

    def node(self, kind: type[ph.PhysicalNode]) -> ph.PhysicalNode:
        [node] = [n for n in self.graph.nodes if isinstance(n, kind)]
        return node

    def answers(self, node_id: str) -> list[dict]:
        assert self.result is not None
        return self.result.answer_tables[node_id].to_pylist()

    def metrics(self, node_id: str) -> dict:
        return self.report["node_metrics"][node_id]

    def rows(self) -> list[tuple]:
        assert self.result is not None
        return sorted(tuple(r.values()) for r in self.result.to_rows())

    def doc(self, alias: str, row: int) -> tuple[int, ...]:
        return self.naive.encode(TEXTS[self.query.aliases[alias]][row])

    def close(self) -> None:
        self.session.close()


Open = Callable[..., Run]


@pytest.fixture
def open_run(tiny_checkpoints: dict[str, TinyModel], naive_models: dict[str, NaiveModel],
             margin_log: list[float]) -> Iterator[Open]:
    """`open_run(kind, chunk, sql, dialect=..., order=..., run=True, tables=..., after=...)`."""
    runs: list[Run] = []

    def open_(kind: str, chunk: int, sql: str, *, dialect: str = "snowflake", order: str | None = None,
              run: bool = True, tables: dict[str, pa.Table] | None = None, after: Run | None = None,
              engine: dict | None = None) -> Run:
        """A fresh session on a freshly booted engine, or with `after` the session of an earlier run (its
        engine and KV state kept).

        `engine` adds EngineConfig fields (arena size, page size, prefix sharing, calibration — off unless
        given: the tiny models are base models, and raw decisions are margin > 0). The answer store is off:
        these tests check what the executor computes (test_native_answer_store.py checks what is stored).
        """
        if after is not None:
            session = after.session
        else:
            quail.release_engines()  # token accounting below counts from an empty arena
            tiny = tiny_checkpoints[kind]
            registry = quail.ExtensionRegistry.with_built_ins()
            registry.register_model(tiny.spec)
            fields = {"calibration": "off", "cache": "off", "device": DEVICE, "precision": "fp32", **(engine or {})}
            config = quail.EngineConfig(model=tiny.spec.name, chunk_tokens=chunk, **fields)
            session = quail.Session(config, registry=registry)
            for name, table in (tables or TABLES).items():
                session.register(name, quail.DocumentProvider.from_table(table, ID_COLUMNS[name]))
        query = session.sql(sql, dialect=dialect, order=order)
        current = Run(session, query, None, naive_models[kind], margin_log)
        runs.append(current)
        if run:
            current.result = query.run()
        return current

    yield open_
    for run in runs:
        run.close()


# -- the naive evaluation ----------------------------------------------------------------------------


def holds(predicate: AiPredicate, margin: float) -> bool:
    """The SQL meaning: AI_FILTER is TRUE iff margin > 0; AI.SCORE <op> v compares sigmoid(margin)."""
    if predicate.threshold is None:
        return margin > 0
    score = 1.0 / (1.0 + math.exp(-margin))
    op, value = predicate.threshold.op, predicate.threshold.value
    return {">=": score >= value, ">": score > value, "<=": score <= value, "<": score < value}[op]


def filter_margin(run: Run, node: ph.AiFilter, row: int, position: int) -> float:
    """Naive margin of the full prompt preamble + document + frame + question of one stage."""
    [stage] = [s for s in node.stages if s.predicate.position == position]
    tail = node.frame + stage.question
    canonical = {run.naive.encode(filter_tail(stage.predicate.prompt, layout=layout))
                 for layout in ("document_first", "examples_first")}  # the same text without examples
    assert tail in canonical, "the tail is not the canonical text"
    return run.naive.margin(node.preamble + run.doc(node.alias, row) + tail)


def join_margin(run: Run, node: ph.AiJoin, rows: dict[str, int]) -> float:
    """preamble + anchor doc + frame + Σ (label_j + partner doc j) + cue."""
    ids = node.preamble + run.doc(node.anchor.alias, rows[node.anchor.alias]) + node.frame
    for label, partner in zip(node.labels, node.partners, strict=True):
        ids += label + run.doc(partner.alias, rows[partner.alias])
    return run.naive.margin(ids + node.cue)


def check_filter_answers(run: Run, node: ph.AiFilter) -> dict[tuple[int, int], bool]:
    """Every evaluated (document, stage) equals naive; stage k+1 ran exactly for documents TRUE at k.

    Returns the naive answer of every (row, predicate position) over all rows.
    """
    documents = len(TEXTS[run.query.aliases[node.alias]])
    naive = {(row, s.predicate.position): holds(s.predicate, filter_margin(run, node, row, s.predicate.position))
             for row in range(documents) for s in node.stages}
    evaluated = set()
    for answer in run.answers(node.id):
        row, position = answer[node.alias], answer["predicate"]
        expected = filter_margin(run, node, row, position)
        run.log.append(abs(answer["margin"] - expected))
        assert answer["margin"] == pytest.approx(expected, abs=TOL), (row, position)
        assert answer["answer"] == naive[(row, position)], (row, position, expected)
        evaluated.add((row, position))
    assert len(evaluated) == len(run.answers(node.id)), "a (document, stage) was evaluated twice"
    should = set()
    for row in range(documents):
        for stage in node.stages:
            should.add((row, stage.predicate.position))
            if not naive[(row, stage.predicate.position)]:
                break
    assert evaluated == should
    return naive


def check_join_answers(run: Run, node: ph.AiJoin) -> dict[tuple[int, ...], bool]:
    """Every evaluated tuple equals naive; returns {tuple in answer-table column order: answer}."""
    table = run.result.answer_tables[node.id]  # type: ignore[union-attr]
    aliases = [c for c in table.column_names if c not in ("answer", "margin")]
    out = {}
    for answer in table.to_pylist():
        rows = {alias: answer[alias] for alias in aliases}
        expected = join_margin(run, node, rows)
        run.log.append(abs(answer["margin"] - expected))
        assert answer["margin"] == pytest.approx(expected, abs=TOL), rows
        assert answer["answer"] == holds(node.predicate, expected), (rows, expected)
        out[tuple(rows.values())] = answer["answer"]
    assert len(out) == table.num_rows, "a tuple was evaluated twice"
    return out


def check_filters_then_join(run: Run, filt: ph.AiFilter, join: ph.AiJoin) -> list[int]:
    """Filters on r, then r × every aspect: all answers naive, the join asked exactly the survivors' pairs,
    the rows those the naive answers give. Returns the surviving review rows."""
    naive = check_filter_answers(run, filt)
    survivors = [r for r in range(N) if all(naive[(r, s.predicate.position)] for s in filt.stages)]
    answers = check_join_answers(run, join)
    assert {t[0] for t in answers} == set(survivors) and len(answers) == len(survivors) * len(ASPECTS)
    expected = [(IDS["reviews"][r], IDS["aspects"][a]) for r in survivors for a in range(len(ASPECTS))
                if join_margin(run, join, {"r": r, "a": a}) > 0]
    assert run.rows() == sorted(expected)
    return survivors


def ids(alias: str, rows: Sequence[int]) -> list[int]:
    return [IDS[ALIASES[alias]][r] for r in rows]


# -- the reference itself has power ------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_naive_answers_depend_on_the_document_and_are_mixed(kind, naive_models, tiny_checkpoints):
    """Guards the tests' power: margins move with the document far beyond TOL, answers are mixed,
    and (Gemma) every document is longer than the window, whose size changes the answer."""
    naive = naive_models[kind]
    docs = [naive.encode(text) for text in REVIEWS]
    preamble = ((2,) if kind == "gemma3" else ()) + naive.encode("DOCUMENT:\n")
    tail = naive.encode(filter_tail(Prompt(ACTING, (ColumnRef("r", "body"),))))
    margins = [naive.margin(preamble + d + tail) for d in docs]
    spread = max(margins) - min(margins)
    assert spread > 1000 * TOL
    assert any(m > 0 for m in margins) and any(m < 0 for m in margins)
    if kind == "gemma3":
        assert min(len(d) for d in docs) > WINDOW
        from transformers import AutoModelForCausalLM

        wide = AutoModelForCausalLM.from_pretrained(tiny_checkpoints[kind].path, sliding_window=4096,
                                                    dtype=torch.float32, attn_implementation="eager").eval()
        with torch.no_grad():
            logits = wide(torch.tensor([list(preamble + docs[0] + tail)])).logits[0, -1]
        wide_margin = float(logits[naive.true_ids].max() - logits[naive.false_ids].max())
        assert abs(wide_margin - margins[0]) > 100 * TOL


# -- filters -----------------------------------------------------------------------------------------


ATTENTION_PATHS = ["as this CPU runs it", "torch's GEMMs"]
"""The fused attention kernel where it runs here, and the two GEMMs around a softmax every other CPU runs."""


def attend_by(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if path == "torch's GEMMs":
        monkeypatch.setattr(kernels, "attention", lambda *operands: False)


@pytest.mark.parametrize("attention", ATTENTION_PATHS)
@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("kind", KINDS)
def test_single_filter_answers_equal_naive(kind, chunk, attention, open_run, monkeypatch):
    attend_by(attention, monkeypatch)
    run = open_run(kind, chunk, f"SELECT r.id FROM reviews r WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')})")
    naive = check_filter_answers(run, run.node(ph.AiFilter))
    assert run.rows() == sorted((i,) for i in ids("r", [r for r in range(N) if naive[(r, 0)]]))
    if chunk < 4096:
        assert run.metrics("filter_r")["chunks"] > 1


BF16_TOL = 0.25
"""bf16 margins vs the fp32 naive reference (README: precision); a decision may differ only within it."""


@pytest.mark.parametrize("attention", ATTENTION_PATHS)
@pytest.mark.parametrize("kind", KINDS)
def test_bf16_margins_stay_within_the_documented_tolerance_of_fp32(kind, attention, open_run, monkeypatch):
    """Both attention paths: the fused kernel where this CPU has AVX-512 BF16, and the GEMMs every other CPU
    runs in bf16."""
    attend_by(attention, monkeypatch)
    sql = (f"SELECT r.id FROM reviews r WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')}) "
           f"AND AI_FILTER({sql_prompt(MUSIC, 'r.body')})")
    run = open_run(kind, 160, sql, engine={"precision": "bf16"})
    node = run.node(ph.AiFilter)
    worst = 0.0
    for answer in run.answers(node.id):
        expected = filter_margin(run, node, answer[node.alias], answer["predicate"])
        worst = max(worst, abs(answer["margin"] - expected))
        if abs(expected) > BF16_TOL:
            assert answer["answer"] == (expected > 0)
    print(f"\n[{kind} bf16] worst |margin − fp32 naive| {worst:.3g} over {len(run.answers(node.id))} answers")
    assert worst <= BF16_TOL
    assert run.report["engine"][0] == "native engine computes in bf16 as configured"


def test_auto_precision_names_its_choice_and_the_probe_in_the_report(open_run):
    run = open_run("qwen3", 4096, f"SELECT r.id FROM reviews r WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')})",
                   engine={"precision": "auto"})
    note, *others = run.report["engine"]
    if DEVICE != "cpu":
        assert not others
        assert note == "native engine computes in bf16 (auto on CUDA)"
        return
    found = re.search(r"in (\w+) \(auto: .* measured bf16 ([\d.e+-]+) vs fp32 ([\d.e+-]+) GFLOP/s", note)
    assert found, note
    chosen, bf16, fp32 = found.group(1), float(found.group(2)), float(found.group(3))
    # The note prints three significant digits: within their rounding of the margin either choice is right.
    ratio, rounding = bf16 / (BF16_MARGIN * fp32), 0.01
    if abs(ratio - 1) > rounding:
        assert chosen == ("bf16" if ratio > 1 else "fp32"), note
    dtype = torch.bfloat16 if chosen == "bf16" else torch.float32
    assert others == [f"elementwise work: {kernels.status().detail}",
                      f"projections: {projection.describe(torch.device('cpu'), dtype)}",
                      f"attention: {kernels.attention_status(dtype)}"]


@pytest.mark.parametrize("order", ["by_cost", "as_written"])
@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("kind", KINDS)
def test_three_filters_rewind_to_question_tails(kind, chunk, order, open_run):
    """Later stages compute only their question tails over the kept document + frame KV."""
    sql = (f"SELECT r.id FROM reviews r WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')}) "
           f"AND AI_FILTER({sql_prompt(MUSIC, 'r.body')}) AND AI_FILTER({sql_prompt(POSITIVE, 'r.body')})")
    run = open_run(kind, chunk, sql, order=order)
    node = run.node(ph.AiFilter)
    if order == "as_written":
        assert [s.predicate.position for s in node.stages] == [0, 1, 2]
    naive = check_filter_answers(run, node)
    survivors = [r for r in range(N) if all(naive[(r, p)] for p in (0, 1, 2))]
    assert run.rows() == sorted((i,) for i in ids("r", survivors))
    # fresh tokens: the preamble once, each document + frame + first question once, later stages their tails
    questions = {s.predicate.position: len(s.question) for s in node.stages}
    first = node.stages[0].predicate.position
    expected = len(node.preamble)
    for answer in run.answers(node.id):
        expected += questions[answer["predicate"]]
        if answer["predicate"] == first:
            expected += len(run.doc("r", answer["r"])) + len(node.frame)
    metrics = run.metrics(node.id)
    assert metrics["fresh_tokens"] == expected
    assert any(a["predicate"] != first for a in run.answers(node.id)), "no document reached a later stage"
    if chunk < 4096:
        assert metrics["chunks"] > 1


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("kind", KINDS)
def test_score_threshold_filters_compare_sigmoid_of_naive_margin(kind, chunk, open_run):
    sql = (f"SELECT r.id FROM reviews r WHERE AI.SCORE({sql_prompt(ACTING, 'r.body')}) >= 0.5 "
           f"AND AI.SCORE({sql_prompt(BORING, 'r.body')}) < 0.6")
    run = open_run(kind, chunk, sql, dialect=BQ, order="as_written")
    naive = check_filter_answers(run, run.node(ph.AiFilter))
    assert run.rows() == sorted((i,) for i in ids("r", [r for r in range(N) if naive[(r, 0)] and naive[(r, 1)]]))


# -- joins -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("attention", ATTENTION_PATHS)
@pytest.mark.parametrize("anchor", [None, "r", "a"])
@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("kind", KINDS)
def test_full_join_answers_equal_naive(kind, chunk, anchor, attention, open_run, monkeypatch):
    """Every review × aspect pair is evaluated once; each anchor's document + frame is computed once."""
    attend_by(attention, monkeypatch)
    options = f", {{'anchor': '{anchor}'}}" if anchor else ""
    sql = (f"SELECT r.id, a.aid FROM reviews r JOIN aspects a "
           f"ON AI_FILTER({sql_prompt(DISCUSS, 'r.body', 'a.aspect')}{options})")
    run = open_run(kind, chunk, sql)
    node = run.node(ph.AiJoin)
    if anchor:
        assert node.anchor.alias == anchor
    answers = check_join_answers(run, node)
    assert set(answers) == {(r, a) for r in range(N) for a in range(len(ASPECTS))}
    expected = [(IDS["reviews"][r], IDS["aspects"][a]) for r in range(N) for a in range(len(ASPECTS))
                if join_margin(run, node, {"r": r, "a": a}) > 0]
    assert run.rows() == sorted(expected)
    anchors = {t[0 if node.anchor.alias == "r" else 1] for t in answers}
    partner = node.partners[0].alias
    fresh = len(node.preamble) + sum(len(run.doc(node.anchor.alias, x)) + len(node.frame) for x in anchors)
    fresh += sum(len(node.labels[0]) + len(run.doc(partner, t[0 if partner == "r" else 1])) + len(node.cue)
                 for t in answers)
    metrics = run.metrics(node.id)
    assert metrics["fresh_tokens"] == fresh
    if chunk < 4096:
        assert metrics["chunks"] > 1
    else:  # the preamble, every anchor's prefix and every candidate read from it: one pass
        assert fresh <= chunk and metrics["chunks"] == 1


@pytest.mark.parametrize("anchor", [None, "r"])
@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("kind", KINDS)
def test_join_after_filters_reuses_survivor_kv(kind, chunk, anchor, open_run):
    options = f", {{'anchor': '{anchor}'}}" if anchor else ""
    sql = (f"SELECT r.id, a.aid FROM reviews r JOIN aspects a "
           f"ON AI_FILTER({sql_prompt(DISCUSS, 'r.body', 'a.aspect')}{options}) "
           f"WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')}) AND AI_FILTER({sql_prompt(POSITIVE, 'r.body')})")
    run = open_run(kind, chunk, sql)
    filt, join = run.node(ph.AiFilter), run.node(ph.AiJoin)
    survivors = check_filters_then_join(run, filt, join)
    metrics = run.metrics(join.id)
    if anchor == "r":
        assert join.anchor.alias == "r" and filt.retain_kv
    if filt.retain_kv and join.anchor.alias == "r":
        assert metrics["kv_hits"] == len(survivors) > 0 and metrics["kv_misses"] == 0
        # no document recomputed: per anchor its frame, per pair its suffix
        suffixes = sum(len(join.labels[0]) + len(run.doc("a", a)) + len(join.cue)
                       for _ in survivors for a in range(len(ASPECTS)))
        assert metrics["fresh_tokens"] == len(survivors) * len(join.frame) + suffixes


@pytest.mark.parametrize("kind", KINDS)
def test_a_warm_session_answers_a_repeated_query_exactly(kind, open_run):
    """The second run of a filter → join query reuses the session's arena and preamble KV, and is still exact."""
    sql = (f"SELECT r.id, a.aid FROM reviews r JOIN aspects a "
           f"ON AI_FILTER({sql_prompt(DISCUSS, 'r.body', 'a.aspect')}, {{'anchor': 'r'}}) "
           f"WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')})")
    first = open_run(kind, 96, sql)
    second = open_run(kind, 96, sql, after=first)
    for run in (first, second):
        check_filter_answers(run, run.node(ph.AiFilter))
        check_join_answers(run, run.node(ph.AiJoin))
    assert second.rows() == first.rows()
    assert second.report["boot_kind"] == "warm"


@pytest.mark.parametrize("kind", KINDS)
def test_kv_kept_for_a_join_never_leaks_into_the_next_query(kind, open_run):
    films = TABLES["reviews"].column("film").to_pylist()
    orphans = [r for r in range(N) if films[r] not in {f for f, _ in NOTES}]
    assert 3 in orphans and len(NOTES) > 3  # review 3 has no note; notes has a row 3
    first = open_run(kind, 96, f"SELECT r.id, n.nid FROM reviews r JOIN notes n ON r.film = n.film AND "
                               f"AI_FILTER({sql_prompt(AGREE, 'r.body', 'n.note')}, {{'anchor': 'r'}}) "
                               f"WHERE AI_FILTER({sql_prompt(POSITIVE, 'r.body')})")
    survivors = [a["r"] for a in first.answers("filter_r") if a["answer"]]
    assert 3 in survivors  # so its document KV was kept for the join, which never anchors on it
    second = open_run(kind, 96, f"SELECT r.nid, a.aid FROM notes r JOIN aspects a "
                                f"ON AI_FILTER({sql_prompt(DISCUSS, 'r.note', 'a.aspect')}, {{'anchor': 'r'}})",
                      after=first)
    check_join_answers(second, second.node(ph.AiJoin))
    assert second.metrics("join_0")["kv_hits"] == 0


EXISTS_SCORE = {"qwen2": 0.8, "qwen3": 0.6, "gemma3": 0.9}  # thresholds that leave some reviews without a match


@pytest.mark.parametrize("condition", ["filter", "score"])
@pytest.mark.parametrize("negated", [False, True])
@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("kind", KINDS)
def test_exists_and_not_exists_follow_nested_loop_semantics(kind, chunk, negated, condition, open_run):
    """Evaluated tuples equal naive; a review is kept iff (not) any aspect holds, by nested loops."""
    if condition == "filter":
        inner = f"AI.IF({sql_prompt(DISCUSS, 'r.body', 'a.aspect')})"
    else:
        inner = f"AI.SCORE({sql_prompt(DISCUSS, 'r.body', 'a.aspect')}) >= {EXISTS_SCORE[kind]}"
    sql = (f"SELECT r.id FROM reviews r WHERE {'NOT ' if negated else ''}EXISTS "
           f"(SELECT 1 FROM aspects a WHERE {inner})")
    run = open_run(kind, chunk, sql, dialect=BQ)
    node = run.node(ph.AiJoin)
    check_join_answers(run, node)
    matched = [r for r in range(N)
               if any(holds(node.predicate, join_margin(run, node, {"r": r, "a": a})) for a in range(len(ASPECTS)))]
    keep = [r for r in range(N) if (r in matched) != negated]
    assert run.rows() == sorted((i,) for i in ids("r", keep))


@pytest.mark.parametrize("chunk", (160, 4096))
@pytest.mark.parametrize("kind", KINDS)
def test_three_table_prompt_answers_equal_naive(kind, chunk, open_run):
    sql = (f"SELECT r.id, a.aid, g.gid FROM reviews r CROSS JOIN aspects a CROSS JOIN genres g "
           f"WHERE AI_FILTER({sql_prompt(THREE, 'r.body', 'a.aspect', 'g.description')})")
    run = open_run(kind, chunk, sql)
    node = run.node(ph.AiJoin)
    answers = check_join_answers(run, node)
    table = run.result.answer_tables[node.id]
    order = [c for c in table.column_names if c not in ("answer", "margin")]
    every = [(r, a, g) for r in range(N) for a in range(len(ASPECTS)) for g in range(len(GENRES))]
    as_columns = {tuple(dict(zip("rag", t, strict=True))[alias] for alias in order) for t in every}
    assert set(answers) == as_columns
    expected = [(IDS["reviews"][r], IDS["aspects"][a], IDS["genres"][g]) for r, a, g in every
                if join_margin(run, node, {"r": r, "a": a, "g": g}) > 0]
    assert run.rows() == sorted(expected)


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("kind", KINDS)
def test_equality_restricted_join_evaluates_only_matching_pairs(kind, chunk, open_run):
    sql = (f"SELECT r.id, n.nid FROM reviews r JOIN notes n "
           f"ON r.film = n.film AND AI_FILTER({sql_prompt(AGREE, 'r.body', 'n.note')})")
    run = open_run(kind, chunk, sql)
    node = run.node(ph.AiJoin)
    answers = check_join_answers(run, node)
    films = TABLES["reviews"].column("film").to_pylist()
    pairs = [(r, n) for r in range(N) for n in range(len(NOTES)) if films[r] == NOTES[n][0]]
    table = run.result.answer_tables[node.id]
    first = next(c for c in table.column_names if c not in ("answer", "margin"))
    assert set(answers) == {p if first == "r" else p[::-1] for p in pairs}
    expected = [(IDS["reviews"][r], IDS["notes"][n]) for r, n in pairs if join_margin(run, node, {"r": r, "n": n}) > 0]
    assert run.rows() == sorted(expected)


# -- classify and score ------------------------------------------------------------------------------

LABELS = ("awful plot", "awful music", "boring story")  # chosen: mixed for both tiny models
CLASSIFY_SQL = (f"SELECT r.id, AI.CLASSIFY(r.body, [{', '.join(repr(x) for x in LABELS)}]) AS topic FROM reviews r "
                f"WHERE topic IN ('{LABELS[0]}', '{LABELS[2]}')")


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("kind", KINDS)
def test_classify_picks_the_label_of_highest_naive_log_probability(kind, chunk, open_run):
    run = open_run(kind, chunk, CLASSIFY_SQL, dialect=BQ)
    assert_classify_matches_naive(run)
    if chunk == CHUNKS[-1]:  # labels' later tokens ride in their document's pass: everything in one
        assert run.metrics(run.node(ph.AiClassify).id)["chunks"] == 1


@pytest.mark.parametrize("kind", KINDS)
def test_classify_reads_a_pass_in_slices_of_read_rows_exactly(kind, open_run, monkeypatch):
    """A pass's label rows are read in slices (READ_ROWS bounds the logits held at once): one row per
    slice gives the same answers."""
    monkeypatch.setattr(labels_scheduler, "READ_ROWS", 1)
    assert_classify_matches_naive(open_run(kind, CHUNKS[-1], CLASSIFY_SQL, dialect=BQ))


def assert_classify_matches_naive(run) -> None:
    node = run.node(ph.AiClassify)
    assert all(len(t) > 1 for t in node.label_tokens), "the labels must be multi-token"
    chosen = {}
    for answer in run.answers(node.id):
        prompt = node.preamble + run.doc("r", answer["r"]) + node.tail
        scores = [run.naive.label_log_prob(prompt, label) for label in node.label_tokens]
        for got, want in zip(answer["margins"], scores, strict=True):
            run.log.append(abs(got - want))
            assert got == pytest.approx(want, abs=TOL), answer["r"]
        best = max(range(len(scores)), key=lambda k: (scores[k], -k))
        assert answer["topic"] == LABELS[best], (answer["r"], scores)
        chosen[answer["r"]] = LABELS[best]
    assert sorted(chosen) == list(range(N))
    assert len(set(chosen.values())) > 1, "every review got the same label"
    keep = [r for r in range(N) if chosen[r] in (LABELS[0], LABELS[2])]
    assert run.rows() == sorted((IDS["reviews"][r], chosen[r]) for r in keep)


@pytest.mark.parametrize("kind", KINDS)
def test_bf16_label_log_probabilities_stay_within_the_documented_tolerance_of_fp32(kind, open_run):
    """A bf16 head is multiplied in bf16 over the whole vocabulary (not converted whole per row); the
    answer's own logits and the largest ones are recomputed in fp32, so the bf16 tolerance still holds —
    per label token, as a label's log-probability is the sum of one per token (README: precision)."""
    labels = ", ".join(f"'{x}'" for x in LABELS)
    run = open_run(kind, 160, f"SELECT r.id, AI.CLASSIFY(r.body, [{labels}]) AS topic FROM reviews r",
                   dialect=BQ, engine={"precision": "bf16"})
    node = run.node(ph.AiClassify)
    worst = 0.0
    for answer in run.answers(node.id):
        prompt = node.preamble + run.doc("r", answer["r"]) + node.tail
        scores = [run.naive.label_log_prob(prompt, label) for label in node.label_tokens]
        worst = max(worst, *(abs(got - want) / len(label)
                             for got, want, label in zip(answer["margins"], scores, node.label_tokens, strict=True)))
        ranked = sorted(scores, reverse=True)
        if ranked[0] - ranked[1] > 2 * BF16_TOL * max(map(len, node.label_tokens)):
            assert answer["topic"] == LABELS[scores.index(ranked[0])]
    print(f"\n[{kind} bf16] worst |label log-probability − fp32 naive| per label token {worst:.3g}")
    assert worst <= BF16_TOL


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("kind", KINDS)
def test_score_in_select_is_sigmoid_of_naive_margin(kind, chunk, open_run):
    sql = f"SELECT r.id, AI.SCORE({sql_prompt(POSITIVE, 'r.body')}) AS positivity FROM reviews r"
    run = open_run(kind, chunk, sql, dialect=BQ)
    node = run.node(ph.AiScore)
    scores = {}
    for answer in run.answers(node.id):
        margin = run.naive.margin(node.preamble + run.doc("r", answer["r"]) + node.question)
        run.log.append(abs(answer["margin"] - margin))
        assert answer["margin"] == pytest.approx(margin, abs=TOL)
        assert answer["positivity"] == pytest.approx(1.0 / (1.0 + math.exp(-margin)), abs=TOL)
        scores[IDS["reviews"][answer["r"]]] = answer["positivity"]
    assert sorted(scores) == IDS["reviews"]
    assert run.rows() == sorted(scores.items())


@pytest.mark.parametrize("kind", KINDS)
def test_a_question_first_score_and_filter_answer_as_naive(kind, open_run):
    """The question stated once before the documents (question_first="on"): every answer equals a plain forward of
    that full prompt — the preamble holding the question, then the document, then the short cue."""
    sql = (f"SELECT r.id, AI.SCORE({sql_prompt(POSITIVE, 'r.body')}) AS positivity FROM reviews r "
           f"WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')})")
    run = open_run(kind, 160, sql, dialect=BQ, engine={"question_first": "on"})
    score, filter_ = run.node(ph.AiScore), run.node(ph.AiFilter)
    assert b"QUESTION" in bytes(run.naive.decode(score.preamble), "utf-8")
    for answer in run.answers(score.id):
        margin = run.naive.margin(score.preamble + run.doc("r", answer["r"]) + score.question)
        run.log.append(abs(answer["margin"] - margin))
        assert answer["margin"] == pytest.approx(margin, abs=TOL)
    for answer in run.answers(filter_.id):
        margin = run.naive.margin(filter_.prompt(run.doc("r", answer["r"]), 0))
        assert answer["margin"] == pytest.approx(margin, abs=TOL)


SHOTS = "{'examples': [('the acting is superb', TRUE), ('awful music and a boring plot', FALSE)]}"
OTHER_SHOTS = "{'examples': [('a funny film', TRUE)]}"


@pytest.mark.parametrize("chunk", (160, 4096))
@pytest.mark.parametrize("kind", KINDS)
def test_filters_with_shared_examples_read_them_first_and_answer_as_naive(kind, chunk, open_run):
    """Two filters with the same examples: the planner puts them first, in the preamble every document shares
    (computed once), and every answer equals a plain forward of that full prompt."""
    sql = (f"SELECT r.id FROM reviews r WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')}, {SHOTS}) "
           f"AND AI_FILTER({sql_prompt(POSITIVE, 'r.body')}, {SHOTS})")
    run = open_run(kind, chunk, sql)
    node = run.node(ph.AiFilter)
    assert isinstance(node, ph.AiFilter)
    text = run.naive.decode(node.preamble)
    assert "EXAMPLE 1:\nthe acting is superb\nANSWER: TRUE" in text and text.endswith("DOCUMENT:\n")
    assert not any("EXAMPLE" in run.naive.decode(node.frame + s.question) for s in node.stages)
    assert any("examples of the filters on r: first" in r for r in run.query.plan().remarks)
    check_filter_answers(run, node)
    assert run.report["fresh_tokens"] <= 1.02 * run.report["minimum_tokens"]


@pytest.mark.parametrize("kind", KINDS)
def test_filters_with_different_examples_read_them_after_the_document(kind, open_run):
    sql = (f"SELECT r.id FROM reviews r WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')}, {SHOTS}) "
           f"AND AI_FILTER({sql_prompt(POSITIVE, 'r.body')}, {OTHER_SHOTS})")
    run = open_run(kind, 160, sql)
    node = run.node(ph.AiFilter)
    assert isinstance(node, ph.AiFilter)
    assert "EXAMPLE" not in run.naive.decode(node.preamble)
    tails = {s.predicate.position: run.naive.decode(node.frame + s.question) for s in node.stages}
    assert "EXAMPLE 1:\nthe acting is superb\nANSWER: TRUE" in tails[0] and "a funny film" in tails[1]
    assert any("after each document (its questions carry different examples" in r for r in run.query.plan().remarks)
    check_filter_answers(run, node)


@pytest.mark.parametrize("kind", KINDS)
def test_score_with_examples_is_sigmoid_of_naive_margin(kind, open_run):
    sql = f"SELECT r.id, AI.SCORE({sql_prompt(POSITIVE, 'r.body')}, {SHOTS}) AS positivity FROM reviews r"
    run = open_run(kind, 160, sql, dialect=BQ)
    node = run.node(ph.AiScore)
    assert isinstance(node, ph.AiScore) and "EXAMPLE 2:" in run.naive.decode(node.preamble)
    for answer in run.answers(node.id):
        margin = run.naive.margin(node.preamble + run.doc("r", answer["r"]) + node.question)
        run.log.append(abs(answer["margin"] - margin))
        assert answer["positivity"] == pytest.approx(1.0 / (1.0 + math.exp(-margin)), abs=TOL)


# -- cost: fresh tokens at the minimum, refusals at plan time ----------------------------------------


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("kind", KINDS)
def test_fresh_tokens_stay_within_two_percent_of_minimum(kind, chunk, open_run):
    sql = (f"SELECT r.id, a.aid FROM reviews r JOIN aspects a "
           f"ON AI_FILTER({sql_prompt(DISCUSS, 'r.body', 'a.aspect')}) "
           f"WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')}) AND AI_FILTER({sql_prompt(MUSIC, 'r.body')})")
    run = open_run(kind, chunk, sql)
    report = run.report
    assert report["minimum_tokens"] > 0
    assert report["fresh_tokens"] <= 1.02 * report["minimum_tokens"], (report["fresh_tokens"],
                                                                        report["minimum_tokens"])


LONG = " ".join(["the acting is superb and the plot is boring"] * 12)


def long_tables() -> dict[str, pa.Table]:
    reviews = TABLES["reviews"]
    body = reviews.column("body").to_pylist()
    body[3] = LONG
    return {**TABLES, "reviews": reviews.set_column(1, "body", pa.array(body))}


LONG_QUERIES = {
    "filter": (f"SELECT r.id FROM reviews r WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')})", "snowflake"),
    "score": (f"SELECT r.id, AI.SCORE({sql_prompt(POSITIVE, 'r.body')}) AS s FROM reviews r", BQ),
    "classify": ("SELECT r.id, AI.CLASSIFY(r.body, ['awful plot', 'boring story']) AS t FROM reviews r", BQ),
    "join": (f"SELECT r.id, a.aid FROM reviews r JOIN aspects a "
             f"ON AI_FILTER({sql_prompt(DISCUSS, 'r.body', 'a.aspect')})", "snowflake"),
    "exists": (f"SELECT r.id FROM reviews r WHERE EXISTS (SELECT 1 FROM aspects a "
               f"WHERE AI_FILTER({sql_prompt(DISCUSS, 'r.body', 'a.aspect')}))", "snowflake"),
}


def refusal_of(run: Run) -> quail.RefusalError:
    with pytest.raises(quail.RefusalError) as error:
        run.query.plan()
    with pytest.raises(quail.RefusalError):
        run.query.run()
    return error.value


@pytest.mark.parametrize("form", ["filter", "score", "classify"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_document_longer_than_the_chunk_is_refused_at_plan_time(kind, form, open_run):
    sql, dialect = LONG_QUERIES[form]
    error = refusal_of(open_run(kind, 96, sql, dialect=dialect, run=False, tables=long_tables()))
    assert error.refusal.available == 96 and error.refusal.needed is not None and error.refusal.needed > 96
    assert "needed" in str(error) and "available 96" in str(error)


@pytest.mark.parametrize("form", ["join", "exists"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_join_over_a_document_longer_than_the_chunk_is_refused_naming_needed_tokens(kind, form, open_run):
    sql, dialect = LONG_QUERIES[form]
    error = refusal_of(open_run(kind, 96, sql, dialect=dialect, run=False, tables=long_tables()))
    assert error.refusal.available == 96
    assert error.refusal.needed is not None and error.refusal.needed > 96, str(error)


@pytest.mark.parametrize("kind", KINDS)
def test_two_joins_sharing_an_anchor_compute_its_documents_once(kind, open_run):
    """The first join keeps each anchor's document KV; the second reuses it and stays exact."""
    sql = (f"SELECT r.id, a.aid, m.aid FROM reviews r "
           f"JOIN aspects a ON AI_FILTER({sql_prompt(DISCUSS, 'r.body', 'a.aspect')}, {{'anchor': 'r'}}) "
           f"JOIN aspects m ON AI_FILTER({sql_prompt(DISCUSS, 'r.body', 'm.aspect')}, {{'anchor': 'r'}})")
    run = open_run(kind, 4096, sql)
    first, second = sorted((n for n in run.graph.nodes if isinstance(n, ph.AiJoin)),
                           key=lambda n: n.retain_anchor_kv, reverse=True)
    assert first.retain_anchor_kv and not second.retain_anchor_kv
    check_join_answers(run, first)
    check_join_answers(run, second)
    anchors = {row["r"] for row in run.answers(second.id)}
    metrics = run.metrics(second.id)
    assert metrics["kv_hits"] == len(anchors) > 0 and metrics["kv_misses"] == 0
    report = run.report
    assert report["fresh_tokens"] <= 1.02 * report["minimum_tokens"]


# -- the paged arena: evictions under a tiny budget, cross-document prefix sharing -------------------

PAGE = 4


def arena_bytes(tiny: TinyModel, pages: int) -> int:
    """A KV budget of `pages` pages of PAGE tokens for the tiny model in fp32."""
    spec = tiny.spec
    return pages * PAGE * 2 * spec.layers * spec.kv_heads * spec.head_dim * 4


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_tiny_arena_evicts_kept_kv_and_recomputes_it_exactly(kind, chunk, open_run, tiny_checkpoints):
    """Survivors' KV kept for the join does not fit 24 pages: the lowest-priority documents are evicted,
    the join recomputes them, and every answer still equals naive."""
    sql = (f"SELECT r.id, a.aid FROM reviews r JOIN aspects a "
           f"ON AI_FILTER({sql_prompt(DISCUSS, 'r.body', 'a.aspect')}, {{'anchor': 'r'}}) "
           f"WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')}) AND AI_FILTER({sql_prompt(POSITIVE, 'r.body')})")
    engine = {"kv_page_tokens": PAGE, "kv_budget_bytes": arena_bytes(tiny_checkpoints[kind], 24)}
    run = open_run(kind, chunk, sql, engine=engine)
    filt, join = run.node(ph.AiFilter), run.node(ph.AiJoin)
    survivors = check_filters_then_join(run, filt, join)
    kv = run.report["kv"]
    assert filt.retain_kv and kv["evictions"] > 0 and kv["recomputed_tokens"] > 0, kv
    join_metrics = run.metrics(join.id)
    assert join_metrics["kv_hits"] + join_metrics["kv_misses"] == len(survivors)
    assert join_metrics["kv_misses"] > 0 and join_metrics["recomputed_tokens"] > 0, join_metrics


@pytest.mark.parametrize("kind", KINDS)
def test_an_arena_smaller_than_one_document_is_refused_naming_pages(kind, open_run, tiny_checkpoints):
    sql = f"SELECT r.id FROM reviews r WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')}) " \
          f"AND AI_FILTER({sql_prompt(POSITIVE, 'r.body')})"
    engine = {"kv_page_tokens": PAGE, "kv_budget_bytes": arena_bytes(tiny_checkpoints[kind], 3)}
    with pytest.raises(quail.RefusalError, match=r"needed \d+ pages of 4 tokens"):
        open_run(kind, 4096, sql, engine=engine)


def trace_filter_sql(filters: int) -> str:
    questions = [sql_prompt(BORING, "t.log"), sql_prompt(POSITIVE, "t.log")][:filters]
    return "SELECT t.tid FROM traces t WHERE " + " AND ".join(f"AI_FILTER({q})" for q in questions)


@pytest.mark.parametrize("filters", (1, 2))
@pytest.mark.parametrize("chunk", (256, 4096))
@pytest.mark.parametrize("kind", KINDS)
def test_prefix_sharing_on_cumulative_traces_is_exact_and_skips_every_borrowed_token(kind, chunk, filters,
                                                                                     open_run):
    from quail.planner.prefixes import plan_borrows

    sql = trace_filter_sql(filters)
    shared = open_run(kind, chunk, sql, engine={"kv_page_tokens": PAGE, "prefix_sharing": "on"})
    plain = open_run(kind, chunk, sql, engine={"kv_page_tokens": PAGE, "prefix_sharing": "off"})
    assert shared.node(ph.AiFilter).share_prefixes and not plain.node(ph.AiFilter).share_prefixes
    check_filter_answers(shared, shared.node(ph.AiFilter))
    check_filter_answers(plain, plain.node(ph.AiFilter))
    assert shared.rows() == plain.rows()
    _, borrows = plan_borrows({r: shared.doc("t", r) for r in range(len(TRACE_LOGS))}, PAGE)
    borrowed = sum(b.tokens for b in borrows.values())
    assert borrowed > 0
    assert plain.report["fresh_tokens"] - shared.report["fresh_tokens"] == borrowed
    # a borrower recomputes nothing its lender holds (token-granular; an earlier step of a trace computes none of
    # its document): beyond the minimum only a document with no prefix of a page to borrow, less than a page
    lenders_only = len(TRACE_LOGS) - len(borrows)
    assert any(b.tokens == len(shared.doc("t", b.row)) for b in borrows.values()), "a whole document is borrowed"
    assert shared.report["minimum_tokens"] <= shared.report["fresh_tokens"] \
        <= shared.report["minimum_tokens"] + (PAGE - 1) * lenders_only
    if chunk == 4096:  # everything fits one pass: borrowers ride in their lenders' pass, not one after it
        node = shared.node(ph.AiFilter).id
        assert shared.metrics(node)["chunks"] == plain.metrics(plain.node(ph.AiFilter).id)["chunks"]


@pytest.mark.parametrize("chunk", (256, 4096))
@pytest.mark.parametrize("kind", KINDS)
def test_join_anchors_borrow_shared_prefixes_exactly_and_skip_every_borrowed_token(kind, chunk, open_run):
    """Cumulative traces as join anchors: each borrows its lender anchor's prefix and computes only its tail."""
    from quail.planner.prefixes import plan_borrows

    sql = (f"SELECT t.tid, a.aid FROM traces t "
           f"JOIN aspects a ON AI_FILTER({sql_prompt(DISCUSS, 't.log', 'a.aspect')}, {{'anchor': 't'}})")
    shared = open_run(kind, chunk, sql, engine={"kv_page_tokens": PAGE, "prefix_sharing": "on"})
    plain = open_run(kind, chunk, sql, engine={"kv_page_tokens": PAGE, "prefix_sharing": "off"})
    join = shared.node(ph.AiJoin)
    assert join.share_prefixes and not plain.node(ph.AiJoin).share_prefixes
    assert check_join_answers(shared, join) == check_join_answers(plain, plain.node(ph.AiJoin))
    assert shared.rows() == plain.rows()
    _, borrows = plan_borrows({r: shared.doc("t", r) for r in range(len(TRACE_LOGS))}, PAGE)
    borrowed = sum(b.tokens for b in borrows.values())
    assert borrowed > 0
    assert plain.report["fresh_tokens"] - shared.report["fresh_tokens"] == borrowed
    assert any("join anchors on t borrow shared document prefixes" in r for r in shared.report["remarks"])
    if chunk == 4096:  # every anchor fits one pass: borrowers ride in their lenders' pass, not one after it
        assert shared.metrics(join.id)["chunks"] == plain.metrics(plain.node(ph.AiJoin).id)["chunks"]


@pytest.mark.parametrize("pages", (50, 80))
@pytest.mark.parametrize("kind", KINDS)
def test_join_anchors_borrowing_stay_exact_in_an_arena_barely_larger_than_one_anchor(kind, pages, open_run,
                                                                                      tiny_checkpoints):
    sql = (f"SELECT t.tid, a.aid FROM traces t "
           f"JOIN aspects a ON AI_FILTER({sql_prompt(DISCUSS, 't.log', 'a.aspect')}, {{'anchor': 't'}})")
    engine = {"kv_page_tokens": PAGE, "prefix_sharing": "on",
              "kv_budget_bytes": arena_bytes(tiny_checkpoints[kind], pages)}
    run = open_run(kind, 256, sql, engine=engine)
    assert run.node(ph.AiJoin).share_prefixes
    check_join_answers(run, run.node(ph.AiJoin))


@pytest.mark.parametrize("pages", (50, 64, 80))
@pytest.mark.parametrize("kind", KINDS)
def test_prefix_sharing_survives_a_tiny_arena(kind, pages, open_run, tiny_checkpoints):
    """Borrowed pages pinned for waiting documents and survivors kept for the join compete for 50–80
    pages: evicted ones are recomputed, and every answer stays exact."""
    engine = {"kv_page_tokens": PAGE, "prefix_sharing": "on",
              "kv_budget_bytes": arena_bytes(tiny_checkpoints[kind], pages)}
    sql = (f"SELECT t.tid, a.aid FROM traces t JOIN aspects a "
           f"ON AI_FILTER({sql_prompt(DISCUSS, 't.log', 'a.aspect')}, {{'anchor': 't'}}) "
           f"WHERE AI_FILTER({sql_prompt(BORING, 't.log')}) AND AI_FILTER({sql_prompt(POSITIVE, 't.log')})")
    run = open_run(kind, 256, sql, engine=engine)
    filt, join = run.node(ph.AiFilter), run.node(ph.AiJoin)
    assert filt.share_prefixes and filt.retain_kv
    check_filter_answers(run, filt)
    check_join_answers(run, join)
    assert run.report["kv"]["evictions"] > 0 and run.report["kv"]["recomputed_tokens"] > 0


@pytest.mark.parametrize("kind", KINDS)
def test_the_planner_shares_prefixes_only_where_documents_share_pages_and_never_under_limit(kind, open_run):
    traces = open_run(kind, 4096, trace_filter_sql(1), run=False, engine={"kv_page_tokens": PAGE})
    reviews = open_run(kind, 4096, f"SELECT r.id FROM reviews r WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')})",
                       run=False, engine={"kv_page_tokens": PAGE})
    limited = open_run(kind, 4096, trace_filter_sql(1) + " LIMIT 3", run=False,
                       engine={"kv_page_tokens": PAGE, "prefix_sharing": "on"})
    assert traces.node(ph.AiFilter).share_prefixes
    assert not reviews.node(ph.AiFilter).share_prefixes
    assert not limited.node(ph.AiFilter).share_prefixes
    assert "borrow shared document prefixes" in traces.query.explain()
    assert any("LIMIT" in remark for remark in limited.query.plan().remarks)


# -- contextual calibration --------------------------------------------------------------------------


def content_free_margin(run: Run, prompt_of: Callable[[tuple[int, ...]], tuple[int, ...]]) -> float:
    documents = [run.naive.encode(text) for text in ("N/A", "", "[MASK]")]
    return sum(run.naive.margin(prompt_of(d)) for d in documents) / len(documents)


@pytest.mark.parametrize("kind", KINDS)
def test_calibrated_answers_beat_the_naive_content_free_margin(kind, open_run):
    """Each predicate's threshold is the naive mean margin of its prompt over 'N/A', '' and '[MASK]';
    answers are margin > threshold, raw margins stay in the answer tables, the report and explain show it."""
    sql = (f"SELECT r.id, a.aid FROM reviews r JOIN aspects a "
           f"ON AI_FILTER({sql_prompt(DISCUSS, 'r.body', 'a.aspect')}, {{'anchor': 'r'}}) "
           f"WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')}) AND AI_FILTER({sql_prompt(POSITIVE, 'r.body')})")
    run = open_run(kind, 160, sql, engine={"calibration": "auto"})  # a base model: auto calibrates
    filt, join = run.node(ph.AiFilter), run.node(ph.AiJoin)
    assert len(filt.calibration) == 3 and len(join.calibration) == 3
    thresholds = {s.predicate.position: content_free_margin(run, lambda d, s=s: filt.preamble + d + filt.frame +
                                                            s.question) for s in filt.stages}
    thresholds[join.predicate.position] = content_free_margin(
        run, lambda d: join.preamble + d + join.frame + join.labels[0] + d + join.cue)
    measured = {int(p): o for p, o in run.report["calibration"].items()}
    assert measured == pytest.approx(thresholds, abs=TOL)
    live = set(range(N))
    for stage in filt.stages:
        position = stage.predicate.position
        answers = {a["r"]: a for a in run.answers(filt.id) if a["predicate"] == position}
        assert set(answers) == live
        for row, answer in answers.items():
            margin = filter_margin(run, filt, row, position)
            assert answer["margin"] == pytest.approx(margin, abs=TOL)
            assert answer["answer"] == (margin > thresholds[position])
        live = {r for r in live if answers[r]["answer"]}
    for answer in run.answers(join.id):
        margin = join_margin(run, join, {"r": answer["r"], "a": answer["a"]})
        assert answer["margin"] == pytest.approx(margin, abs=TOL)
        assert answer["answer"] == (margin > thresholds[join.predicate.position])
    assert {a["r"] for a in run.answers(join.id)} == live
    assert "calibrated on 3 content-free documents" in run.query.explain()
    assert any("calibrate" in remark for remark in run.query.plan().remarks)


@pytest.mark.parametrize("kind", KINDS)
def test_calibration_prompts_ride_in_the_first_pass_of_their_node(kind, open_run):
    """The content-free prompts run at the front of their node's first pass, not in a pass of their own, and
    so does the preamble they and the documents read: a calibrated filter whose documents and prompts fit
    one chunk is one pass, the first time (computing the preamble too) and again with it cached."""
    sql = f"SELECT r.id FROM reviews r WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')})"
    first = open_run(kind, 4096, sql, engine={"calibration": "auto"})
    again = open_run(kind, 4096, sql, after=first)
    node = again.node(ph.AiFilter)
    assert len(node.calibration) == 3
    assert first.metrics(node.id)["chunks"] == 1, "the preamble, prompts and documents together"
    assert again.metrics(node.id)["chunks"] == 1
    assert first.metrics(node.id)["fresh_tokens"] - again.metrics(node.id)["fresh_tokens"] == len(node.preamble)
    assert again.report["calibration"] == pytest.approx(first.report["calibration"], abs=TOL)
    assert [a["answer"] for a in again.answers(node.id)] == [a["answer"] for a in first.answers(node.id)]


@pytest.mark.parametrize("kind", KINDS)
def test_calibration_off_decides_on_the_raw_margin_and_reports_nothing(kind, open_run):
    run = open_run(kind, 160, f"SELECT r.id FROM reviews r WHERE AI_FILTER({sql_prompt(ACTING, 'r.body')})")
    assert run.node(ph.AiFilter).calibration == ()
    assert run.report["calibration"] is None
    check_filter_answers(run, run.node(ph.AiFilter))


GENERATE_SQL = ("SELECT r.id, AI_COMPLETE(PROMPT('Continue the review {0}', r.body), {'max_tokens': 10}) AS g "
                "FROM reviews r")


@pytest.mark.parametrize("chunk", (CHUNKS[0], CHUNKS[-1]))
@pytest.mark.parametrize("kind", KINDS)
def test_greedy_generation_equals_transformers_generate(kind, chunk, open_run):
    """Every generation equals transformers' greedy `generate` on the same prompt ids, or differs only after a near
    tie (a logit gap under 1e-3 where they part); a small chunk makes sequences join and leave the batch."""
    run = open_run(kind, chunk, GENERATE_SQL)
    node = run.node(ph.AiGenerate)
    answers = run.answers(node.id)
    assert len(answers) == N
    differ = []
    for answer in answers:
        prompt = node.preamble + run.doc("r", answer["r"]) + node.tail
        want, finish = run.naive.greedy(prompt, node.max_tokens, node.stop)
        if (answer["tokens"], answer["finish"]) == (want, finish):
            continue
        part = next(i for i, (a, b) in enumerate(zip([*answer["tokens"], -1], [*want, -1], strict=False)) if a != b)
        differ.append(run.naive.gap(prompt + tuple(want[:part])))
    assert len(differ) <= 0.05 * len(answers) and all(gap < 1e-3 for gap in differ), differ
    assert {a["finish"] for a in answers} <= {"stop", "length"}
    fed = sum(len(a["tokens"]) - (a["finish"] == "length") for a in answers)
    prompts = sum(len(run.doc("r", a["r"])) + len(node.tail) for a in answers)
    assert fed > 0 and run.report["fresh_tokens"] == len(node.preamble) + prompts + fed, "each token computed once"
    assert run.report["minimum_tokens"] <= run.report["fresh_tokens"]


@pytest.mark.skipif(kernels.one_row_status(torch.bfloat16) is None or DEVICE != "cpu",
                    reason="the one-row decode kernels need a CPU with AVX-512 BF16")
@pytest.mark.parametrize("kind", KINDS)
def test_bf16_decoding_writes_the_same_tokens_with_the_one_row_kernels_as_with_onednn(kind, open_run, monkeypatch):
    """A decode step of one sequence multiplies its projections and finds its head candidates in Quail's one-row
    kernels (fp32 sums in another order than oneDNN's, one rounding): the chosen tokens are the ones the
    oneDNN path chooses. Three documents, each alone in its query: every step after the first is one sequence."""
    sql = ("SELECT r.id, AI_COMPLETE(PROMPT('Continue the review {0}', r.body), {'max_tokens': 24}) AS g "
           "FROM reviews r WHERE r.id = ")
    steps: list[bool] = []
    head_top = kernels.head_top

    def counted(*args):
        found = head_top(*args)
        steps.append(found is not None)
        return found

    with monkeypatch.context() as counting:
        counting.setattr(kernels, "head_top", counted)
        written = [generated(open_run(kind, CHUNKS[0], f"{sql}{i}", engine={"precision": "bf16"})) for i in IDS_ASKED]
    with monkeypatch.context() as off:
        off.setattr(kernels, "head_top", lambda *_: None)
        off.setattr(kernels.OneRowProjection, "__call__", lambda *_: None)
        off.setattr(kernels.RowDecoder, "__call__", lambda *_: None)
        expected = [generated(open_run(kind, CHUNKS[0], f"{sql}{i}", engine={"precision": "bf16"})) for i in IDS_ASKED]
    assert sum(steps) >= 30, f"{sum(steps)} steps of one sequence: too few for the check to mean anything"
    assert written == expected


IDS_ASKED = IDS["reviews"][:3]


def generated(run: Run) -> list[tuple[tuple[int, ...], str]]:
    return [(tuple(a["tokens"]), a["finish"]) for a in run.answers(run.node(ph.AiGenerate).id)]


STRUCTURED_SQL = ("SELECT r.id, AI.GENERATE(('Describe ', r.body), output_schema => 'good BOOL, n INT64, "
                  "flags ARRAY<BOOL>, inner STRUCT<ok BOOL>', model_params => JSON "
                  "'{\"generationConfig\": {\"maxOutputTokens\": 64}}') AS g FROM reviews r")


@pytest.mark.parametrize("kind", KINDS)
def test_a_random_model_held_to_a_schema_writes_only_what_it_allows(kind, open_run, tiny_checkpoints):
    """The tiny random models would write anything: under the grammar every token they write is one the schema's
    grammar accepts (replayed through a fresh matcher), and every output that ended by itself parses into the
    schema's types; one the bound cut off is NULL with a status saying why."""
    from llguidance import LLMatcher, LLTokenizer

    run = open_run(kind, CHUNKS[-1], STRUCTURED_SQL, dialect=BQ)
    node = run.node(ph.AiGenerate)
    assert node.grammar is not None
    tokenizer = LLTokenizer(str(tiny_checkpoints[kind].path / "tokenizer.json"), n_vocab=400,
                            eos_token=list(node.stop))
    for answer in run.answers(node.id):
        matcher = LLMatcher(tokenizer, LLMatcher.grammar_from_json_schema(node.grammar), log_level=0)
        assert matcher.consume_tokens(answer["tokens"]), matcher.get_error()
        assert matcher.is_accepting() == (answer["finish"] == "stop")
    values = [row["g"] for row in run.result.to_rows()]
    ended = {a["r"]: a["finish"] for a in run.answers(node.id)}
    assert len(values) == N
    for row, value in zip(run.result.to_rows(), values, strict=True):
        if value["status"] == "":
            assert isinstance(value["good"], bool) and isinstance(value["n"], int)
            assert all(isinstance(f, bool) for f in value["flags"]) and isinstance(value["inner"]["ok"], bool)
        else:
            assert value["good"] is None and "did not parse" in value["status"]
            assert ended[IDS["reviews"].index(row["id"])] == "length"
    assert any(value["status"] == "" for value in values), [run.naive.decode(a["tokens"]) for a in run.answers(node.id)]


FILTERED = "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Does the review praise the acting? {0}', r.body))"
FILTERED_GENERATIONS = ("SELECT r.id, AI_COMPLETE(PROMPT('Continue the review {0}', r.body), {'max_tokens': 6}) "
                        "AS g, AI_COMPLETE(PROMPT('Retell {0}', r.body), {'max_tokens': 6}) AS h FROM reviews r "
                        "WHERE AI_FILTER(PROMPT('Does the review praise the acting? {0}', r.body))")


@pytest.mark.parametrize("kind", KINDS)
def test_generations_after_a_filter_reuse_its_documents_kv_and_still_equal_transformers(kind, open_run):
    """A survivor's document KV is kept by the filter for the first generation and by it for the second: each
    generation computes only its tail and its own tokens, and writes what transformers writes from the whole
    prompt."""
    alone = open_run(kind, CHUNKS[-1], FILTERED)
    run = open_run(kind, CHUNKS[-1], FILTERED_GENERATIONS)
    nodes = [n for n in run.graph.nodes if isinstance(n, ph.AiGenerate)]
    assert [n.retain_kv for n in nodes].count(True) == 1 and run.node(ph.AiFilter).retain_kv
    extra = 0
    for node in nodes:
        for answer in run.answers(node.id):
            prompt = node.preamble + run.doc("r", answer["r"]) + node.tail
            want, finish = run.naive.greedy(prompt, node.max_tokens, node.stop)
            assert (answer["tokens"], answer["finish"]) == (want, finish)
            extra += len(node.tail) + len(answer["tokens"]) - (answer["finish"] == "length")
    assert run.answers(nodes[0].id), "the filter must keep some rows for the check to mean anything"
    assert run.report["fresh_tokens"] == alone.report["fresh_tokens"] + extra, "no document computed twice"


OUTPUTS_SQL = (f"SELECT r.id, AI.CLASSIFY(r.body, [{', '.join(repr(x) for x in LABELS)}]) AS topic, "
               f"AI.SCORE({sql_prompt(POSITIVE, 'r.body')}) AS positivity, "
               f"AI.IF({sql_prompt(BORING, 'r.body')}) AS boring, "
               "AI.GENERATE(PROMPT('Continue the review {0}', r.body), model_params => JSON "
               "'{\"generationConfig\": {\"maxOutputTokens\": 5}}').result AS more "
               f"FROM reviews r WHERE AI.IF({sql_prompt(ACTING, 'r.body')})")


def check_outputs_over_kept_kv(run: Run) -> list[int]:
    """Every output's answers equal a plain forward of its whole prompt; returns the rows the filter kept."""
    filt = next(n for n in run.graph.nodes if isinstance(n, ph.AiFilter) and n.id == "filter_r")
    naive = check_filter_answers(run, filt)
    survivors = [r for r in range(N) if naive[(r, filt.stages[0].predicate.position)]]
    classify, score, generate = run.node(ph.AiClassify), run.node(ph.AiScore), run.node(ph.AiGenerate)
    verdict = next(n for n in run.graph.nodes if isinstance(n, ph.AiFilter) and n.id != "filter_r")
    for answer in run.answers(classify.id):
        prompt = classify.preamble + run.doc("r", answer["r"]) + classify.tail
        for got, label in zip(answer["margins"], classify.label_tokens, strict=True):
            assert got == pytest.approx(run.naive.label_log_prob(prompt, label), abs=TOL), answer["r"]
    for answer in run.answers(score.id):
        assert answer["margin"] == pytest.approx(run.naive.margin(score.preamble + run.doc("r", answer["r"]) +
                                                                  score.question), abs=TOL)
    for answer in run.answers(verdict.id):
        assert answer["margin"] == pytest.approx(run.naive.margin(verdict.prompt(run.doc("r", answer["r"]), 0)),
                                                 abs=TOL)
    for answer in run.answers(generate.id):
        prompt = generate.preamble + run.doc("r", answer["r"]) + generate.tail
        assert (answer["tokens"], answer["finish"]) == run.naive.greedy(prompt, generate.max_tokens, generate.stop)
    for node in (classify, score, verdict, generate):
        assert sorted(a["r"] for a in run.answers(node.id)) == survivors, node.id
    return survivors


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("kind", KINDS)
def test_every_output_over_one_alias_reads_the_document_kv_computed_once(kind, chunk, open_run):
    """A filter, then a label, a score, a value and a generation over the same reviews: each node keeps the
    survivors' document KV for the next, which computes only its own tail over it — every answer still a plain
    forward of its whole prompt, and each document computed once (every later node a KV hit per survivor)."""
    run = open_run(kind, chunk, OUTPUTS_SQL, dialect=BQ)
    survivors = check_outputs_over_kept_kv(run)
    assert survivors, "the filter must keep some rows for the check to mean anything"
    order = [n for n in run.graph.nodes if isinstance(n, ph.DocumentNode)]
    keeping = [getattr(n, "retain_kv", False) for n in order]
    assert keeping == [True] * (len(order) - 1) + [False], [n.describe() for n in order]
    for node in order[1:]:
        metrics = run.metrics(node.id)
        assert (metrics["kv_hits"], metrics["kv_misses"]) == (len(survivors), 0), node.id
    classify, score, generate = run.node(ph.AiClassify), run.node(ph.AiScore), run.node(ph.AiGenerate)
    verdict = next(n for n in order if isinstance(n, ph.AiFilter) and n.id != "filter_r")
    fed = sum(len(a["tokens"]) - (a["finish"] == "length") for a in run.answers(generate.id))
    tails = {classify.id: len(classify.tail) + sum(len(t) - 1 for t in classify.label_tokens),
             score.id: len(score.question), verdict.id: len(verdict.frame) + len(verdict.stages[0].question),
             generate.id: len(generate.tail)}
    for node_id, tail in tails.items():  # its own tail per survivor, never the document again
        extra = fed if node_id == generate.id else 0
        assert run.metrics(node_id)["fresh_tokens"] == len(survivors) * tail + extra, node_id


@pytest.mark.parametrize("pages", (24, 40))
@pytest.mark.parametrize("kind", KINDS)
def test_outputs_over_kept_kv_stay_exact_when_a_tiny_arena_evicts_it(kind, pages, open_run, tiny_checkpoints):
    """The kept documents compete for a few pages with every node's own work: those evicted are recomputed (a miss
    each), and every answer stays a plain forward of its whole prompt."""
    engine = {"kv_page_tokens": PAGE, "kv_budget_bytes": arena_bytes(tiny_checkpoints[kind], pages)}
    run = open_run(kind, 96, OUTPUTS_SQL, dialect=BQ, engine=engine)
    check_outputs_over_kept_kv(run)
    assert run.report["kv"]["evictions"] > 0 or pages == 40


@pytest.mark.parametrize("kind", KINDS)
def test_calls_of_two_blocks_over_the_same_rows_share_the_document_kv(kind, open_run):
    """The general rule asks a UNION's two calls over the same reviews as one query: the label node keeps each
    document's KV and the score reads it — every document computed once, both answers a plain forward."""
    labels = ", ".join(repr(x) for x in LABELS)
    sql = (f"SELECT r.id, AI.CLASSIFY(r.body, [{labels}]) AS x FROM reviews r UNION ALL "
           f"SELECT r.id, CAST(AI.SCORE({sql_prompt(POSITIVE, 'r.body')}) AS STRING) FROM reviews r")
    run = open_run(kind, 160, sql, dialect=BQ)
    metrics = run.report["node_metrics"]
    [score] = [name for name in metrics if name.split("/")[-1].startswith("score_")]
    [classify] = [name for name in metrics if name.split("/")[-1].startswith("classify_")]
    assert score.split("/")[0] == classify.split("/")[0], "one query for both calls"
    assert (metrics[score]["kv_hits"], metrics[score]["kv_misses"]) == (N, 0)
    [graph] = [candidate.graph for candidate in run.query.plan()]
    node = next(n for n in graph.nodes if isinstance(n, ph.AiScore))
    scores = [row for row in run.result.to_rows() if row["x"] not in LABELS]
    assert len(scores) == N
    for row in scores:
        review = IDS["reviews"].index(row["id"])
        margin = run.naive.margin(node.preamble + run.naive.encode(REVIEWS[review]) + node.question)
        assert float(row["x"]) == pytest.approx(1.0 / (1.0 + math.exp(-margin)), abs=TOL), review
