"""Run in a child process whose path holds the installed example backend: the same queries on it and on native.

Prints one JSON object: per backend, per query, the rows and the model's numbers (margins, scores, label scores).
"""

from __future__ import annotations

import json
import sys

import pyarrow as pa

import quail

REVIEWS = [
    (1, "The acting was superb and the cast carried every scene with real warmth."),
    (2, "A dull plot, wooden performances, and a soundtrack that never stops."),
    (3, "I loved the lead actress; her performance was moving and honest."),
    (4, "The cinematography is pretty but the story goes nowhere."),
    (5, "Terrible acting all around. I walked out after an hour."),
]
TOPICS = [(1, "actors and performances"), (2, "music and sound")]

QUERIES = {
    "filter": "SELECT r.id FROM reviews r WHERE AI_FILTER(PROMPT('Does the review praise the acting? {0}', r.body))",
    "join": "SELECT r.id, t.tid FROM reviews r JOIN topics t "
            "ON AI_FILTER(PROMPT('Is the review {0} about {1}?', r.body, t.topic))",
    "score": "SELECT r.id, AI.SCORE(PROMPT('Is this review positive? {0}', r.body)) AS s FROM reviews r",
    "labels": "SELECT r.id, AI.CLASSIFY(r.body, ['positive', 'negative', 'mixed']) AS mood FROM reviews r",
}


def numbers(result: quail.QueryResult) -> list[list[float]]:
    """Every model node's readouts, in node order: margins (filters, joins, scores) or label scores."""
    found = []
    for table in result.answer_tables.values():
        column = "margins" if "margins" in table.column_names else "margin"
        values = table.column(column).to_pylist()
        found.append([x for v in values for x in (v if isinstance(v, list) else [v])])
    return found


def run(backend: str) -> dict[str, object]:
    config = quail.EngineConfig(backend=backend, model=sys.argv[1], precision="fp32", cache="off")
    with quail.Session(config) as session:
        session.register("reviews", pa.table({"id": [r[0] for r in REVIEWS], "body": [r[1] for r in REVIEWS]}))
        session.register("topics", pa.table({"tid": [t[0] for t in TOPICS], "topic": [t[1] for t in TOPICS]}))
        answers = {}
        for name, sql in QUERIES.items():
            result = session.sql(sql).run()
            answers[name] = {"rows": sorted(map(list, (tuple(r.values()) for r in result.to_rows()))),
                             "numbers": numbers(result)}
        origin = session.registry.origin("backend", backend)
        return {"answers": answers, "distribution": origin.distribution}


if __name__ == "__main__":
    print(json.dumps({backend: run(backend) for backend in ("native", "transformers")}))
