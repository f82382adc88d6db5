"""The warehouses' own spellings of AI.IF / AI_FILTER, AI.SCORE and AI.CLASSIFY / AI_CLASSIFY — adapted from
BigQuery's and Snowflake's documentation of their AI functions to the local tables — compile to the plan their
`PROMPT(...)` equivalent compiles to and return the oracle's rows: BigQuery's tuple prompts and named arguments
(`input =>`, `categories =>`, `connection_id =>`), Snowflake's concatenated prompts (`'…' || col`,
`CONCAT('…', col)`), a column as the whole prompt, its error-details flag, and a prompt over several columns of
one table.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.relational_oracle import oracle_rows, same_rows
from test_general_rule import keyword_session

import quail
from quail.logical.nodes import render
from quail.testing.rules import words

ACTING = "Does the review mention \"acting\"? "
# (dialect, the documented form, its PROMPT(...) equivalent — None where it is itself the only spelling)
FORMS = [
    ("bigquery", f"SELECT r.id FROM reviews r WHERE AI.IF(('{ACTING}', r.body))",
     f"SELECT r.id FROM reviews r WHERE AI.IF(PROMPT('{ACTING}{{0}}', r.body))"),
    ("bigquery", f"SELECT r.id FROM reviews r WHERE AI.IF(prompt => ('{ACTING}', r.body), "
                 "connection_id => 'us.example_connection')",
     f"SELECT r.id FROM reviews r WHERE AI.IF(PROMPT('{ACTING}{{0}}', r.body))"),
    ("bigquery", "SELECT r.id, AI.SCORE(('Rate how positive this is from 1 to 10: ', r.body, ' (ignore spoilers)')) "
                 "AS s FROM reviews r",
     "SELECT r.id, AI.SCORE(PROMPT('Rate how positive this is from 1 to 10: {0} (ignore spoilers)', r.body)) AS s "
     "FROM reviews r"),
    ("bigquery", "SELECT r.id, AI.CLASSIFY(input => r.body, categories => ['acting', 'plot', 'music']) AS k "
                 "FROM reviews r",
     "SELECT r.id, AI.CLASSIFY(r.body, ['acting', 'plot', 'music']) AS k FROM reviews r"),
    ("bigquery", "SELECT r.id, AI.CLASSIFY(r.body, categories => [('acting', 'the cast'), ('plot', 'the story')]) "
                 "AS k FROM reviews r",
     "SELECT r.id, AI.CLASSIFY(r.body, [('acting', 'the cast'), ('plot', 'the story')]) AS k FROM reviews r"),
    ("snowflake", f"SELECT r.id FROM reviews r WHERE AI_FILTER('{ACTING}' || r.body)",
     f"SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('{ACTING}{{0}}', r.body))"),
    ("snowflake", f"SELECT r.id FROM reviews r WHERE AI_FILTER(CONCAT('{ACTING}', r.body))",
     f"SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('{ACTING}{{0}}', r.body))"),
    ("snowflake", f"SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('{ACTING}{{0}}', r.body), TRUE)",
     f"SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('{ACTING}{{0}}', r.body))"),
    ("snowflake", "SELECT r.id FROM reviews r WHERE AI_FILTER(r.body)",
     "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('{0}', r.body))"),
    ("snowflake", "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Given the title {0} and the review {1}, does it "
                  "mention \"acting\"?', r.title, r.body))", None),
    ("bigquery", "SELECT r.id FROM reviews r WHERE AI.IF(('Given the title ', r.title, ' and the review ', r.body, "
                 "', does it mention \"plot\"?'))", None),
    ("snowflake", "SELECT AI_FILTER('Is \"acting\" a craft?') AS answer", None),
    ("snowflake", "SELECT id FROM (SELECT r.id, r.body FROM reviews r WHERE r.stars > 1) WHERE "
                  "AI_FILTER(PROMPT('Does {0} mention \"acting\"?', body))", None),
    ("snowflake", "SELECT r.id, AI_CLASSIFY(r.body, [{'label': 'acting', 'description': 'the cast'}, "
                  "{'label': 'plot', 'description': 'the story'}]) AS k FROM reviews r",
     "SELECT r.id, AI_CLASSIFY(r.body, [('acting', 'the cast'), ('plot', 'the story')]) AS k FROM reviews r"),
    ("bigquery", "SELECT r.id, AI.CLASSIFY(r.body, categories => ARRAY<STRUCT<description STRING, label STRING>>"
                 "[('the cast', 'acting'), ('the story', 'plot')]) AS k FROM reviews r",
     "SELECT r.id, AI.CLASSIFY(r.body, [('acting', 'the cast'), ('plot', 'the story')]) AS k FROM reviews r"),
    ("bigquery", f"SELECT r.id FROM reviews r WHERE AI.IF(('{ACTING}', r.body), examples => [('The cast shines', "
                 "TRUE), ('A dull plot', FALSE)])",
     f"SELECT r.id FROM reviews r WHERE AI.IF(PROMPT('{ACTING}{{0}}', r.body), {{'examples': [('The cast shines', "
     "TRUE), ('A dull plot', FALSE)]})"),
    ("bigquery", "SELECT r.id, AI.CLASSIFY(r.body, categories => ['acting', 'plot'], examples => [STRUCT('The cast "
                 "shines' AS input, 'acting' AS output)]) AS k FROM reviews r",
     "SELECT r.id, AI.CLASSIFY(r.body, ['acting', 'plot'], {'examples': [('The cast shines', 'acting')]}) AS k "
     "FROM reviews r"),
    ("bigquery", "SELECT r.id, AI.CLASSIFY(r.body, categories => [STRUCT('acting' AS label, 'the cast' AS "
                 "description), STRUCT('plot' AS label, 'the story' AS description)]) AS k FROM reviews r",
     "SELECT r.id, AI.CLASSIFY(r.body, [('acting', 'the cast'), ('plot', 'the story')]) AS k FROM reviews r"),
]


@pytest.fixture(scope="module")
def session() -> Iterator[quail.Session]:
    with keyword_session() as opened:
        yield opened


def _plan(query: object) -> str:
    return render(query.logical_plan) if isinstance(query, quail.Query) else query.explain()  # type: ignore[attr-defined]


@pytest.mark.parametrize(("dialect", "sql", "equivalent"), FORMS, ids=[f"{d}: {s[:70]}" for d, s, _ in FORMS])
def test_a_documented_form_answers_as_the_oracle_and_plans_as_its_prompt_form(session, dialect, sql, equivalent):
    query = session.sql(sql, dialect=dialect)
    problem = same_rows(query.run().collect(), oracle_rows(equivalent or sql, dialect), ordered=False)
    assert problem is None, problem
    if equivalent is not None:
        assert _plan(query) == _plan(session.sql(equivalent, dialect=dialect))


@pytest.mark.parametrize(("sql", "names"), [
    ("SELECT r.id FROM reviews r WHERE AI.IF(('x ', r.body), endpoint => 'gemini-2.5-flash')",
     "names model 'gemini-2.5-flash', which is neither"),
    ("SELECT r.id FROM reviews r WHERE AI.IF(('x ', r.body), model_params => JSON '{\"temperature\": 0}')",
     "model_params"),
    ("SELECT r.id FROM reviews r WHERE AI.IF(('x ', r.body), colour => 'red')", "no argument 'colour'"),
])
def test_an_argument_quail_cannot_honour_is_refused_by_name(session, sql, names):
    with pytest.raises(quail.CompileError, match=names):
        session.sql(sql, dialect="bigquery")


@pytest.mark.parametrize(("dialect", "sql", "names"), [
    ("bigquery", "SELECT AI.GENERATE_TABLE(('Count ', r.body)) FROM reviews r", "AI.GENERATE_TABLE is not "
                                                                                  "supported; Quail offers"),
    ("bigquery", "SELECT * FROM VECTOR_SEARCH(TABLE reviews, 'v', (SELECT 1))", "VECTOR_SEARCH is not supported; it "
                                                                              "searches a vector index"),
    ("snowflake", "SELECT AI_TRANSLATE(r.body, 'en', 'de') FROM reviews r", "AI_TRANSLATE is not supported; it is"),
])
def test_the_warehouses_other_ai_functions_are_refused_by_their_own_names(session, dialect, sql, names):
    with pytest.raises(quail.CompileError, match=names):
        session.sql(sql, dialect=dialect)


@pytest.mark.parametrize(("dialect", "sql"), [
    ("snowflake", "SELECT F.ID, F.TITLE FROM REVIEWS F WHERE AI_FILTER(PROMPT('Does {0} mention \"acting\"?', "
                  "F.BODY))"),
    ("bigquery", "SELECT r.Id FROM Reviews R WHERE AI.IF(PROMPT('Does {0} mention \"acting\"?', R.body)) "
                 "AND r.STARS > 2"),
    ("snowflake", "SELECT G.NAME FROM GENRES G WHERE EXISTS (SELECT 1 FROM REVIEWS R WHERE R.GENRE_ID = G.GENRE_ID "
                  "AND AI_FILTER(PROMPT('Does {0} mention \"plot\"?', R.BODY)))"),
])
def test_unquoted_names_are_case_insensitive_as_in_both_warehouses(session, dialect, sql):
    result = session.sql(sql, dialect=dialect).run().collect()
    assert result.num_rows > 0
    assert same_rows(result, oracle_rows(sql, dialect), ordered=False) is None


def test_a_quoted_name_keeps_its_case(session):
    with pytest.raises(quail.CompileError, match="REVIEWS"):
        session.sql('SELECT r.id FROM "REVIEWS" r WHERE AI_FILTER(PROMPT(\'Is {0} good?\', r.body))')


@pytest.mark.parametrize("union", [False, True], ids=["one block", "by the general rule"])
def test_options_accepted_and_unused_are_named_in_explain(session, union):
    sql = "SELECT r.id FROM reviews r WHERE AI.IF(('x ', r.body), connection_id => 'us.conn', max_error_ratio => 0.1)"
    if union:
        sql += " UNION DISTINCT SELECT e.evidence_id FROM evidence e WHERE AI.IF(('y ', e.passage))"
    shown = session.sql(sql, dialect="bigquery").explain()
    assert "connection_id => 'us.conn' accepted and unused" in shown
    assert "max_error_ratio => 0.1 accepted and unused" in shown


CLASSIFIED = "AI_CLASSIFY(r.body, ['acting', 'plot', 'music'])"


@pytest.mark.parametrize(("sql", "bare"), [
    (f"SELECT r.id, {CLASSIFIED}:labels[0]::string AS k FROM reviews r",
     f"SELECT r.id, {CLASSIFIED} AS k FROM reviews r"),
    (f"SELECT r.id, {CLASSIFIED}['labels'][0] AS k FROM reviews r", f"SELECT r.id, {CLASSIFIED} AS k FROM reviews r"),
    (f"SELECT r.id FROM reviews r WHERE {CLASSIFIED}:labels[0] = 'plot'",
     f"SELECT r.id FROM reviews r WHERE {CLASSIFIED} = 'plot'"),
    (f"SELECT {CLASSIFIED}:labels[0]::string AS k, COUNT(*) AS n FROM reviews r GROUP BY 1",
     f"SELECT {CLASSIFIED} AS k, COUNT(*) AS n FROM reviews r GROUP BY 1"),
])
def test_snowflakes_reads_of_ai_classifys_object_give_its_label(session, sql, bare):
    problem = same_rows(session.sql(sql).run().collect(), oracle_rows(bare, "snowflake"), ordered=False)
    assert problem is None, problem


def test_snowflakes_labels_are_an_array_holding_the_label(session):
    labels = session.sql(f"SELECT r.id, {CLASSIFIED}:labels AS k FROM reviews r ORDER BY r.id").run().collect()
    bare = oracle_rows(f"SELECT r.id, {CLASSIFIED} AS k FROM reviews r ORDER BY r.id", "snowflake")
    assert labels.column("k").to_pylist() == [None if k is None else [k] for k in bare.column("k").to_pylist()]
    assert None in bare.column("k").to_pylist()  # a NULL text: NULL labels, as the call is NULL


@pytest.mark.parametrize("path", [":label", "['x']", ":labels.name", ":labels['a']", ":labels[0][0]",
                                  "['labels'][0]['x']", "['labels'][0][1]"])
def test_another_field_of_ai_classifys_object_is_refused_naming_the_one_it_has(session, path):
    with pytest.raises(quail.CompileError, match="AI_CLASSIFY's object has one field, labels"):
        session.sql(f"SELECT r.id, {CLASSIFIED}{path} AS k FROM reviews r")


MULTI = ["acting", "plot", "soundtrack music"]


def _applies(label: str, body: str) -> bool:
    """The keyword rule on a label's question: every word of the label in the review."""
    return words(label) <= words(body)


@pytest.mark.parametrize(("dialect", "call"), [
    ("snowflake", f"AI_CLASSIFY(r.body, {MULTI}, {{'output_mode': 'multi'}})"),
    ("snowflake", f"AI_CLASSIFY(r.body, {MULTI}, {{'output_mode': 'multi', 'task_description': 'Which topics?', "
                  "'examples': [{'input': 'a great cast', 'labels': ['acting'], 'explanation': 'the actors'}]})"),
    ("bigquery", f"AI.CLASSIFY(input => r.body, categories => {MULTI}, output_mode => 'multi')"),
])
def test_multi_label_classification_gives_every_label_that_applies(session, dialect, call):
    """Snowflake's `output_mode: 'multi'`: each label a yes/no question of its own over the document, the labels
    that hold in the order written (an empty list where none does, NULL for a NULL input); `:labels` reads the
    same list, `:labels[0]` its first."""
    got = session.sql(f"SELECT r.id, r.body, {call} AS topics FROM reviews r ORDER BY r.id", dialect=dialect).run()
    rows = got.to_rows()
    assert rows and any(len(row["topics"] or []) > 1 for row in rows) and any(row["topics"] == [] for row in rows)
    for row in rows:
        expected = None if row["body"] is None else [label for label in MULTI if _applies(label, row["body"])]
        assert row["topics"] == expected, row
    if dialect == "snowflake":
        paths = session.sql(f"SELECT r.id, {call}:labels AS l, {call}:labels[0]::string AS first FROM reviews r "
                            "ORDER BY r.id").run().to_rows()
        assert [p["l"] for p in paths] == [row["topics"] for row in rows]
        assert [p["first"] for p in paths] == [(row["topics"] or [None])[0] for row in rows]


def test_multi_label_questions_share_the_documents_and_bad_modes_are_refused(session):
    query = session.sql(f"SELECT r.id, AI_CLASSIFY(r.body, {MULTI}, {{'output_mode': 'multi'}}) AS t FROM reviews r")
    assert isinstance(query, quail.Query), "one block: every label's question over each document"
    with pytest.raises(quail.CompileError, match="output_mode 'several': write 'single' or 'multi'"):
        session.sql("SELECT AI_CLASSIFY(r.body, ['a'], {'output_mode': 'several'}) FROM reviews r")
    with pytest.raises(quail.CompileError, match="has no option 'colour' with output_mode 'multi'"):
        session.sql("SELECT AI_CLASSIFY(r.body, ['a'], {'output_mode': 'multi', 'colour': 'red'}) FROM reviews r")
