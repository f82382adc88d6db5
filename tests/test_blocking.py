"""Similarity blocking of AI joins on the keyword test backend: the model is asked only the pairs the embeddings keep
(checked against a brute-force oracle of the same embedding rule), the rows are the unblocked join's rows among those
pairs, the report counts the pairs and estimates the recall from a judged sample, and misuse is refused by name."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest
from support.relational_oracle import TABLES, keyword_session

import quail
from quail.catalog.models import ALL_MINILM_L6_V2
from quail.runtime.blocking import BlockedQuery
from quail.testing.rules import embedded_vector

DISCUSS = "Does the review {0} discuss {1}?"
JOIN = ("SELECT r.id, a.aspect_id FROM reviews r JOIN aspects a ON AI_FILTER(PROMPT('" + DISCUSS + "', r.body, "
        "a.aspect){options}) ORDER BY r.id, a.aspect_id")


@pytest.fixture(scope="module")
def session() -> Iterator[quail.Session]:
    with keyword_session() as opened:
        yield opened


def vectors(texts: list[str]) -> np.ndarray:
    return np.asarray([embedded_vector(t, ALL_MINILM_L6_V2.dimensions) for t in texts], np.float64)


def oracle_pairs(k: int | None = None, similarity: float | None = None) -> set[tuple[str, str]]:
    """Brute force: every review text's k nearest aspect texts (ties to the earlier aspect text as faiss orders
    them — compared as sets of cosines below), or every pair at or above the similarity."""
    bodies = sorted({b for b in TABLES["reviews"].column("body").to_pylist() if b is not None})
    aspects = sorted({a for a in TABLES["aspects"].column("aspect").to_pylist() if a is not None})
    cosines = vectors(bodies) @ vectors(aspects).T
    if similarity is not None:
        return {(b, a) for i, b in enumerate(bodies) for j, a in enumerate(aspects)
                if cosines[i, j] >= similarity - 1e-6}
    assert k is not None
    return {(b, aspects[j]) for i, b in enumerate(bodies) for j in np.argsort(-cosines[i], kind="stable")[:k]}


def unblocked(session: quail.Session) -> set[tuple[int, int]]:
    rows = session.sql(JOIN.replace("{options}", "")).run().collect().to_pylist()
    return {(row["id"], row["aspect_id"]) for row in rows}


def test_a_blocked_join_asks_only_the_kept_pairs_and_returns_the_unblocked_rows_among_them(session):
    query = session.sql(JOIN.replace("{options}", ", {'blocking': 'top_k', 'k': 2}"))
    assert isinstance(query, BlockedQuery)
    result = query.run()
    rows = {(row["id"], row["aspect_id"]) for row in result.collect().to_pylist()}
    kept = {(p["l"], p["r"]) for p in query.pairs().table.to_pylist()}
    expected_pairs = oracle_pairs(k=2)
    assert len(kept) == len(expected_pairs) == 13 * 2
    body_of = {r["id"]: r["body"] for r in TABLES["reviews"].to_pylist()}
    aspect_of = {a["aspect_id"]: a["aspect"] for a in TABLES["aspects"].to_pylist()}
    assert rows == {pair for pair in unblocked(session) if (body_of[pair[0]], aspect_of[pair[1]]) in kept}
    join = next(m for name, m in result.query_report.node_metrics.items() if name.startswith("join"))
    assert join.computed_answers == len(kept)  # nothing outside the blocks is asked (the sample runs apart)
    report = result.report["blocking"]
    assert report["pairs_before"] == 13 * 5 and report["pairs_after"] == 26
    assert report["sampled"] == 32 and 0 < report["estimated_recall"] <= 1
    work = result.query_report.node_metrics  # the embeddings and the sample are the query's work too
    assert {"blocking/left/embed_d", "blocking/right/embed_d"} <= set(work)
    assert sum(m.computed_answers or 0 for name, m in work.items() if name.startswith("blocking/sample/")) == 32


def test_the_kept_pairs_are_each_texts_nearest_by_cosine(session):
    for options, expected in ((", {'blocking': 'top_k', 'k': 3}", oracle_pairs(k=3)),
                              (", {'blocking': 'threshold', 'similarity': 0.1}", oracle_pairs(similarity=0.1))):
        pairs = session.sql(JOIN.replace("{options}", options)).pairs().table.to_pylist()
        kept = {(p["l"], p["r"]) for p in pairs}
        if "threshold" in options:
            assert kept == expected
        else:  # equal cosines may be ordered either way: compare each text's kept cosines
            assert _cosines(kept) == _cosines(expected)


def _cosines(pairs: set[tuple[str, str]]) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {}
    for body, aspect in pairs:
        cosine = float(vectors([body])[0] @ vectors([aspect])[0])
        found.setdefault(body, []).append(round(cosine, 5))
    return {body: sorted(values) for body, values in found.items()}


def test_blocking_that_keeps_every_pair_changes_nothing_and_misses_nothing(session):
    result = session.sql(JOIN.replace("{options}", ", {'blocking': 'top_k', 'k': 50}")).run()
    assert {(r["id"], r["aspect_id"]) for r in result.collect().to_pylist()} == unblocked(session)
    assert result.report["blocking"]["sampled"] == 0 and result.report["blocking"]["estimated_recall"] == 1.0


def test_the_recall_estimate_is_near_the_true_recall(session):
    result = session.sql(JOIN.replace("{options}", ", {'blocking': 'top_k', 'k': 1}")).run()
    truth = unblocked(session)
    found = {(r["id"], r["aspect_id"]) for r in result.collect().to_pylist()}
    true_recall = len(found) / len(truth)
    estimate = result.report["blocking"]["estimated_recall"]
    assert abs(estimate - true_recall) < 0.2, (estimate, true_recall)
    assert any("estimated recall" in remark for remark in result.query_report.remarks)


def test_bigquery_spelling_and_select_star(session):
    sql = ("SELECT * FROM reviews r JOIN aspects a ON AI.IF(PROMPT('" + DISCUSS + "', r.body, a.aspect), "
           "STRUCT('top_k' AS blocking, 2 AS k))")
    table = session.sql(sql, dialect="bigquery").run().collect()
    assert "l" not in table.column_names and "aspect" in table.column_names and "body" in table.column_names


def test_explain_shows_the_pairs_before_and_after_and_a_recall_estimated_before_the_run(session):
    text = session.sql(JOIN.replace("{options}", ", {'blocking': 'top_k', 'k': 1}")).explain()
    assert "65 pairs of distinct texts (13 × 5) → 13 asked" in text
    found = re.search(r"estimated recall before the run ([\d.]+) \(≥ ([\d.]+) at 95 %\): (\d+) of 13 sampled kept "
                      r"pairs and (\d+) of 32 left out hold", text)
    assert found, text
    assert "the run asks them again: the answer store is off" in text
    estimate, lower, inside_true, outside_true = (float(found.group(1)), float(found.group(2)), int(found.group(3)),
                                                  int(found.group(4)))
    # every kept pair is in the pilot here (13 ≤ 32): its count inside is the run's own
    run = session.sql(JOIN.replace("{options}", ", {'blocking': 'top_k', 'k': 1}")).run()
    assert inside_true == len(run.collect())
    outside = 65 - 13
    assert estimate == pytest.approx(round(inside_true / (inside_true + outside_true / 32 * outside), 3), abs=1e-3)
    assert lower <= estimate
    truth = unblocked(session)
    assert abs(estimate - len(run.collect()) / len(truth)) < 0.2


def test_the_pilot_is_stored_so_the_run_after_explain_asks_none_of_its_pairs_again(tmp_path):
    with keyword_session(store=tmp_path / "store") as opened:
        query = opened.sql(JOIN.replace("{options}", ", {'blocking': 'top_k', 'k': 1}"))
        assert "asked while explaining; the answer store keeps them for the run" in query.explain()
        result = query.run()
    work = result.query_report.node_metrics
    asked = {name: m.computed_answers or 0 for name, m in work.items()
             if name.startswith("join") or name.startswith("blocking/sample/")}
    assert asked and sum(asked.values()) == 0, asked  # the kept pairs and the left-out sample: all from the pilot


def test_explain_says_when_no_pilot_pair_holds():
    """40 kept pairs, 32 of them in the pilot, none holding (nor any left-out one): nothing to estimate from."""
    left = pa.table({"id": list(range(40)), "body": [f"zzz qqq {i}" for i in range(40)]})
    right = pa.table({"aspect_id": [1, 2, 3], "aspect": ["music", "plot", "acting"]})
    with keyword_session(tables={"reviews": left, "aspects": right}) as opened:
        text = opened.sql(JOIN.replace("{options}", ", {'blocking': 'top_k', 'k': 1}")).explain()
    assert "estimated recall: no sampled pair holds, so the pilot cannot tell" in text


def test_a_large_unblocked_join_is_proposed_blocking():
    left = pa.table({"id": list(range(150)), "body": [f"review number {i} about acting and plot" for i in range(150)]})
    right = pa.table({"aspect_id": list(range(80)), "aspect": [f"aspect {i} music" for i in range(80)]})
    with keyword_session(tables={"reviews": left, "aspects": right}) as opened:
        text = opened.sql(JOIN.replace("{options}", "")).explain()
    assert "asks 12,000 pairs: similarity blocking would ask about" in text


@pytest.mark.parametrize(("options", "message"), [
    (", {'blocking': 'top_k'}", "needs 'k'"),
    (", {'blocking': 'top_k', 'k': 0}", "k must be a whole number"),
    (", {'blocking': 'threshold'}", "needs 'similarity'"),
    (", {'blocking': 'threshold', 'similarity': 2}", "similarity must be a cosine"),
    (", {'blocking': 'nearest', 'k': 2}", "blocking 'nearest' is not supported"),
])
def test_bad_blocking_options_are_refused_before_any_model_work(session, options, message):
    with pytest.raises(quail.CompileError, match=message):
        session.sql(JOIN.replace("{options}", options))


def test_blocking_outside_an_ai_join_is_refused(session):
    with pytest.raises(quail.CompileError, match="write the call in the join's ON"):
        session.sql("SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Is {0} good?', r.body), "
                    "{'blocking': 'top_k', 'k': 2})")
    with pytest.raises(quail.CompileError, match="compares two qualified columns"):
        session.sql("SELECT r.id FROM reviews r JOIN aspects a ON AI_FILTER(PROMPT('Is {0} {1} {2}?', r.body, "
                    "a.aspect, r.title), {'blocking': 'top_k', 'k': 2})")


def test_the_blocked_join_keeps_the_unblocked_joins_anchor_so_each_pair_gets_the_same_prompt(session):
    """Which document an AI join anchors decides each pair's prompt layout; the pairs relation changes the costs, so
    the blocked join is pinned to the anchor the planner gives the join without blocking."""
    anchor = re.compile(r"anchors #0 on (\w+)")
    plain = anchor.search(session.sql(JOIN.replace("{options}", "")).explain())
    blocked = anchor.search(session.sql(JOIN.replace("{options}", ", {'blocking': 'top_k', 'k': 2}")).explain())
    assert plain is not None and blocked is not None and plain.group(1) == blocked.group(1)
    pinned = JOIN.replace("{options}", ", {'blocking': 'top_k', 'k': 2, 'anchor': 'r'}")
    assert "anchors #0 on r" in session.sql(pinned).explain()  # the user's own anchor stands


BLOCK = ", {'blocking': 'top_k', 'k': 2}"


@pytest.mark.parametrize(("sql", "message"), [
    (JOIN.replace("JOIN aspects", "LEFT JOIN aspects").replace("{options}", BLOCK), "applies to an inner join"),
    ("WITH good AS (SELECT * FROM reviews WHERE stars >= 4) SELECT g.id FROM good g JOIN aspects a ON AI_FILTER("
     "PROMPT('" + DISCUSS + "', g.body, a.aspect)" + BLOCK + ")", "reads two registered tables"),
    (JOIN.replace("SELECT r.id, a.aspect_id", "SELECT * EXCLUDE (body)").replace(" ORDER BY r.id, a.aspect_id", "")
     .replace("{options}", BLOCK), "name the columns you want"),
    (JOIN.replace("{options}", ", {'blocking': 'top_k', 'k': 2, 'similarity': 0.5}"), "takes no 'similarity'"),
])
def test_blocking_where_it_would_change_the_answer_is_refused(session, sql, message):
    with pytest.raises(quail.CompileError, match=message):
        session.sql(sql)


def test_repeated_texts_count_once_in_the_recall_estimate():
    reviews = TABLES["reviews"]
    repeated = pa.concat_tables([reviews.set_column(0, "id", pa.array([i * 1000 + r for r in
                                                                         reviews.column("id").to_pylist()]))
                                 for i in range(6)])
    with keyword_session(tables={"reviews": repeated, "aspects": TABLES["aspects"]}) as opened:
        every = opened.sql(JOIN.replace("{options}", ", {'blocking': 'top_k', 'k': 50}")).run().report["blocking"]
        blocked = opened.sql(JOIN.replace("{options}", ", {'blocking': 'top_k', 'k': 1}")).run().report["blocking"]
    assert every["pairs_before"] == every["pairs_after"] == 13 * 5 and every["estimated_recall"] == 1.0
    assert every["inside_true"] == 20  # distinct text pairs that hold, not the 6 × as many row pairs
    assert blocked["sampled_true"] <= blocked["sampled"] and 0.0 <= blocked["estimated_recall"] <= 1.0


def test_the_blocks_are_chosen_among_the_rows_the_tables_own_conditions_keep(session):
    sql = JOIN.replace(" ORDER BY", " WHERE r.stars >= 4 ORDER BY").replace("{options}", BLOCK)
    result = session.sql(sql).run()
    bodies = {r["body"] for r in TABLES["reviews"].to_pylist() if r["body"] is not None and (r["stars"] or 0) >= 4}
    assert result.report["blocking"]["pairs_before"] == len(bodies) * 5
    assert result.report["blocking"]["estimated_recall"] is not None


def test_a_limit_that_stops_the_join_early_leaves_the_recall_unestimated(session):
    sql = JOIN.replace(" ORDER BY r.id, a.aspect_id", " LIMIT 1").replace("{options}", BLOCK)
    result = session.sql(sql).run()
    assert result.report["blocking"]["estimated_recall"] is None
    assert any("recall not estimated" in remark for remark in result.query_report.remarks)


def test_the_pairs_relation_names_never_collide_with_the_users():
    notes = pa.table({"id": [1, 2, 3], "l": ["the acting", "the plot twists", "music"],
                      "r": ["x", "y", "z"]})
    with keyword_session(tables={"blocked_pairs": notes, "aspects": TABLES["aspects"]}) as opened:
        sql = ("SELECT l, r, a.aspect FROM blocked_pairs JOIN aspects a ON AI_FILTER(PROMPT('" + DISCUSS +
               "', blocked_pairs.l, a.aspect)" + BLOCK + ") ORDER BY l, a.aspect")
        rows = opened.sql(sql).run().to_rows()
    assert rows and {row["r"] for row in rows} <= {"x", "y", "z"}
