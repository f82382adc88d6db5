"""A node asking each document one long question states it once, before the documents (`question_first`): chosen
by token cost, shown in explain, the same answers where the rule reads the question — and a real model's fresh
tokens fall to about the documents alone."""

from __future__ import annotations

import pyarrow as pa
import pytest

import quail
from quail.logical.expressions import ColumnRef, Prompt
from quail.planner.examples import choose_layout
from quail.testing import BASE_MODEL, ByteTokenizer, KeywordBackend

RUBRIC = ("Rate the review {0} against this rubric. A strong review names the director, describes the acting with "
          "a concrete example, discusses the plot without spoilers, mentions the cinematography or the music, "
          "compares the film to others of its genre, and ends with a clear recommendation for a specific audience. "
          "It also weighs the pacing of the second half, notes how the editing serves the story, says whether the "
          "dialogue sounds natural, judges the costumes and the production design, and gives a reason for every "
          "opinion rather than a bare verdict. Does the review meet the rubric well?")
SHORT = "Is {0} positive?"
TOKENIZER = ByteTokenizer()


def layout(template: str, documents: int, tokens_each: int, reused: bool = False, switch: str = "auto") -> str:
    prompt = Prompt(template, (ColumnRef("r", "body"),))
    return choose_layout([prompt], documents, documents * tokens_each, reused, TOKENIZER, "it", switch).layout


def test_a_long_question_over_short_documents_goes_first_a_short_one_over_long_ones_after():
    assert layout(RUBRIC, 40, 50) == "instruction_first"
    assert layout(SHORT, 40, 600) == "document_first"
    assert layout(SHORT, 40, 600, switch="on") == "instruction_first"
    assert layout(RUBRIC, 40, 50, switch="off") == "document_first"
    assert layout(RUBRIC, 2, 5000, reused=True) == "document_first"  # a join reads those documents' KV


def run(switch: str) -> quail.QueryResult:
    registry = quail.ExtensionRegistry.with_built_ins()
    registry.register_backend(KeywordBackend(TOKENIZER))
    config = quail.EngineConfig(model=BASE_MODEL, backend="keyword", cache="off", question_first=switch)
    with quail.Session(config, registry=registry, tokenizer=TOKENIZER) as session:
        bodies = [f"review {i}: fine acting" for i in range(30)]
        session.register("r", pa.table({"id": list(range(30)), "body": bodies}))
        return session.sql(f"SELECT r.id, AI.SCORE(PROMPT('{RUBRIC}', r.body)) AS s FROM r "
                           f"WHERE AI_FILTER(PROMPT('{RUBRIC}', r.body))").run()


def test_the_answers_stay_and_explain_says_where_the_question_went():
    first, after = run("auto"), run("off")
    assert first.to_rows() == after.to_rows()
    assert "the question of s (Score on r): first, a prefix every document shares" in first.explain()
    assert "the question of" not in after.explain()


def test_question_first_takes_auto_on_or_off():
    with pytest.raises(quail.QuailError, match="question_first"):
        quail.EngineConfig(question_first="always")  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.plugins  # the native backend and an embedded model
def test_a_rubric_score_over_short_reviews_costs_a_third_of_the_tokens_on_a_real_model():
    bodies = [f"Review {i}: the acting was fine and the plot moved quickly." for i in range(40)]
    fresh = {}
    for switch in ("auto", "off"):
        with quail.Session(quail.EngineConfig(model="gemma-3-270m", cache="off", question_first=switch)) as session:
            session.register("r", pa.table({"id": list(range(40)), "body": bodies}))
            report = session.sql(f"SELECT r.id, AI.SCORE(PROMPT('{RUBRIC}', r.body)) AS s FROM r").run().report
            fresh[switch] = report["fresh_tokens"]
            if switch == "auto":
                assert report["fresh_tokens"] <= 1.15 * report["minimum_tokens"]
    assert 3 * fresh["auto"] <= fresh["off"]
