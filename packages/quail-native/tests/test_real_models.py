"""Exactness on the real embedded models (Gemma 3 270M, Qwen2.5-Coder 0.5B Instruct in its chat layout): a handful
of documents, every margin vs a plain transformers forward of the same ids."""

from __future__ import annotations

import pytest
import torch

import quail
from quail import datasets
from quail.physical.nodes import AiFilter, AiJoin
from quail.prompts import answer_tokens

pytestmark = pytest.mark.slow

SQL = """SELECT r.id, a.aspect FROM reviews r JOIN aspects a
  ON AI_FILTER(PROMPT('Does the review {0} speak well of the {1}?', r.body, a.aspect))
WHERE AI_FILTER(PROMPT('Is this movie review positive? {0}', r.body))
  AND AI_FILTER(PROMPT('Would the reviewer recommend this movie to a friend? {0}', r.body))"""


EMBEDDED = ("gemma-3-270m", "qwen2.5-coder-0.5b-instruct")


@pytest.fixture(scope="module", params=EMBEDDED)
def run(request):
    config = quail.EngineConfig(model=request.param, chunk_tokens=256, precision="fp32")
    with quail.Session(config) as session:
        session.register("reviews", quail.DocumentProvider.from_table(datasets.reviews().slice(0, 5), "id"))
        session.register("aspects", quail.DocumentProvider.from_table(datasets.aspects().slice(0, 3), "id"))
        query = session.sql(SQL)
        result = query.run()
        assert session.tokenizer is not None
        yield query.plan().graph, result, session.tokenizer, request.param


def naive_margin(model: torch.nn.Module, ids: tuple[int, ...], true_ids: tuple[int, ...],
                 false_ids: tuple[int, ...]) -> float:
    with torch.inference_mode():
        logits = model(torch.tensor([ids]), logits_to_keep=1).logits[0, -1]
    return (logits[list(true_ids)].max() - logits[list(false_ids)].max()).item()


def test_filter_and_join_margins_equal_a_plain_transformers_forward(run):
    from transformers import AutoModelForCausalLM

    from quail_native.models.embedded import embedded_model_dir

    graph, result, tokenizer, name = run
    model = AutoModelForCausalLM.from_pretrained(embedded_model_dir(name), dtype=torch.float32).eval()
    tokens = answer_tokens(tokenizer)
    bodies = datasets.reviews().column("body").to_pylist()
    aspects = datasets.aspects().column("aspect").to_pylist()
    checked = 0
    node = graph.node("filter_r")
    assert isinstance(node, AiFilter)
    stages = {s.predicate.position: s for s in node.stages}
    table = result.answer_tables["filter_r"]
    for row, position, margin in zip(*(table.column(c).to_pylist() for c in ("r", "predicate", "margin")),
                                     strict=True):
        ids = node.preamble + tuple(tokenizer.encode(bodies[row])) + node.frame + stages[position].question
        assert naive_margin(model, ids, tokens.true_ids, tokens.false_ids) == pytest.approx(margin, abs=1e-4)
        checked += 1
    join = graph.node("join_0")
    assert isinstance(join, AiJoin)
    table = result.answer_tables["join_0"]
    documents = {"r": bodies, "a": aspects}
    for r_row, a_row, margin in zip(*(table.column(c).to_pylist() for c in ("r", "a", "margin")), strict=True):
        rows = {"r": r_row, "a": a_row}
        ids = join.preamble + tuple(tokenizer.encode(documents[join.anchor.alias][rows[join.anchor.alias]]))
        ids += join.frame
        for label, partner in zip(join.labels, join.partners, strict=True):
            ids += label + tuple(tokenizer.encode(documents[partner.alias][rows[partner.alias]]))
        ids += join.cue
        assert naive_margin(model, ids, tokens.true_ids, tokens.false_ids) == pytest.approx(margin, abs=1e-4)
        checked += 1
    assert checked >= 10


def test_fresh_tokens_stay_within_two_percent_of_the_minimum(run):
    _, result, _, _ = run
    report = result.report
    assert report["fresh_tokens"] <= 1.02 * report["minimum_tokens"]


TRACES = "SELECT t.id FROM traces t WHERE AI_FILTER(PROMPT('Did the agent hit an error? {0}', t.log))"


def traces_run(sharing: str) -> quail.QueryResult:
    config = quail.EngineConfig(model="gemma-3-270m", chunk_tokens=1024, prefix_sharing=sharing, cache="off",
                                precision="fp32")
    with quail.Session(config) as session:  # both runs compute, in fp32 to compare with the fp32 reference
        session.register("traces", quail.DocumentProvider.from_table(datasets.traces().slice(0, 16), "id"))
        return session.sql(TRACES).run()


def test_prefix_sharing_on_cumulative_traces_more_than_halves_fresh_tokens_with_the_same_answers():
    """Two sessions of eight cumulative agent-trace steps: with sharing each step borrows the last
    step's pages and computes only its tail."""
    shared, plain = traces_run("auto"), traces_run("off")
    assert any("share document prefixes on t" in r for r in shared.report["remarks"])
    assert shared.report["fresh_tokens"] < 0.5 * plain.report["fresh_tokens"]
    # above the minimum only by the part-pages each step recomputes (16-token pages, 16 documents)
    assert shared.report["fresh_tokens"] < shared.report["minimum_tokens"] + 16 * 16
    mine, theirs = (r.answer_tables["filter_t"].sort_by("t").to_pylist() for r in (shared, plain))
    assert [(a["t"], a["answer"]) for a in mine] == [(a["t"], a["answer"]) for a in theirs]
    assert [a["margin"] for a in mine] == pytest.approx([a["margin"] for a in theirs], abs=1e-4)


@pytest.mark.parametrize("name", EMBEDDED)
def test_greedy_generations_equal_transformers_generate_on_the_same_ids(name):
    """fp32: native's batched greedy decoding writes what transformers' `generate(do_sample=False)` writes from the
    same prompt ids, for ≥ 95 % of the documents; any other parts from it only where two logits nearly tie."""
    from transformers import AutoModelForCausalLM

    from quail_native.models.embedded import embedded_model_dir

    sql = ("SELECT r.id, AI_COMPLETE(PROMPT('Which film does {0} review, and what did the critic think?', "
           "r.body), {'max_tokens': 16}) AS g FROM reviews r")
    config = quail.EngineConfig(model=name, chunk_tokens=256, precision="fp32", cache="off")
    with quail.Session(config) as session:
        session.register("reviews", quail.DocumentProvider.from_table(datasets.reviews().slice(0, 5), "id"))
        query = session.sql(sql)
        result = query.run()
        graph, tokenizer = query.plan().graph, session.tokenizer
    node = graph.node("generate_g")
    model = AutoModelForCausalLM.from_pretrained(embedded_model_dir(name), dtype=torch.float32).eval()
    bodies = datasets.reviews().column("body").to_pylist()
    answers = result.answer_tables["generate_g"].to_pylist()
    same, gaps = 0, []
    for answer in answers:
        ids = node.preamble + tuple(tokenizer.encode(bodies[answer["r"]])) + node.tail
        with torch.inference_mode():
            output = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                    max_new_tokens=node.max_tokens, do_sample=False, eos_token_id=list(node.stop),
                                    pad_token_id=node.stop[0])
        written = output[0, len(ids):].tolist()
        want = next((written[:i] for i, t in enumerate(written) if t in node.stop), written)
        if answer["tokens"] == want:
            same += 1
            continue
        part = next(i for i, (a, b) in enumerate(zip([*answer["tokens"], -1], [*want, -1], strict=False)) if a != b)
        with torch.inference_mode():
            top = model(torch.tensor([ids + tuple(want[:part])])).logits[0, -1].topk(2).values
        gaps.append(float(top[0] - top[1]))
    assert len(answers) == 5 and same + len(gaps) == 5
    assert all(gap < 1e-3 for gap in gaps), f"{same} of 5 equal; the others part at logit gaps {gaps}"
    assert all(answer["tokens"] for answer in answers)


def test_one_statement_answers_with_two_models_each_as_it_would_alone():
    """A filter on the session's model (Gemma 3 270M) and a generation naming Qwen2.5-Coder 0.5B by an alias: each
    column equals what a session on that model alone answers."""
    other = "qwen2.5-coder-0.5b-instruct"
    question = "AI_FILTER(PROMPT('Is this movie review positive? {0}', r.body))"
    summary = "PROMPT('Name the film {0} reviews.', r.body), {'max_tokens': 8}"
    both = f"SELECT r.id, AI_COMPLETE('llama3.1-8b', {summary}) AS g FROM reviews r WHERE {question} ORDER BY r.id"

    def rows(model: str, sql: str) -> list[dict[str, object]]:
        config = quail.EngineConfig(model=model, chunk_tokens=256, precision="fp32", cache="off",
                                    engines_per_device=2, model_aliases={"llama3.1-8b": other})
        with quail.Session(config) as session:
            session.register("reviews", quail.DocumentProvider.from_table(datasets.reviews().slice(0, 6), "id"))
            result = session.sql(sql).run()
            assert model in result.report["model"]
            return result.to_rows()

    try:
        mixed = rows("gemma-3-270m", both)
        kept = rows("gemma-3-270m", f"SELECT r.id FROM reviews r WHERE {question} ORDER BY r.id")
        written = rows(other, f"SELECT r.id, AI_COMPLETE({summary}) AS g FROM reviews r ORDER BY r.id")
    finally:
        quail.release_engines()
    assert [row["id"] for row in mixed] == [row["id"] for row in kept] and mixed, "the filter: Gemma's answers"
    by_id = {row["id"]: row["g"] for row in written}
    assert [row["g"] for row in mixed] == [by_id[row["id"]] for row in mixed], "the generations: Qwen's text"
