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
