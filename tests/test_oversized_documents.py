"""A document too long for one forward pass: refused by default, or skipped / truncated on request.

Every other document's answers must stay what they are without the long one, for filters, joins
(long on either side), semi-joins, AI.CLASSIFY and AI.SCORE; a truncated document is answered as
its first `limit` tokens. The keyword backend reads the documents back from the tokens it is given,
so a backend handed the wrong rows or the untruncated tokens would answer differently.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from quail import DocumentProvider, EngineConfig, RefusalError, Session
from quail.errors import ConfigError

LONG_ROW = 2
LONG = "the acting " + "word " * 40_000 + "and the plot"  # 200,023 bytes: 200,023 byte tokens
BODIES = ["the acting is superb", "a plot with holes", LONG, "music and acting", "the plot thickens",
          "a quiet film"]
REVIEWS = pa.table({"id": [10, 11, 12, 13, 14, 15], "body": BODIES})
ASPECTS = pa.table({"id": [1, 2, 3], "aspect": ["acting", "plot", "music"]})

QUERIES = {
    "filter": "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Does {0} mention \"acting\"?', r.body))",
    "two filters": ("SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Does {0} mention \"acting\"?', r.body)) "
                    "AND AI_FILTER(PROMPT('Is {0} about the \"plot\"?', r.body))"),
    "join": ("SELECT r.id, a.aspect FROM reviews r JOIN aspects a "
             "ON AI_FILTER(PROMPT('Does {0} discuss {1}?', r.body, a.aspect))"),
    "exists": ("SELECT a.aspect FROM aspects a WHERE EXISTS (SELECT 1 FROM reviews r "
               "WHERE AI_FILTER(PROMPT('Does {0} discuss {1}?', a.aspect, r.body)))"),
    "classify": "SELECT r.id, AI.CLASSIFY(r.body, ['acting', 'plot']) AS topic FROM reviews r",
    "score": "SELECT r.id, AI.SCORE(PROMPT('How good is {0}?', r.body)) AS s FROM reviews r",
}
BIGQUERY = {"classify", "score"}


def rows(bodies: list[str | None], query: str, policy: str = "refuse") -> list[tuple]:
    with session(bodies, policy) as s:
        result = s.sql(QUERIES[query], dialect="bigquery" if query in BIGQUERY else "snowflake").run()
        return sorted(tuple(row.values()) for row in result.to_rows())


def session(bodies: list[str | None], policy: str) -> Session:
    """Reviews with these bodies (a None body leaves its row out of the table)."""
    s = Session(EngineConfig(backend="example-keyword", oversized_documents=policy))
    reviews = REVIEWS.set_column(1, "body", pa.array(bodies)).filter(pa.array([b is not None for b in bodies]))
    s.register("reviews", DocumentProvider.from_table(reviews, "id"))
    s.register("aspects", DocumentProvider.from_table(ASPECTS, "id"))
    return s


def without_long_row() -> list[str | None]:
    return [None if i == LONG_ROW else b for i, b in enumerate(BODIES)]


def long_id_free(found: list[tuple]) -> list[tuple]:
    return [row for row in found if 12 not in row]


@pytest.mark.parametrize("query", list(QUERIES))
def test_the_default_refuses_and_names_the_choice(query):
    with session(BODIES, "refuse") as s, pytest.raises(RefusalError, match="oversized_documents='skip' or 'truncate'"):
        s.sql(QUERIES[query], dialect="bigquery" if query in BIGQUERY else "snowflake").plan()


@pytest.mark.parametrize("query", list(QUERIES))
def test_skip_leaves_the_long_document_out_and_every_other_answer_as_it_was(query):
    assert rows(BODIES, query, "skip") == rows(without_long_row(), query)


@pytest.mark.parametrize("query", list(QUERIES))
def test_truncate_answers_the_long_document_as_its_first_tokens_and_the_others_as_they_were(query):
    got = rows(BODIES, query, "truncate")
    assert long_id_free(got) == long_id_free(rows(without_long_row(), query))
    with session(BODIES, "truncate") as s:
        limit = s.sql(QUERIES[query], dialect="bigquery" if query in BIGQUERY else "snowflake").run() \
            .report["oversized_documents"]["limit_tokens"]["r"]
    cut = [LONG[:limit] if i == LONG_ROW else b for i, b in enumerate(BODIES)]  # one byte, one token
    assert got == rows(cut, query)


def test_the_report_counts_and_the_plan_names_the_skipped_documents():
    with session(BODIES, "skip") as s:
        query = s.sql(QUERIES["filter"])
        assert "oversized_documents='skip': 1 document(s) of r skipped" in query.explain()
        report = query.run().report
        assert report["oversized_documents"]["policy"] == "skip"
        assert report["oversized_documents"]["documents"] == {"r": 1}
        assert any("skipped" in remark and "200,023 tokens" in remark for remark in report["remarks"])


def test_a_skipped_document_is_never_sent_to_the_backend():
    with session(BODIES, "skip") as s:
        result = s.sql(QUERIES["join"]).run()
        for table in result.answer_tables.values():
            if "r" in table.column_names:
                assert 2 not in table.column("r").to_pylist()  # row 2 holds id 12


def test_documents_that_fit_are_untouched_and_counted_as_none():
    with session(without_long_row(), "truncate") as s:
        report = s.sql(QUERIES["filter"]).run().report
    assert report["oversized_documents"] == {"policy": "truncate", "documents": {}, "limit_tokens": {}}


@pytest.mark.parametrize("value", ["drop", "", None, "SKIP"])
def test_an_unknown_policy_is_refused_at_construction(value):
    with pytest.raises(ConfigError, match="oversized_documents must be one of 'refuse', 'skip', 'truncate'"):
        EngineConfig(oversized_documents=value)


def test_a_chat_model_whose_tokenizer_lacks_its_turn_markers_is_limited_by_the_base_layout():
    with Session(EngineConfig(backend="example-keyword", model="qwen3-0.6b", oversized_documents="skip")) as s:
        s.register("reviews", DocumentProvider.from_table(REVIEWS, "id"))
        found = sorted(row["id"] for row in s.sql(QUERIES["filter"]).run().to_rows())
    assert found == [10, 13]
