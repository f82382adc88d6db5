"""Small bundled datasets for demos and benchmarks, all invented: movie reviews, claims with evidence, agent traces.

`reviews()` has 64 reviews with an overall `sentiment`, `stars` and, in `aspects`, one label per
aspect ("positive", "negative" or "none"); `aspects()` names and defines the 12 aspects.

`labeled_reviews()` has 240 more reviews in the same schema (ids 1001–1240: 80 positive, 80 negative,
80 mixed; 15 to 200 words; sarcasm and praise inside pans included), written to measure answer quality
(contextual calibration) and to run the benchmark at ≥ 200 documents.

`claims()` has 24 one-sentence claims, each citing a page `url` and labelled "supported", "refuted" or
"unverifiable"; `evidence()` has 60 passages from 20 pages (`source`), 2 to 5 for every cited page.

`traces()` has 32 cumulative agent logs, 4 sessions of 8 steps: within a session each row's `log` is the
previous row's `log` plus one more step, with the session's `outcome` and whether an error has occurred so far.
"""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

import pyarrow as pa

__all__ = [
    "ASPECTS_SCHEMA",
    "ASPECT_NAMES",
    "CLAIMS_SCHEMA",
    "DATASET_NAMES",
    "EVIDENCE_SCHEMA",
    "REVIEWS_SCHEMA",
    "TRACES_SCHEMA",
    "aspects",
    "claims",
    "evidence",
    "labeled_reviews",
    "path",
    "reviews",
    "traces",
]

DATASET_NAMES: tuple[str, ...] = ("reviews", "labeled_reviews", "aspects", "claims", "evidence", "traces")

ASPECT_NAMES: tuple[str, ...] = (
    "acting",
    "plot",
    "directing",
    "cinematography",
    "soundtrack",
    "pacing",
    "ending",
    "dialogue",
    "special effects",
    "character development",
    "screenplay",
    "editing",
)

REVIEWS_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("title", pa.string()),
        ("body", pa.string()),
        ("sentiment", pa.string()),
        ("stars", pa.int64()),
        ("aspects", pa.struct([(name, pa.string()) for name in ASPECT_NAMES])),
    ]
)

ASPECTS_SCHEMA = pa.schema([("id", pa.int64()), ("aspect", pa.string()), ("description", pa.string())])

CLAIMS_SCHEMA = pa.schema([("id", pa.int64()), ("text", pa.string()), ("url", pa.string()), ("label", pa.string())])

EVIDENCE_SCHEMA = pa.schema([("id", pa.int64()), ("source", pa.string()), ("passage", pa.string())])

TRACES_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("session", pa.int64()),
        ("step", pa.int64()),
        ("log", pa.string()),
        ("outcome", pa.string()),
        ("has_error", pa.bool_()),
    ]
)


def path(name: str) -> Path:
    """The file of a bundled dataset (one of `DATASET_NAMES`): `path("claims")` or `path("claims.jsonl")`."""
    filename = name if "." in name else f"{name}.jsonl"
    resource = files(__name__).joinpath(filename)
    if not resource.is_file():
        raise FileNotFoundError(f"no bundled dataset file {filename!r}")
    return Path(str(resource))


def _read(name: str, schema: pa.Schema) -> pa.Table:
    with path(name).open(encoding="utf-8") as lines:
        rows = [json.loads(line) for line in lines if line.strip()]
    return pa.Table.from_pylist(rows, schema=schema)


def reviews() -> pa.Table:
    """The 64 labelled movie reviews (schema `REVIEWS_SCHEMA`)."""
    return _read("reviews", REVIEWS_SCHEMA)


def labeled_reviews() -> pa.Table:
    """240 further labelled movie reviews for quality measurements (schema `REVIEWS_SCHEMA`)."""
    return _read("labeled_reviews", REVIEWS_SCHEMA)


def aspects() -> pa.Table:
    """The 12 review aspects with a one-sentence description (schema `ASPECTS_SCHEMA`)."""
    return _read("aspects", ASPECTS_SCHEMA)


def claims() -> pa.Table:
    """The 24 labelled claims, each citing one page url (schema `CLAIMS_SCHEMA`)."""
    return _read("claims", CLAIMS_SCHEMA)


def evidence() -> pa.Table:
    """The 60 evidence passages with the url of the page they come from (schema `EVIDENCE_SCHEMA`)."""
    return _read("evidence", EVIDENCE_SCHEMA)


def traces() -> pa.Table:
    """The 32 cumulative agent-trace rows, 4 sessions of 8 steps (schema `TRACES_SCHEMA`)."""
    return _read("traces", TRACES_SCHEMA)
