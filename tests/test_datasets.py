"""The bundled movie-review dataset: schemas, ids, labels, balance and review lengths."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow as pa
import pytest

from quail import datasets

SENTIMENTS = {"positive", "negative", "mixed"}
ASPECT_LABELS = {"positive", "negative", "none"}
STARS = {"positive": {4, 5}, "negative": {1, 2}, "mixed": {2, 3, 4}}
EXPECTED_ASPECTS = [
    "acting", "plot", "directing", "cinematography", "soundtrack", "pacing", "ending", "dialogue",
    "special effects", "character development", "screenplay", "editing",
]


@pytest.fixture(scope="module")
def reviews() -> list[dict]:
    return datasets.reviews().to_pylist()


def test_loaders_return_tables_with_the_declared_schemas():
    table = datasets.reviews()
    assert isinstance(table, pa.Table)
    assert table.schema.equals(datasets.REVIEWS_SCHEMA)
    assert table.column_names == ["id", "title", "body", "sentiment", "stars", "aspects"]
    assert [f.name for f in table.schema.field("aspects").type] == EXPECTED_ASPECTS
    assert table.num_rows == 64
    table = datasets.aspects()
    assert table.schema.equals(datasets.ASPECTS_SCHEMA)
    assert table.column_names == ["id", "aspect", "description"]
    assert table.num_rows == 12
    for name in table.column_names:
        assert table.column(name).null_count == 0


def test_path_resolves_package_data_and_rejects_unknown_names():
    assert datasets.path("reviews") == datasets.path("reviews.jsonl")
    assert datasets.path("aspects").is_file()
    with datasets.path("reviews").open(encoding="utf-8") as f:
        assert sum(1 for line in f if line.strip()) == 64
    with pytest.raises(FileNotFoundError):
        datasets.path("no-such-dataset")


def test_every_line_of_the_files_is_a_json_object_with_exactly_the_expected_fields():
    for name, fields in (("reviews", set(datasets.REVIEWS_SCHEMA.names)), ("aspects", {"id", "aspect", "description"})):
        for line in datasets.path(name).read_text(encoding="utf-8").splitlines():
            assert set(json.loads(line)) == fields


def test_aspects_table_lists_the_twelve_aspects_with_ids_1_to_12():
    rows = datasets.aspects().to_pylist()
    assert [r["id"] for r in rows] == list(range(1, 13))
    assert [r["aspect"] for r in rows] == EXPECTED_ASPECTS
    assert list(datasets.ASPECT_NAMES) == EXPECTED_ASPECTS
    assert all(r["description"].strip() for r in rows)


def test_review_ids_are_1_to_64_and_unique_and_titles_unique(reviews):
    assert [r["id"] for r in reviews] == list(range(1, 65))
    assert len({r["title"] for r in reviews}) == 64


def test_labels_come_from_the_allowed_sets_and_stars_match_sentiment(reviews):
    for r in reviews:
        assert r["sentiment"] in SENTIMENTS, r["id"]
        assert r["stars"] in STARS[r["sentiment"]], r["id"]
        assert list(r["aspects"]) == EXPECTED_ASPECTS, r["id"]
        assert set(r["aspects"].values()) <= ASPECT_LABELS, r["id"]


def test_sentiments_are_roughly_24_positive_24_negative_16_mixed(reviews):
    counts = Counter(r["sentiment"] for r in reviews)
    assert abs(counts["positive"] - 24) <= 2
    assert abs(counts["negative"] - 24) <= 2
    assert abs(counts["mixed"] - 16) <= 2


def test_every_aspect_is_discussed_in_at_least_eight_reviews(reviews):
    discussed = Counter(a for r in reviews for a, label in r["aspects"].items() if label != "none")
    assert {a: discussed[a] for a in EXPECTED_ASPECTS if discussed[a] < 8} == {}


def test_mixed_reviews_praise_and_pan_aspects_while_one_sided_reviews_do_not(reviews):
    for r in reviews:
        labels = set(r["aspects"].values()) - {"none"}
        if r["sentiment"] == "mixed":
            assert labels == {"positive", "negative"}, r["id"]
        else:
            assert labels <= {r["sentiment"]}, r["id"]


def test_every_review_body_has_25_to_110_words(reviews):
    lengths = {r["id"]: len(r["body"].split()) for r in reviews}
    assert {i: n for i, n in lengths.items() if not 25 <= n <= 110} == {}


# --- claims, evidence and agent traces -------------------------------------------------------------------------------

CLAIM_LABELS = {"supported", "refuted", "unverifiable"}


@pytest.fixture(scope="module")
def claims() -> list[dict]:
    return datasets.claims().to_pylist()


@pytest.fixture(scope="module")
def evidence() -> list[dict]:
    return datasets.evidence().to_pylist()


@pytest.fixture(scope="module")
def traces() -> list[dict]:
    return datasets.traces().to_pylist()


def _words(text: str) -> int:
    return len(text.split())


@pytest.mark.parametrize(
    ("loader", "schema", "columns", "rows"),
    [
        (datasets.claims, datasets.CLAIMS_SCHEMA, ["id", "text", "url", "label"], 24),
        (datasets.evidence, datasets.EVIDENCE_SCHEMA, ["id", "source", "passage"], 60),
        (datasets.traces, datasets.TRACES_SCHEMA, ["id", "session", "step", "log", "outcome", "has_error"], 32),
    ],
)
def test_new_loaders_return_tables_with_the_declared_schemas(loader, schema, columns, rows):
    table = loader()
    assert isinstance(table, pa.Table)
    assert table.schema.equals(schema)
    assert table.column_names == columns
    assert table.num_rows == rows
    for name in columns:
        assert table.column(name).null_count == 0


def test_path_knows_every_dataset_and_each_file_has_exactly_the_schema_fields():
    schemas = {
        "reviews": datasets.REVIEWS_SCHEMA,
        "labeled_reviews": datasets.REVIEWS_SCHEMA,
        "aspects": datasets.ASPECTS_SCHEMA,
        "claims": datasets.CLAIMS_SCHEMA,
        "evidence": datasets.EVIDENCE_SCHEMA,
        "traces": datasets.TRACES_SCHEMA,
    }
    assert set(datasets.DATASET_NAMES) == set(schemas)
    for name, schema in schemas.items():
        assert datasets.path(name) == datasets.path(f"{name}.jsonl")
        for line in datasets.path(name).read_text(encoding="utf-8").splitlines():
            assert set(json.loads(line)) == set(schema.names), name


def test_claim_and_evidence_ids_run_from_1_and_texts_are_unique(claims, evidence):
    assert [c["id"] for c in claims] == list(range(1, 25))
    assert [e["id"] for e in evidence] == list(range(1, 61))
    assert len({c["text"] for c in claims}) == 24
    assert len({e["passage"] for e in evidence}) == 60


def test_claims_cite_16_urls_some_shared_and_use_the_three_labels(claims):
    urls = Counter(c["url"] for c in claims)
    assert len(urls) == 16
    assert set(urls.values()) == {1, 2}
    assert all(u.startswith("https://example.org/wiki/") for u in urls)
    labels = Counter(c["label"] for c in claims)
    assert set(labels) == CLAIM_LABELS
    assert min(labels.values()) >= 4


def test_every_cited_url_has_2_to_5_passages_and_4_sources_are_never_cited(claims, evidence):
    cited = {c["url"] for c in claims}
    per_source = Counter(e["source"] for e in evidence)
    assert {u: per_source[u] for u in cited if not 2 <= per_source[u] <= 5} == {}
    assert len(set(per_source) - cited) == 4
    assert all(s.startswith("https://example.org/wiki/") for s in per_source)


def test_claims_have_10_to_25_words_and_passages_25_to_70(claims, evidence):
    assert {c["id"]: _words(c["text"]) for c in claims if not 10 <= _words(c["text"]) <= 25} == {}
    assert {e["id"]: _words(e["passage"]) for e in evidence if not 25 <= _words(e["passage"]) <= 70} == {}


def test_traces_are_4_sessions_of_8_steps_with_one_outcome_per_session(traces):
    assert [t["id"] for t in traces] == list(range(1, 33))
    assert [(t["session"], t["step"]) for t in traces] == [(s, k) for s in range(1, 5) for k in range(1, 9)]
    outcomes = {s: {t["outcome"] for t in traces if t["session"] == s} for s in range(1, 5)}
    assert all(len(o) == 1 for o in outcomes.values())
    assert set().union(*outcomes.values()) == {"success", "failure"}


def test_each_trace_row_extends_the_previous_row_of_its_session_by_one_step(traces):
    previous: dict[int, str] = {}
    for t in traces:
        log = t["log"]
        if t["step"] == 1:
            task, sep, step = log.partition("\n[step 1] ")
            assert sep, t["id"]
            assert 60 <= _words(task) <= 120, t["id"]
            added = sep + step
        else:
            prior = previous[t["session"]]
            assert log.startswith(prior) and len(log) > len(prior), t["id"]
            added = log[len(prior) :]
            assert added.startswith(f"\n[step {t['step']}] "), t["id"]
        assert added.count("\n[step ") == 1, t["id"]
        assert "tool=" in added and "-> result:" in added, t["id"]
        assert 25 <= _words(added) <= 60, t["id"]
        previous[t["session"]] = log


def test_has_error_flags_rows_whose_log_so_far_reports_an_error(traces):
    for t in traces:
        assert t["has_error"] == ("-> result: error:" in t["log"]), t["id"]
    by_session = {s: [t["has_error"] for t in traces if t["session"] == s] for s in range(1, 5)}
    midway = [s for s, flags in by_session.items() if not flags[0] and flags[-1]]
    assert len(midway) >= 2
    assert any(not any(flags) for flags in by_session.values())
    for flags in by_session.values():
        assert flags == sorted(flags)


def test_the_labeled_reviews_are_240_balanced_varied_and_distinct_from_the_demo_reviews(reviews):
    labeled = datasets.labeled_reviews().to_pylist()
    assert [r["id"] for r in labeled] == list(range(1001, 1241))
    assert Counter(r["sentiment"] for r in labeled) == {"positive": 80, "negative": 80, "mixed": 80}
    for review in labeled:
        assert review["stars"] in STARS[review["sentiment"]], review["id"]
        assert set(review["aspects"].values()) <= ASPECT_LABELS
        assert 1 <= sum(v != "none" for v in review["aspects"].values()) <= 5, review["id"]
    for aspect in EXPECTED_ASPECTS:
        labels = Counter(r["aspects"][aspect] for r in labeled)
        assert labels["positive"] >= 8 and labels["negative"] >= 8, aspect
    words = [len(r["body"].split()) for r in labeled]
    assert min(words) < 40 and max(words) > 110 and sum(w > 110 for w in words) >= 48
    titles = {r["title"] for r in labeled}
    assert len(titles) == 240 and not titles & {r["title"] for r in reviews}
