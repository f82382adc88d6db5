"""Small bundled datasets for demos and benchmarks: invented movie reviews with labels.

`reviews()` has 64 reviews with an overall `sentiment`, `stars` and, in `aspects`, one label per
aspect ("positive", "negative" or "none"); `aspects()` names and defines the 12 aspects.
"""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

import pyarrow as pa

__all__ = ["ASPECTS_SCHEMA", "ASPECT_NAMES", "REVIEWS_SCHEMA", "aspects", "path", "reviews"]

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


def path(name: str) -> Path:
    """The file of a bundled dataset: `path("reviews")` or `path("reviews.jsonl")`."""
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


def aspects() -> pa.Table:
    """The 12 review aspects with a one-sentence description (schema `ASPECTS_SCHEMA`)."""
    return _read("aspects", ASPECTS_SCHEMA)
