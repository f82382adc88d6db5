"""The SQL front end (both dialects) and the Python builder compile to one logical plan.

Every pair below is one query written three times: in Snowflake SQL, in BigQuery SQL and with the
builder. Each SQL text is compared with the same builder query, so the two dialects also agree with
each other. AI items are numbered by where they are written (SQL text order, builder call order),
so each SQL text writes its AI items in the order the builder calls them.

The second half checks that builder mistakes raise CompileError at the call that makes them, and
that the builder is immutable.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pytest
from support.cases import empty_keyword_session

import quail
from quail import CompileError, col, prompt, score
from quail.frontend.builder import Docs
from quail.frontend.compile import compile_query
from quail.logical.nodes import render

# -- the tables -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def session() -> Iterator[quail.Session]:
    s = empty_keyword_session()
    tables = {
        "reviews": pa.table({"id": [1, 2, 3], "body": ["great acting", "dull plot", "fine"], "stars": [5, 2, 3]}),
        "aspects": pa.table({"id": [1, 2], "aspect": ["acting", "plot"]}),
        "claims": pa.table({"id": [1, 2], "text": ["coffee is healthy", "sugar is fine"], "url": [10, 20]}),
        "evidence": pa.table({"id": [10, 20], "passage": ["a study", "a blog"], "source_id": [1, 2]}),
    }
    for name, table in tables.items():
        s.register(name, quail.DocumentProvider.from_table(table, "id"))
    yield s
    s.close()


# -- prompts shared by the builder side ---------------------------------------------------------

POSITIVE = prompt("Is {0} positive?", col("r.body"))
PRICE = prompt("Does {0} mention the price?", col("r.body"))
SPOILER = prompt("Does {0} contain spoilers?", col("r.body"))
DISCUSS = prompt("Does {0} discuss {1}?", col("r.body"), col("a.aspect"))
STORY = prompt("Is {0} about the story?", col("a.aspect"))
SUPPORT = prompt("Does {0} support {1}?", col("e.passage"), col("c.text"))
JOURNAL = prompt("Is {0} from a journal?", col("e.passage"))
HEALTH = prompt("Is {0} about health?", col("c.text"))
THREE = prompt("Does {0} discuss {1} as {2} says?", col("r.body"), col("a.aspect"), col("c.text"))


# -- the pairs ----------------------------------------------------------------------------------

Build = Callable[[quail.Session], quail.Query]


@dataclass(frozen=True)
class Pair:
    name: str
    snowflake: str
    bigquery: str
    build: Build


def _r(s: quail.Session) -> Docs:
    return s.docs("reviews").alias("r")


def _a(s: quail.Session) -> Docs:
    return s.docs("aspects").alias("a")


def _c(s: quail.Session) -> Docs:
    return s.docs("claims").alias("c")


def _e(s: quail.Session) -> Docs:
    return s.docs("evidence").alias("e")


PAIRS: list[Pair] = [
    Pair(
        "one_filter",
        "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} positive?', r.body))",
        "SELECT r.id FROM reviews r WHERE AI.IF(PROMPT('Is {0} positive?', r.body))",
        lambda s: _r(s).ai_filter(POSITIVE).select("r.id"),
    ),
    Pair(
        "two_filters_with_selectivities",
        """SELECT r.id FROM reviews r
           WHERE AI_FILTER(PROMPT('Is {0} positive?', r.body), {'selectivity': 0.3})
             AND AI_FILTER(PROMPT('Does {0} mention the price?', r.body), {'selectivity': 0.6})""",
        """SELECT r.id FROM reviews r
           WHERE AI.IF(PROMPT('Is {0} positive?', r.body), {'selectivity': 0.3})
             AND AI.IF(PROMPT('Does {0} mention the price?', r.body), {'selectivity': 0.6})""",
        lambda s: _r(s).ai_filter(POSITIVE, selectivity=0.3).ai_filter(PRICE, selectivity=0.6).select("r.id"),
    ),
    Pair(
        "three_filters_some_selectivities",
        """SELECT r.id, r.stars FROM reviews r
           WHERE AI_FILTER(PROMPT('Does {0} contain spoilers?', r.body), {'selectivity': 0.05})
             AND AI_FILTER(PROMPT('Is {0} positive?', r.body))
             AND (AI_FILTER(PROMPT('Does {0} mention the price?', r.body), {'selectivity': 1}))""",
        """SELECT r.id, r.stars FROM reviews r
           WHERE AI.IF(PROMPT('Does {0} contain spoilers?', r.body), {'selectivity': 0.05})
             AND AI.IF(PROMPT('Is {0} positive?', r.body))
             AND (AI.IF(PROMPT('Does {0} mention the price?', r.body), {'selectivity': 1}))""",
        lambda s: (_r(s).ai_filter(SPOILER, selectivity=0.05).ai_if(POSITIVE)
                   .ai_filter(PRICE, selectivity=1).select("r.id", "r.stars")),
    ),
    Pair(
        "filter_as_score_threshold",
        "SELECT r.id FROM reviews r WHERE AI_SCORE(PROMPT('Is {0} positive?', r.body)) >= 0.8",
        "SELECT r.id FROM reviews r WHERE AI.SCORE(PROMPT('Is {0} positive?', r.body)) >= 0.8",
        lambda s: _r(s).ai_filter(score(POSITIVE) >= 0.8).select("r.id"),
    ),
    Pair(
        "flipped_score_threshold_with_selectivity_then_filter",
        """SELECT r.id FROM reviews r
           WHERE 0.5 < AI.SCORE(PROMPT('Is {0} positive?', r.body), {'selectivity': 0.4})
             AND AI_FILTER(PROMPT('Does {0} mention the price?', r.body))""",
        """SELECT r.id FROM reviews r
           WHERE 0.5 < AI.SCORE(PROMPT('Is {0} positive?', r.body), {'selectivity': 0.4})
             AND AI.IF(PROMPT('Does {0} mention the price?', r.body))""",
        lambda s: _r(s).ai_filter(score(POSITIVE) > 0.5, selectivity=0.4).ai_if(PRICE).select("r.id"),
    ),
    Pair(
        "join_with_anchor_filter_and_limit",
        """SELECT r.id, a.aspect FROM reviews r
           JOIN aspects a ON AI_FILTER(PROMPT('Does {0} discuss {1}?', r.body, a.aspect), {'anchor': 'r'})
           WHERE AI_FILTER(PROMPT('Is {0} positive?', r.body), {'selectivity': 0.3}) LIMIT 5""",
        """SELECT r.id, a.aspect FROM reviews r
           JOIN aspects a ON AI.IF(PROMPT('Does {0} discuss {1}?', r.body, a.aspect), {'anchor': 'r'})
           WHERE AI.IF(PROMPT('Is {0} positive?', r.body), {'selectivity': 0.3}) LIMIT 5""",
        lambda s: (_r(s).ai_join(_a(s), DISCUSS, anchor="r").ai_filter(POSITIVE, selectivity=0.3)
                   .limit(5).select("r.id", "a.aspect")),
    ),
    Pair(
        "join_then_filters_on_both_sides",
        """SELECT r.id, a.aspect FROM reviews r
           JOIN aspects a ON AI_FILTER(PROMPT('Does {0} discuss {1}?', r.body, a.aspect),
                                       {'anchor': 'a', 'selectivity': 0.1})
           WHERE AI_FILTER(PROMPT('Is {0} positive?', r.body))
             AND AI_FILTER(PROMPT('Is {0} about the story?', a.aspect), {'selectivity': 0.5})""",
        """SELECT r.id, a.aspect FROM reviews r
           JOIN aspects a ON AI.IF(PROMPT('Does {0} discuss {1}?', r.body, a.aspect),
                                   {'anchor': 'a', 'selectivity': 0.1})
           WHERE AI.IF(PROMPT('Is {0} positive?', r.body))
             AND AI.IF(PROMPT('Is {0} about the story?', a.aspect), {'selectivity': 0.5})""",
        lambda s: (_r(s).ai_join(_a(s), DISCUSS, anchor="a", selectivity=0.1)
                   .ai_filter(POSITIVE).ai_filter(STORY, selectivity=0.5).select("r.id", "a.aspect")),
    ),
    Pair(
        "comma_join_of_prefiltered_sides",
        """SELECT r.id, a.aspect FROM reviews r, aspects a
           WHERE AI_FILTER(PROMPT('Is {0} positive?', r.body))
             AND AI_FILTER(PROMPT('Is {0} about the story?', a.aspect))
             AND AI_FILTER(PROMPT('Does {0} discuss {1}?', r.body, a.aspect))""",
        """SELECT r.id, a.aspect FROM reviews r, aspects a
           WHERE AI.IF(PROMPT('Is {0} positive?', r.body))
             AND AI.IF(PROMPT('Is {0} about the story?', a.aspect))
             AND AI.IF(PROMPT('Does {0} discuss {1}?', r.body, a.aspect))""",
        lambda s: _r(s).ai_filter(POSITIVE).ai_join(_a(s).ai_filter(STORY), DISCUSS).select("r.id", "a.aspect"),
    ),
    Pair(
        "comma_join_with_anchor",
        """SELECT a.aspect, r.id FROM reviews r, aspects a
           WHERE AI_FILTER(PROMPT('Does {0} discuss {1}?', r.body, a.aspect), {'anchor': 'a'})""",
        """SELECT a.aspect, r.id FROM reviews r, aspects a
           WHERE AI.IF(PROMPT('Does {0} discuss {1}?', r.body, a.aspect), {'anchor': 'a'})""",
        lambda s: _r(s).ai_join(_a(s), DISCUSS, anchor="a").select("a.aspect", "r.id"),
    ),
    Pair(
        "cross_join_with_predicate_in_where",
        """SELECT r.id, a.id FROM reviews r CROSS JOIN aspects a
           WHERE AI_FILTER(PROMPT('Does {0} discuss {1}?', r.body, a.aspect), {'selectivity': 0.25})""",
        """SELECT r.id, a.id FROM reviews r CROSS JOIN aspects a
           WHERE AI.IF(PROMPT('Does {0} discuss {1}?', r.body, a.aspect), {'selectivity': 0.25})""",
        lambda s: _r(s).ai_join(_a(s), DISCUSS, selectivity=0.25).select("r.id", "a.id"),
    ),
    Pair(
        "join_on_score_threshold",
        """SELECT r.id, a.aspect FROM reviews r
           JOIN aspects a ON AI_SCORE(PROMPT('Does {0} discuss {1}?', r.body, a.aspect), {'anchor': 'r'}) >= 0.7""",
        """SELECT r.id, a.aspect FROM reviews r
           JOIN aspects a ON AI.SCORE(PROMPT('Does {0} discuss {1}?', r.body, a.aspect), {'anchor': 'r'}) >= 0.7""",
        lambda s: _r(s).ai_join(_a(s), score(DISCUSS) >= 0.7, anchor="r").select("r.id", "a.aspect"),
    ),
    Pair(
        "equality_restricted_join",
        """SELECT c.id, e.id FROM claims c
           JOIN evidence e ON c.url = e.id
                          AND AI_FILTER(PROMPT('Does {0} support {1}?', e.passage, c.text), {'anchor': 'e'})""",
        """SELECT c.id, e.id FROM claims c
           JOIN evidence e ON c.url = e.id
                          AND AI.IF(PROMPT('Does {0} support {1}?', e.passage, c.text), {'anchor': 'e'})""",
        lambda s: (_c(s).join(_e(s), on=col("c.url") == col("e.id")).ai_filter(SUPPORT, anchor="e")
                   .select("c.id", "e.id")),
    ),
    Pair(
        "equality_restricted_comma_join_with_filter",
        """SELECT c.text, e.passage FROM claims c, evidence e
           WHERE c.id = e.source_id
             AND AI_FILTER(PROMPT('Does {0} support {1}?', e.passage, c.text))
             AND AI_FILTER(PROMPT('Is {0} from a journal?', e.passage), {'selectivity': 0.5})""",
        """SELECT c.text, e.passage FROM claims c, evidence e
           WHERE c.id = e.source_id
             AND AI.IF(PROMPT('Does {0} support {1}?', e.passage, c.text))
             AND AI.IF(PROMPT('Is {0} from a journal?', e.passage), {'selectivity': 0.5})""",
        lambda s: (_c(s).join(_e(s), on=[col("c.id") == col("e.source_id")]).ai_filter(SUPPORT)
                   .ai_filter(JOURNAL, selectivity=0.5).select("c.text", "e.passage")),
    ),
    Pair(
        # Snowflake writes the three-way predicate in the ON of the last table, BigQuery in WHERE.
        "three_table_prompt",
        """SELECT r.id, a.aspect, c.id FROM reviews r CROSS JOIN aspects a
           JOIN claims c ON AI_FILTER(PROMPT('Does {0} discuss {1} as {2} says?', r.body, a.aspect, c.text))""",
        """SELECT r.id, a.aspect, c.id FROM reviews r, aspects a, claims c
           WHERE AI.IF(PROMPT('Does {0} discuss {1} as {2} says?', r.body, a.aspect, c.text))""",
        lambda s: _r(s).ai_join([_a(s), _c(s)], THREE).select("r.id", "a.aspect", "c.id"),
    ),
    Pair(
        "three_table_prompt_with_anchor_and_filters",
        """SELECT * FROM reviews r, aspects a, claims c
           WHERE AI_FILTER(PROMPT('Is {0} positive?', r.body), {'selectivity': 0.5})
             AND AI_FILTER(PROMPT('Is {0} about health?', c.text))
             AND AI_FILTER(PROMPT('Does {0} discuss {1} as {2} says?', r.body, a.aspect, c.text),
                           {'anchor': 'c', 'selectivity': 0.02})""",
        """SELECT * FROM reviews r, aspects a, claims c
           WHERE AI.IF(PROMPT('Is {0} positive?', r.body), {'selectivity': 0.5})
             AND AI.IF(PROMPT('Is {0} about health?', c.text))
             AND AI.IF(PROMPT('Does {0} discuss {1} as {2} says?', r.body, a.aspect, c.text),
                       {'anchor': 'c', 'selectivity': 0.02})""",
        lambda s: (_r(s).ai_filter(POSITIVE, selectivity=0.5)
                   .ai_join([_a(s), _c(s).ai_filter(HEALTH)], THREE, anchor="c", selectivity=0.02).select()),
    ),
    Pair(
        "exists_with_filter_on_subquery_table",
        """SELECT c.id FROM claims c
           WHERE EXISTS (SELECT 1 FROM evidence e
                         WHERE AI_FILTER(PROMPT('Is {0} from a journal?', e.passage))
                           AND AI_FILTER(PROMPT('Does {0} support {1}?', e.passage, c.text)))""",
        """SELECT c.id FROM claims c
           WHERE EXISTS (SELECT 1 FROM evidence e
                         WHERE AI.IF(PROMPT('Is {0} from a journal?', e.passage))
                           AND AI.IF(PROMPT('Does {0} support {1}?', e.passage, c.text)))""",
        lambda s: _c(s).ai_join(_e(s).ai_filter(JOURNAL), SUPPORT, semantics="exists").select("c.id"),
    ),
    Pair(
        "not_exists_with_filters_inside_and_outside",
        """SELECT c.id, c.url FROM claims c
           WHERE AI_FILTER(PROMPT('Is {0} about health?', c.text), {'selectivity': 0.5})
             AND NOT EXISTS (SELECT 1 FROM evidence e
                             WHERE AI_FILTER(PROMPT('Is {0} from a journal?', e.passage), {'selectivity': 0.2})
                               AND AI_FILTER(PROMPT('Does {0} support {1}?', e.passage, c.text),
                                             {'anchor': 'c', 'selectivity': 0.1}))""",
        """SELECT c.id, c.url FROM claims c
           WHERE AI.IF(PROMPT('Is {0} about health?', c.text), {'selectivity': 0.5})
             AND NOT EXISTS (SELECT 1 FROM evidence e
                             WHERE AI.IF(PROMPT('Is {0} from a journal?', e.passage), {'selectivity': 0.2})
                               AND AI.IF(PROMPT('Does {0} support {1}?', e.passage, c.text),
                                         {'anchor': 'c', 'selectivity': 0.1}))""",
        lambda s: (_c(s).ai_filter(HEALTH, selectivity=0.5)
                   .ai_join(_e(s).ai_filter(JOURNAL, selectivity=0.2), SUPPORT, anchor="c", selectivity=0.1,
                            semantics="anti")
                   .select("c.id", "c.url")),
    ),
    Pair(
        "classify_with_in",
        """SELECT r.id, AI_CLASSIFY(r.body, ['positive', 'negative', 'mixed']) AS sentiment FROM reviews r
           WHERE sentiment IN ('positive', 'mixed')""",
        """SELECT r.id, AI.CLASSIFY(r.body, ['positive', 'negative', 'mixed']) AS sentiment FROM reviews r
           WHERE sentiment IN ('positive', 'mixed')""",
        lambda s: (_r(s).ai_classify(col("r.body"), ["positive", "negative", "mixed"], name="sentiment")
                   .label_in("sentiment", "positive", "mixed").select("r.id")),
    ),
    Pair(
        "classify_prompt_with_described_labels_then_filter",
        """SELECT r.id, AI_CLASSIFY(PROMPT('Which topic is {0} about?', r.body),
                                    [('acting', 'about the actors'), ('plot', 'about the story')],
                                    {'task_description': 'Pick the main topic.'}) AS topic
           FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} positive?', r.body)) AND topic IN ('plot')""",
        """SELECT r.id, AI.CLASSIFY(PROMPT('Which topic is {0} about?', r.body),
                                    [('acting', 'about the actors'), ('plot', 'about the story')],
                                    {'task_description': 'Pick the main topic.'}) AS topic
           FROM reviews r WHERE AI.IF(PROMPT('Is {0} positive?', r.body)) AND topic IN ('plot')""",
        lambda s: (_r(s).ai_classify(prompt("Which topic is {0} about?", col("r.body")),
                                     [("acting", "about the actors"), ("plot", "about the story")],
                                     name="topic", task_description="Pick the main topic.")
                   .ai_filter(POSITIVE).label_in("topic", "plot").select("r.id")),
    ),
    Pair(
        "classify_on_joined_table",
        """SELECT r.id, AI_CLASSIFY(a.aspect, ['craft', 'story']) AS kind FROM reviews r, aspects a
           WHERE AI_FILTER(PROMPT('Does {0} discuss {1}?', r.body, a.aspect)) AND kind IN ('craft')""",
        """SELECT r.id, AI.CLASSIFY(a.aspect, ['craft', 'story']) AS kind FROM reviews r, aspects a
           WHERE AI.IF(PROMPT('Does {0} discuss {1}?', r.body, a.aspect)) AND kind IN ('craft')""",
        lambda s: (_r(s).ai_join(_a(s).ai_classify(col("a.aspect"), ["craft", "story"], name="kind"), DISCUSS)
                   .label_in("kind", "craft").select("r.id")),
    ),
    Pair(
        "score_output_in_select_with_filter",
        """SELECT r.id, AI_SCORE(PROMPT('How funny is {0}?', r.body)) AS funny FROM reviews r
           WHERE AI_FILTER(PROMPT('Is {0} positive?', r.body), {'selectivity': 0.3})""",
        """SELECT r.id, AI.SCORE(PROMPT('How funny is {0}?', r.body)) AS funny FROM reviews r
           WHERE AI.IF(PROMPT('Is {0} positive?', r.body), {'selectivity': 0.3})""",
        lambda s: (_r(s).ai_score(prompt("How funny is {0}?", col("r.body")), name="funny")
                   .ai_filter(POSITIVE, selectivity=0.3).select("r.id")),
    ),
    Pair(
        "classify_and_score_outputs_only",
        """SELECT r.stars, AI_CLASSIFY(r.body, ['short', 'long']) AS size,
                  AI.SCORE(PROMPT('How funny is {0}?', r.body)) AS funny FROM reviews r""",
        """SELECT r.stars, AI.CLASSIFY(r.body, ['short', 'long']) AS size,
                  AI.SCORE(PROMPT('How funny is {0}?', r.body)) AS funny FROM reviews r""",
        lambda s: (_r(s).ai_classify(col("r.body"), ["short", "long"], name="size")
                   .ai_score(prompt("How funny is {0}?", col("r.body")), name="funny").select("r.stars")),
    ),
    Pair(
        "select_star_over_join",
        "SELECT * FROM reviews r JOIN aspects a ON AI_FILTER(PROMPT('Does {0} discuss {1}?', r.body, a.aspect))",
        "SELECT * FROM reviews r JOIN aspects a ON AI.IF(PROMPT('Does {0} discuss {1}?', r.body, a.aspect))",
        lambda s: _r(s).ai_join(_a(s), DISCUSS).select(),
    ),
    Pair(
        "select_star_with_classify",
        "SELECT *, AI_CLASSIFY(r.body, ['short', 'long']) AS size FROM reviews r",
        "SELECT *, AI.CLASSIFY(r.body, ['short', 'long']) AS size FROM reviews r",
        lambda s: _r(s).ai_classify(col("r.body"), ["short", "long"], name="size").select("*"),
    ),
    Pair(
        "select_alias_star_and_column",
        """SELECT a.*, r.id FROM reviews r
           JOIN aspects a ON AI_FILTER(PROMPT('Does {0} discuss {1}?', r.body, a.aspect))""",
        """SELECT a.*, r.id FROM reviews r
           JOIN aspects a ON AI.IF(PROMPT('Does {0} discuss {1}?', r.body, a.aspect))""",
        lambda s: _r(s).ai_join(_a(s), DISCUSS).select("a.*", "r.id"),
    ),
    Pair(
        # limit() may be called anywhere in the chain
        "limit_called_before_filter",
        "SELECT * FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} positive?', r.body)) LIMIT 10",
        "SELECT * FROM reviews r WHERE AI.IF(PROMPT('Is {0} positive?', r.body)) LIMIT 10",
        lambda s: _r(s).limit(10).ai_filter(POSITIVE).select(),
    ),
    Pair(
        "limit_zero",
        "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} positive?', r.body)) LIMIT 0",
        "SELECT r.id FROM reviews r WHERE AI.IF(PROMPT('Is {0} positive?', r.body)) LIMIT 0",
        lambda s: _r(s).ai_filter(POSITIVE).limit(0).select("r.id"),
    ),
    Pair(
        "unaliased_table_with_bare_columns",
        "SELECT id, stars FROM reviews WHERE AI_FILTER(PROMPT('Is {0} positive?', body))",
        "SELECT id, stars FROM reviews WHERE AI.IF(PROMPT('Is {0} positive?', body))",
        lambda s: s.docs("reviews").ai_filter(prompt("Is {0} positive?", col("body"))).select("id", "stars"),
    ),
    Pair(
        "column_list_with_col_objects_in_any_order",
        """SELECT a.aspect, r.stars, r.id FROM reviews r
           JOIN aspects a ON AI_FILTER(PROMPT('Does {0} discuss {1}?', r.body, a.aspect))""",
        """SELECT a.aspect, r.stars, r.id FROM reviews r
           JOIN aspects a ON AI.IF(PROMPT('Does {0} discuss {1}?', r.body, a.aspect))""",
        lambda s: _r(s).ai_join(_a(s), DISCUSS).select(col("a.aspect"), "r.stars", col("r.id")),
    ),
]

DIALECTS = ("snowflake", "bigquery")


def _mismatch(sql: quail.Query, built: quail.Query) -> str:
    return f"\nSQL plan:\n{render(sql.logical_plan)}\nbuilder plan:\n{render(built.logical_plan)}"


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("pair", PAIRS, ids=[p.name for p in PAIRS])
def test_sql_and_builder_give_equal_logical_plans(session, pair: Pair, dialect: str):
    sql = session.sql(getattr(pair, dialect), dialect=dialect)
    built = pair.build(session)
    assert built.logical_plan == sql.logical_plan, _mismatch(sql, built)
    # the plans agree before the logical rules too, so the rules do not hide a difference
    assert compile_query(built.spec, session.catalog) == compile_query(sql.spec, session.catalog)


def test_there_are_at_least_18_pairs_with_distinct_names():
    assert len(PAIRS) >= 18
    assert len({p.name for p in PAIRS}) == len(PAIRS)


@pytest.mark.parametrize("pair", PAIRS, ids=[p.name for p in PAIRS])
def test_each_dialect_uses_its_own_spelling(pair: Pair):
    assert "AI.IF" not in pair.snowflake and "AI.CLASSIFY" not in pair.snowflake
    assert "AI_FILTER" not in pair.bigquery and "AI_CLASSIFY" not in pair.bigquery
    assert "AI_SCORE" not in pair.bigquery


def test_pairs_are_not_trivially_equal(session):
    """Every pair is a different plan, so the equality above compares something."""
    plans = [p.build(session).logical_plan for p in PAIRS]
    for i, plan in enumerate(plans):
        for j in range(i + 1, len(plans)):
            assert plan != plans[j], f"{PAIRS[i].name} and {PAIRS[j].name} give the same plan"


def test_written_positions_follow_builder_call_order(session):
    """Swapping two builder calls swaps their positions: the SQL must be written in call order."""
    one = _r(session).ai_filter(POSITIVE).ai_filter(PRICE).select("r.id")
    other = _r(session).ai_filter(PRICE).ai_filter(POSITIVE).select("r.id")
    assert one.logical_plan != other.logical_plan
    assert other.logical_plan == session.sql(
        "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Does {0} mention the price?', r.body))"
        " AND AI_FILTER(PROMPT('Is {0} positive?', r.body))").logical_plan


# -- regressions: bugs found while writing these tests, now fixed ------------------------------


@pytest.mark.parametrize("dialect", DIALECTS)
def test_select_can_name_an_ai_output(session, dialect: str):
    classify = "AI_CLASSIFY" if dialect == "snowflake" else "AI.CLASSIFY"
    sql = session.sql(f"SELECT {classify}(r.body, ['positive', 'negative']) AS sentiment, r.id FROM reviews r",
                      dialect=dialect)
    built = (_r(session).ai_classify(col("r.body"), ["positive", "negative"], name="sentiment")
             .select("sentiment", "r.id"))
    assert built.logical_plan == sql.logical_plan


@pytest.mark.parametrize("dialect", DIALECTS)
def test_select_output_is_written_before_a_join_predicate(session, dialect: str):
    score_fn, filter_fn = ("AI_SCORE", "AI_FILTER") if dialect == "snowflake" else ("AI.SCORE", "AI.IF")
    sql = session.sql(f"""SELECT r.id, {score_fn}(PROMPT('How funny is {{0}}?', r.body)) AS funny FROM reviews r
                          JOIN aspects a ON {filter_fn}(PROMPT('Does {{0}} discuss {{1}}?', r.body, a.aspect))""",
                      dialect=dialect)
    built = (_r(session).ai_score(prompt("How funny is {0}?", col("r.body")), name="funny")
             .ai_join(_a(session), DISCUSS).select("r.id"))
    assert built.logical_plan == sql.logical_plan, _mismatch(sql, built)


def test_builder_sees_tables_registered_after_it_started():
    s = empty_keyword_session()
    s.register("reviews", quail.DocumentProvider.from_table(pa.table({"id": [1], "body": ["a"]}), "id"))
    started = s.docs("reviews").alias("r")
    s.register("aspects", quail.DocumentProvider.from_table(pa.table({"id": [1], "aspect": ["x"]}), "id"))
    started.ai_join(s.docs("aspects").alias("a"), DISCUSS)


def test_classify_labels_given_as_one_string(session):
    with pytest.raises(CompileError):
        _r(session).ai_classify(col("r.body"), "yes", name="answer")


def test_classify_non_string_label(session):
    with pytest.raises(CompileError):
        _r(session).ai_classify(col("r.body"), [1, 2], name="sentiment")


def test_classify_non_string_task_description(session):
    with pytest.raises(CompileError):
        _r(session).ai_classify(col("r.body"), ["a", "b"], name="sentiment", task_description=3)


def test_join_on_a_bare_column(session):
    with pytest.raises(CompileError):
        _c(session).join(_e(session), on=col("c.url"))


# -- builder mistakes raise CompileError at the call that makes them ------------------------------


def test_unknown_table_in_docs(session):
    with pytest.raises(CompileError, match=r"unknown table 'nope'.*reviews"):
        session.docs("nope")


@pytest.mark.parametrize("column", ["r.nope", "nope", "x.body"])
def test_unknown_column_or_alias_in_a_prompt(session, column: str):
    base = _r(session)
    bad = prompt("Is {0} positive?", col(column))  # prompt() only records the column
    with pytest.raises(CompileError, match=r"unknown (column|alias)"):
        base.ai_filter(bad)


def test_unknown_column_in_a_join_prompt(session):
    base, other = _r(session), _a(session)
    with pytest.raises(CompileError, match=r"unknown column a\.nope"):
        base.ai_join(other, prompt("Does {0} discuss {1}?", col("r.body"), col("a.nope")))


def test_unknown_column_in_classify_and_score(session):
    base = _r(session)
    with pytest.raises(CompileError, match="unknown column"):
        base.ai_classify(col("r.nope"), ["a", "b"], name="k")
    with pytest.raises(CompileError, match="unknown column"):
        base.ai_score(prompt("{0}", col("r.nope")), name="k")


def test_unknown_column_in_select(session):
    query = _r(session).ai_filter(POSITIVE)
    with pytest.raises(CompileError, match=r"unknown column r\.nope"):
        query.select("r.id", "r.nope")


@pytest.mark.parametrize(("template", "columns", "message"), [
    ("Is {0} like {1}?", ("r.body",), r"placeholder \{1\} has no column"),
    ("Is it positive?", ("r.body",), r"has no placeholder \{0\}"),
    ("Is {0} like {0}?", ("r.body",), r"placeholder \{0\} appears more than once"),
    ("Is it positive?", (), "at least one column"),
])
def test_placeholder_mismatch(session, template: str, columns: tuple[str, ...], message: str):
    base = _r(session)
    bad = prompt(template, *(col(c) for c in columns))
    with pytest.raises(CompileError, match=message):
        base.ai_filter(bad)


def test_placeholder_mismatch_in_a_join(session):
    base, other = _r(session), _a(session)
    with pytest.raises(CompileError, match=r"placeholder \{2\} has no column"):
        base.ai_join(other, prompt("{0} {1} {2}", col("r.body"), col("a.aspect")))


def test_prompt_takes_columns_not_strings():
    with pytest.raises(CompileError, match=r"takes col\(\.\.\.\) arguments"):
        prompt("Is {0} positive?", "r.body")  # type: ignore[arg-type]


def test_anchor_outside_the_join(session):
    base, other = _r(session), _a(session)
    with pytest.raises(CompileError, match="anchor 'x' is outside its join"):
        base.ai_join(other, DISCUSS, anchor="x")
    with pytest.raises(CompileError, match=r"anchor 'r' is outside its join.*joins nothing"):
        base.ai_filter(POSITIVE, anchor="r")
    joined = base.ai_join(other, DISCUSS)
    with pytest.raises(CompileError, match="anchor 'a' is outside its join"):
        joined.ai_filter(POSITIVE, anchor="a")


def test_anchor_outside_an_exists_join(session):
    base, other = _c(session), _e(session)
    with pytest.raises(CompileError, match="anchor 'r' is outside its join"):
        base.ai_join(other, SUPPORT, anchor="r", semantics="exists")


@pytest.mark.parametrize("selectivity", [1.5, -0.1, float("nan"), float("inf"), "0.3", True, [0.3]])
def test_selectivity_out_of_range_or_not_a_number(session, selectivity: object):
    base, other = _r(session), _a(session)
    with pytest.raises(CompileError, match=r"selectivity must be a number in \[0, 1\]"):
        base.ai_filter(POSITIVE, selectivity=selectivity)  # type: ignore[arg-type]
    with pytest.raises(CompileError, match=r"selectivity must be a number in \[0, 1\]"):
        base.ai_join(other, DISCUSS, selectivity=selectivity)  # type: ignore[arg-type]


def test_selectivity_bounds_are_allowed(session):
    base = _r(session)
    base.ai_filter(POSITIVE, selectivity=0)
    base.ai_filter(POSITIVE, selectivity=1.0)


@pytest.mark.parametrize("threshold", [1.5, -0.5, float("nan")])
def test_score_threshold_out_of_range(session, threshold: float):
    base = _r(session)
    condition = score(POSITIVE) >= threshold
    with pytest.raises(CompileError, match=r"AI\.SCORE compares against a number in \[0, 1\]"):
        base.ai_filter(condition)


def test_score_compared_with_a_non_number():
    with pytest.raises(CompileError, match="compare with a number"):
        score(POSITIVE) >= "0.5"  # type: ignore[operator]  # noqa: B015
    with pytest.raises(CompileError, match="compare with a number"):
        score(POSITIVE) < True  # noqa: B015


def test_filter_takes_a_prompt_or_a_score_comparison(session):
    base = _r(session)
    with pytest.raises(CompileError, match=r"ai_filter\(\.\.\.\) takes prompt"):
        base.ai_filter(score(POSITIVE))  # type: ignore[arg-type]
    with pytest.raises(CompileError, match=r"ai_filter\(\.\.\.\) takes prompt"):
        base.ai_filter("Is {0} positive?")  # type: ignore[arg-type]


@pytest.mark.parametrize("semantics", ["semi", "FULL", "left", ""])
def test_bad_semantics(session, semantics: str):
    base, other = _c(session), _e(session)
    with pytest.raises(CompileError, match="semantics must be one of full, exists, anti"):
        base.ai_join(other, SUPPORT, semantics=semantics)  # type: ignore[arg-type]


def test_exists_takes_one_table(session):
    base = _r(session)
    with pytest.raises(CompileError, match="exactly one other table"):
        base.ai_join([_a(session), _c(session)], THREE, semantics="exists")


def test_label_in_with_an_unknown_label(session):
    base = _r(session).ai_classify(col("r.body"), ["positive", "negative"], name="sentiment")
    with pytest.raises(CompileError, match="'neutral' is not a label of sentiment"):
        base.label_in("sentiment", "positive", "neutral")


def test_label_in_names_no_classify_output(session):
    base = _r(session).ai_classify(col("r.body"), ["positive", "negative"], name="sentiment")
    with pytest.raises(CompileError, match=r"'mood' in WHERE \.\.\. IN .* names no AI\.CLASSIFY output"):
        base.label_in("mood", "positive")


def test_classify_needs_two_distinct_labels(session):
    base = _r(session)
    with pytest.raises(CompileError, match="at least two labels"):
        base.ai_classify(col("r.body"), ["positive"], name="k")
    with pytest.raises(CompileError, match="labels must be distinct"):
        base.ai_classify(col("r.body"), ["a", ("a", "again")], name="k")


def test_two_ai_outputs_with_one_name(session):
    base = _r(session).ai_classify(col("r.body"), ["a", "b"], name="k")
    with pytest.raises(CompileError, match="two AI outputs share one name"):
        base.ai_score(POSITIVE, name="k")


def test_two_document_columns_on_one_alias(session):
    base = _r(session).ai_filter(POSITIVE)
    with pytest.raises(CompileError, match=r"two document columns on one alias: r\.body and r\.stars"):
        base.ai_filter(prompt("Is {0} high?", col("r.stars")))
    with pytest.raises(CompileError, match="two document columns on one alias"):
        base.ai_join(_a(session), prompt("{0} {1}", col("r.stars"), col("a.aspect")))
    with pytest.raises(CompileError, match="two document columns on one alias"):
        base.ai_classify(col("r.stars"), ["low", "high"], name="k")


def test_one_prompt_reads_an_alias_twice(session):
    base = _r(session)
    with pytest.raises(CompileError, match="reads table alias 'r' in two placeholders"):
        base.ai_filter(prompt("{0} {1}", col("r.body"), col("r.body")))


@pytest.mark.parametrize("n", [-1, 1.5, "3", True, None])
def test_limit_takes_a_non_negative_integer(session, n: object):
    base = _r(session).ai_filter(POSITIVE)
    with pytest.raises(CompileError, match=r"limit\(n\) takes a non-negative integer"):
        base.limit(n)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["r.", ".body", "", "."])
def test_malformed_column_name(name: str):
    with pytest.raises(CompileError, match=r"write 'alias\.column' or 'column'"):
        col(name)


def test_malformed_column_name_in_select(session):
    query = _r(session).ai_filter(POSITIVE)
    with pytest.raises(CompileError, match=r"write 'alias\.column' or 'column'"):
        query.select("r.")


def test_alias_twice_and_bad_alias(session):
    base = _r(session)
    with pytest.raises(CompileError, match="alias 'r' is used for two tables"):
        base.ai_join(session.docs("reviews").alias("r"), prompt("{0}", col("r.body")))
    with pytest.raises(CompileError, match="is not an identifier"):
        session.docs("reviews").alias("1r")
    joined = base.ai_join(_a(session), DISCUSS)
    with pytest.raises(CompileError, match="names a single table"):
        joined.alias("x")


def test_equality_must_compare_two_tables(session):
    base, other = _r(session), _a(session)
    with pytest.raises(CompileError, match="compares columns of one table"):
        base.join(other, on=col("r.id") == col("r.stars"))
    with pytest.raises(CompileError, match="equalities compare two columns"):
        col("r.id") == "a.id"  # noqa: B015
    with pytest.raises(CompileError, match="takes col"):
        base.join(other, on=[])


def test_two_ai_predicates_join_the_same_tables(session):
    joined = _r(session).ai_join(_a(session), DISCUSS)
    with pytest.raises(CompileError, match="two AI predicates join the same tables"):
        joined.ai_filter(prompt("Is {0} like {1}?", col("r.body"), col("a.aspect")))


def test_exists_table_is_not_visible_outside(session):
    base = _c(session).ai_join(_e(session), SUPPORT, semantics="exists")
    with pytest.raises(CompileError, match="only visible inside its EXISTS subquery"):
        base.ai_filter(JOURNAL)


def test_bad_order_rule_in_select(session):
    query = _r(session).ai_filter(POSITIVE)
    with pytest.raises(CompileError, match="order must be one of"):
        query.select(order="random")  # type: ignore[arg-type]


def test_no_ai_predicate_is_refused_at_select(session):
    base = _c(session).join(_e(session), on=col("c.url") == col("e.id"))  # fine while building
    with pytest.raises(CompileError, match="no AI predicate"):
        base.select()


# -- immutability and select() ------------------------------------------------------------------


def test_builder_calls_return_new_objects_and_leave_the_original_unchanged(session):
    base = _r(session)
    before = base.spec
    filtered = base.ai_filter(POSITIVE, selectivity=0.3)
    joined = base.ai_join(_a(session), DISCUSS)
    classified = base.ai_classify(col("r.body"), ["a", "b"], name="k")
    limited = filtered.limit(3)
    for new in (filtered, joined, classified, limited):
        assert new is not base
    assert base.spec == before and base.counter == 0
    assert filtered.spec.limit is None and limited.spec.limit == 3
    assert len(filtered.spec.predicates) == 1 and not filtered.spec.tables[1:]
    assert len(joined.spec.tables) == 2
    # two branches of one base are independent queries
    assert filtered.select("r.id").logical_plan == session.sql(
        "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} positive?', r.body), {'selectivity': 0.3})"
    ).logical_plan
    assert joined.select("r.id").logical_plan == session.sql(
        "SELECT r.id FROM reviews r JOIN aspects a ON AI_FILTER(PROMPT('Does {0} discuss {1}?', r.body, a.aspect))"
    ).logical_plan


def test_a_failed_call_leaves_the_builder_usable(session):
    base = _r(session).ai_filter(POSITIVE)
    before = base.spec
    with pytest.raises(CompileError):
        base.ai_filter(prompt("{0}", col("r.nope")))
    assert base.spec == before
    assert base.select("r.id").logical_plan == session.sql(
        "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} positive?', r.body))").logical_plan


def test_joined_builder_is_not_changed_by_the_join(session):
    other = _a(session).ai_filter(STORY)
    before = other.spec
    _r(session).ai_join(other, DISCUSS)
    assert other.spec == before


def test_builder_is_frozen(session):
    base = _r(session)
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.spec = base.spec  # type: ignore[misc]


def test_select_with_no_columns_means_all_columns(session):
    query = _r(session).ai_join(_a(session), DISCUSS)
    everything = query.select()
    assert everything.logical_plan == query.select("*").logical_plan
    assert everything.logical_plan == query.select("r.*", "a.*").logical_plan
    assert everything.logical_plan == query.select("r.id", "r.body", "r.stars", "a.id", "a.aspect").logical_plan
    assert everything.logical_plan != query.select("r.id").logical_plan
    names = [c.name for c in everything.logical_plan.columns]
    assert names == ["id", "body", "stars", "id", "aspect"]  # as DuckDB names `SELECT *` over a join
    for dialect in DIALECTS:
        spelling = "AI_FILTER" if dialect == "snowflake" else "AI.IF"
        sql = session.sql(f"SELECT * FROM reviews r JOIN aspects a ON {spelling}(PROMPT('Does {{0}} discuss "
                          "{1}?', r.body, a.aspect))", dialect=dialect)
        assert everything.logical_plan == sql.logical_plan


def test_select_with_no_columns_keeps_ai_outputs(session):
    query = _r(session).ai_score(POSITIVE, name="positivity").select()
    names = [c.name for c in query.logical_plan.columns]
    assert names == ["id", "body", "stars", "positivity"]
