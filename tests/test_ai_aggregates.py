"""Snowflake's AI aggregates on the keyword test backend: `AI_AGG(texts, instruction)` and `AI_SUMMARIZE_AGG(texts)`
answer once per group — the keyword "generation" of a group is the first sentence of its texts in sorted order,
which the rounds of a group larger than one prompt keep too — beside the statement's own aggregates."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from support.cases import empty_keyword_session

import quail
from quail.testing.rules import generated_text

FILMS = ["a", "a", "b", "c", "b"]
BODIES = ["Great film. Loved it.", "Dull. Long.", "A slow, long story! Meh.", None, "Bright and brisk. Fun."]


def session(bodies: list[str | None] = BODIES, films: list[str] = FILMS, chunk: int = 1024,
            cache: str = "off") -> quail.Session:
    opened = empty_keyword_session(cache=cache, chunk_tokens=chunk)
    opened.register("r", pa.table({"id": list(range(len(bodies))), "film": films, "body": bodies}))
    return opened


def oracle(texts: list[str | None]) -> str | None:
    present = sorted(t for t in texts if t is not None)
    return generated_text(present[0]) if present else None


def test_ai_agg_answers_each_group_once_beside_the_statements_own_aggregates():
    with session() as opened:
        found = opened.sql("SELECT r.film, AI_AGG(r.body, 'What do the critics complain about?') AS a, COUNT(*) AS n "
                           "FROM r GROUP BY r.film ORDER BY r.film").run().to_rows()
    groups = {film: [b for f, b in zip(FILMS, BODIES, strict=True) if f == film] for film in sorted(set(FILMS))}
    assert found == [{"film": film, "a": oracle(texts), "n": len(texts)} for film, texts in groups.items()]
    assert found[2]["a"] is None, "a group of NULL texts has no answer"


def test_ai_summarize_agg_over_a_whole_filtered_table():
    with session() as opened:
        result = opened.sql("SELECT AI_SUMMARIZE_AGG(r.body) AS s FROM r "
                            "WHERE AI_FILTER(PROMPT('Is it \"long\"? {0}', r.body))").run()
    assert result.to_rows() == [{"s": oracle(["Dull. Long.", "A slow, long story! Meh."])}]


def test_a_group_larger_than_one_prompt_is_answered_in_rounds():
    bodies = [f"Review {i:03d} says the pacing drags in the middle act." for i in range(60)]
    with session(bodies, ["x"] * 60) as opened:
        query = opened.sql("SELECT AI_AGG(r.body, 'What is wrong?') AS a FROM r")
        result = query.run()
    assert result.to_rows() == [{"a": oracle(bodies)}]
    assert "1 distinct groups answered in 2 round(s) of generations" in result.explain()
    assert result.report["fresh_tokens"] > sum(len(b) for b in bodies), "every text was read"


def test_ai_aggregates_are_stored_like_every_generation(tmp_path: Path):
    store = str(tmp_path / "answers.sqlite")
    sql = "SELECT r.film, AI_AGG(r.body, 'What is good?') AS a FROM r GROUP BY r.film ORDER BY r.film"
    with session(cache=store) as opened:
        first = opened.sql(sql).run()
    with session(cache=store) as opened:
        again = opened.sql(sql).run()
    assert first.to_rows() == again.to_rows()
    assert first.report["fresh_tokens"] > 0 and again.report["fresh_tokens"] == 0


@pytest.mark.parametrize(("sql", "message"), [
    ("SELECT AI_AGG(r.body) FROM r", "AI_AGG is missing its expression argument"),
    ("SELECT AI_AGG(r.body, r.film) FROM r", "the instruction is a string"),
    ("SELECT AI_AGG(r.body, 'a {b}') FROM r", "braces"),
    ("SELECT AI_SUMMARIZE_AGG(r.body, 'x') FROM r", "greater than the maximum number of supported arguments"),
    ("SELECT AI_AGG(r.nothing, 'x') FROM r", "nothing"),
])
def test_a_wrong_ai_aggregate_is_refused_before_any_model_work(sql, message):
    with session() as opened, pytest.raises(quail.CompileError, match=message):
        opened.sql(sql)


def test_a_prompt_too_small_to_combine_partial_answers_is_refused_naming_tokens():
    with session(chunk=512) as opened, pytest.raises(quail.RefusalError, match="no room to combine"):
        opened.sql("SELECT AI_AGG(r.body, 'x') FROM r").run()
