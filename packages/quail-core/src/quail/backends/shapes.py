"""The standard Arrow shapes every backend returns, so the generic runtime never needs backend code.

* filter answers: `<alias>` int32 row, `predicate` int32 written position, `answer` bool, `margin` float64
* join answers: one int32 column per alias of the predicate, `answer`, `margin`; metadata names
  anchor, partners, semantics and the predicate's written position
* labels: `<alias>`, `<output>` string, `margins` list<float64> (each label's summed log-probability)
* scores: `<alias>`, `<output>` float64, `margin` float64
* generations: `<alias>`, `tokens` list<int32> (the generated ids, without the stop token), `finish` string
  (`stop`: the model ended it; `length`: the token bound did)
The `kind` metadata key names the shape.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import pyarrow as pa

from quail.logical.expressions import AiPredicate, Semantics
from quail.physical import nodes as ph

KIND = b"kind"


def _with_kind(table: pa.Table, kind: str, extra: Mapping[str, str] | None = None) -> pa.Table:
    metadata = {KIND: kind.encode()}
    for key, value in (extra or {}).items():
        metadata[key.encode()] = value.encode()
    return table.replace_schema_metadata(metadata)


def kind_of(table: pa.Table) -> str:
    metadata = table.schema.metadata or {}
    return metadata.get(KIND, b"").decode()


def metadata_of(table: pa.Table, key: str) -> str:
    return (table.schema.metadata or {}).get(key.encode(), b"").decode()


def sigmoid(margin: float) -> float:
    if margin >= 0:
        return 1.0 / (1.0 + math.exp(-margin))
    e = math.exp(margin)
    return e / (1.0 + e)


def predicate_holds(predicate: AiPredicate, margin: float, offset: float = 0.0) -> bool:
    """A predicate's answer from its TRUE−FALSE margin: margin > 0, or its AI.SCORE threshold on sigmoid(margin).

    `offset` is the margin measured on content-free documents when the plan is calibrated: the
    decision is then taken on margin − offset (the raw margin is what answer tables keep).
    """
    calibrated = margin - offset
    if predicate.threshold is None:
        return calibrated > 0
    return predicate.threshold.holds(sigmoid(calibrated))


def document_ids(alias: str, rows: Sequence[int] | pa.Array) -> pa.Table:
    return _with_kind(pa.table({alias: pa.array(rows, pa.int32())}), "documents")


def filter_answers(alias: str, rows: Sequence[int], predicates: Sequence[int], answers: Sequence[bool],
                   margins: Sequence[float]) -> pa.Table:
    table = pa.table({
        alias: pa.array(rows, pa.int32()),
        "predicate": pa.array(predicates, pa.int32()),
        "answer": pa.array(answers, pa.bool_()),
        "margin": pa.array(margins, pa.float64()),
    })
    return _with_kind(table, "filter_answers", {"alias": alias})


def join_answers(rows: Mapping[str, Sequence[int]], answers: Sequence[bool], margins: Sequence[float], *,
                 anchor: str, partners: Sequence[str], semantics: Semantics, position: int) -> pa.Table:
    columns: dict[str, pa.Array] = {alias: pa.array(values, pa.int32()) for alias, values in rows.items()}
    columns["answer"] = pa.array(answers, pa.bool_())
    columns["margin"] = pa.array(margins, pa.float64())
    return _with_kind(pa.table(columns), "join_answers", {
        "anchor": anchor, "partners": json.dumps(list(partners)), "semantics": semantics, "position": str(position),
    })


def label_answers(alias: str, output: str, rows: Sequence[int], labels: Sequence[str],
                  margins: Sequence[Sequence[float]]) -> pa.Table:
    table = pa.table({
        alias: pa.array(rows, pa.int32()),
        output: pa.array(labels, pa.string()),
        "margins": pa.array(margins, pa.list_(pa.float64())),
    })
    return _with_kind(table, "labels", {"alias": alias, "output": output})


def score_answers(alias: str, output: str, rows: Sequence[int], margins: Sequence[float]) -> pa.Table:
    table = pa.table({
        alias: pa.array(rows, pa.int32()),
        output: pa.array([sigmoid(m) for m in margins], pa.float64()),
        "margin": pa.array(margins, pa.float64()),
    })
    return _with_kind(table, "scores", {"alias": alias, "output": output})


Finish = Literal["stop", "length"]
FINISHES: tuple[Finish, ...] = ("stop", "length")


def generation_answers(alias: str, rows: Sequence[int], tokens: Sequence[Sequence[int]],
                       finish: Sequence[Finish]) -> pa.Table:
    table = pa.table({
        alias: pa.array(rows, pa.int32()),
        "tokens": pa.array([list(t) for t in tokens], pa.list_(pa.int32())),
        "finish": pa.array(list(finish), pa.string()),
    })
    return _with_kind(table, "generations", {"alias": alias})


EMBEDDING = pa.list_(pa.float32())


def embedding_answers(alias: str, rows: Sequence[int], vectors: Sequence[Sequence[float]]) -> pa.Table:
    """Each row's vector (float32, every one as long as the model's dimensions)."""
    matrix = np.asarray(vectors, np.float32).reshape(len(rows), -1) if len(rows) else np.zeros((0, 0), np.float32)
    offsets = pa.array(np.arange(len(rows) + 1, dtype=np.int32) * matrix.shape[1])
    embedding = pa.ListArray.from_arrays(offsets, pa.array(matrix.reshape(-1)))  # one copy, no Python loop
    table = pa.table({alias: pa.array(rows, pa.int32()), "embedding": embedding.cast(EMBEDDING)})
    return _with_kind(table, "embeddings", {"alias": alias})


def empty_answers(node: ph.PhysicalNode) -> pa.Table | None:
    """The answers of a standard model node that has no row to read (None for any other node)."""
    if isinstance(node, ph.AiFilter):
        return filter_answers(node.alias, [], [], [], [])
    if isinstance(node, ph.AiJoin):
        aliases = [c.alias for c in node.predicate.prompt.columns]
        return join_answers({a: [] for a in aliases}, [], [], anchor=node.anchor.alias,
                            partners=[p.alias for p in node.partners], semantics=node.semantics,
                            position=node.predicate.position)
    if isinstance(node, ph.AiClassify):
        return label_answers(node.alias, node.output, [], [], [])
    if isinstance(node, ph.AiScore):
        return score_answers(node.alias, node.output, [], [])
    if isinstance(node, ph.AiGenerate):
        return generation_answers(node.alias, [], [], [])
    if isinstance(node, ph.AiEmbed):
        return embedding_answers(node.alias, [], [])
    return None


def choose_label(margins: Sequence[float]) -> int:
    """The index of the best label; ties go to the earlier label."""
    best = 0
    for index, value in enumerate(margins):
        if value > margins[best]:
            best = index
    return best


def shape_problem(node: ph.PhysicalNode, table: pa.Table) -> str | None:
    """What is wrong with a model node's answer table, or None: the runtime reads these columns blindly."""
    expected = _expected_columns(node)
    if expected is None:
        return None
    kind, columns = expected
    if kind_of(table) != kind:
        return f"expected the {kind!r} shape (schema metadata kind={kind!r}), got kind={kind_of(table)!r}"
    for name, wanted in columns.items():
        if name not in table.column_names:
            return f"expected a {name!r} column of {wanted}, got columns {table.column_names}"
        if table.schema.field(name).type != wanted:
            return f"expected column {name!r} of {wanted}, got {table.schema.field(name).type}"
    return None


def _expected_columns(node: ph.PhysicalNode) -> tuple[str, dict[str, pa.DataType]] | None:
    row = pa.int32()
    if isinstance(node, ph.AiFilter):
        return "filter_answers", {node.alias: row, "predicate": row, "answer": pa.bool_(), "margin": pa.float64()}
    if isinstance(node, ph.AiJoin):
        columns: dict[str, pa.DataType] = {alias: row for alias in node.document_aliases}
        return "join_answers", {**columns, "answer": pa.bool_(), "margin": pa.float64()}
    if isinstance(node, ph.AiClassify):
        return "labels", {node.alias: row, node.output: pa.string(), "margins": pa.list_(pa.float64())}
    if isinstance(node, ph.AiScore):
        return "scores", {node.alias: row, node.output: pa.float64(), "margin": pa.float64()}
    if isinstance(node, ph.AiGenerate):
        return "generations", {node.alias: row, "tokens": pa.list_(pa.int32()), "finish": pa.string()}
    if isinstance(node, ph.AiEmbed):
        return "embeddings", {node.alias: row, "embedding": EMBEDDING}
    return None
