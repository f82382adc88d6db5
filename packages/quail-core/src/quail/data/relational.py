"""Relational operators over row-position tables, with pyarrow / Acero: what the model part of a plan
needs between its model nodes (the relational tail runs on DuckDB). No backend code here."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from quail.data.providers import Columns, Rows
from quail.data.tokens import TokenColumn
from quail.logical.expressions import Equality, PairCondition, Semantics
from quail.schemas import SchemaType, answer_type, parse_answer

ROW = pa.int32()


class RowSource(Protocol):
    """What generic nodes read of an alias: its row count and columns by row position.

    The alias's scan view at the caller; the `TableInput` sent as data on the far side.
    """

    @property
    def num_rows(self) -> int: ...

    def take(self, rows: Rows, columns: Columns = None) -> pa.Table: ...


def scan_rows(alias: str, count: int, left_out: pa.Array | None = None) -> pa.Table:
    """Every row of the alias, but those `left_out` (skipped oversized documents)."""
    rows = pa.array(range(count), ROW)
    if left_out is not None and len(left_out):
        rows = rows.filter(pc.invert(pc.is_in(rows, value_set=left_out.cast(ROW))))
    return pa.table({alias: rows})


def aliases_of(rows: pa.Table, known: Sequence[str]) -> list[str]:
    return [name for name in rows.column_names if name in known]


def _ordered(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Deterministic order: Acero joins do not preserve it (NULL rows of a LEFT join last)."""
    if not keys or not table.num_rows:
        return table
    order = pc.sort_indices(table.select(list(keys)), sort_keys=[(k, "ascending") for k in keys])
    return table.take(order)  # sorted on the keys alone: a list column (a generation's ids) cannot be a sort key


def survivors(rows: pa.Table, answers: pa.Table, alias: str) -> pa.Table:
    """Rows whose every filter answer is TRUE (a document answers FALSE once, then stops)."""
    verdict = answers.group_by(alias).aggregate([("answer", "min")])
    passing = verdict.filter(pc.field("answer_min")).select([alias])
    return _ordered(rows.join(passing, alias, join_type="inner"), [alias])


def equality_pairs(left: pa.Table, right: pa.Table, equalities: Sequence[Equality],
                   providers: Mapping[str, RowSource], conditions: Sequence[PairCondition] = ()) -> pa.Table:
    """Left ⋈ right on column values (fetched by position); a cross product without equalities. With
    `conditions`, DuckDB enumerates the pairs (its range joins, not a cross product filtered in Python)."""
    order = [*left.column_names, *right.column_names]
    if conditions:
        return _ordered(_condition_pairs(left, right, equalities, conditions, providers), order)
    if not equalities:
        return _ordered(_cross(left, right), order)
    left_keys, right_keys = [], []
    left_values, right_values = left, right
    for index, equality in enumerate(equalities):
        left_ref, right_ref = (equality.left, equality.right) if equality.left.alias in left.column_names else (
            equality.right, equality.left)
        key_left, key_right = f"__key_l{index}", f"__key_r{index}"
        left_values = left_values.append_column(key_left, _values(left, left_ref.alias, left_ref.column, providers))
        right_values = right_values.append_column(key_right,
                                                  _values(right, right_ref.alias, right_ref.column, providers))
        left_keys.append(key_left)
        right_keys.append(key_right)
    joined = left_values.join(right_values, left_keys, right_keys, join_type="inner")
    return _ordered(joined.select(order), order)


def _condition_pairs(left: pa.Table, right: pa.Table, equalities: Sequence[Equality],
                     conditions: Sequence[PairCondition], providers: Mapping[str, RowSource]) -> pa.Table:
    """The pairs satisfying every equality and condition, by one DuckDB join over the two sides' row positions and
    the column values the conditions read (named `"alias.column"`, as the conditions' SQL names them). DuckDB
    runs in memory with external access off: a condition reads only these two tables."""
    import duckdb

    wanted = {*(c for condition in conditions for c in condition.columns),
              *(ref for equality in equalities for ref in (equality.left, equality.right))}
    sides = {"__l": left, "__r": right}
    for name, rows in sides.items():
        for ref in sorted(wanted, key=str):
            if ref.alias in rows.column_names:
                rows = rows.append_column(f"{ref.alias}.{ref.column}", _values(rows, ref.alias, ref.column, providers))
        sides[name] = rows
    on = [f'"{e.left.alias}.{e.left.column}" = "{e.right.alias}.{e.right.column}"' for e in equalities]
    on += [f"({condition.sql})" for condition in conditions]
    picked = ", ".join(f'__l."{c}"' for c in left.column_names) + ", " + ", ".join(
        f'__r."{c}"' for c in right.column_names)
    connection = duckdb.connect(config={"enable_external_access": False})
    try:
        connection.register("__l", sides["__l"])
        connection.register("__r", sides["__r"])
        table = connection.sql(f"SELECT {picked} FROM __l JOIN __r ON {' AND '.join(on)}").to_arrow_table()
    finally:
        connection.close()
    return pa.table({name: table.column(i).cast(pa.int32()) for i, name in enumerate([*left.column_names,
                                                                                      *right.column_names])})


def _values(rows: pa.Table, alias: str, column: str, providers: Mapping[str, RowSource]) -> pa.Array:
    return providers[alias].take(rows.column(alias).combine_chunks(), [column]).column(column).combine_chunks()


def _cross(left: pa.Table, right: pa.Table) -> pa.Table:
    key = "__cross"
    joined = left.append_column(key, pa.array([0] * left.num_rows, pa.int8())).join(
        right.append_column(key, pa.array([0] * right.num_rows, pa.int8())), key, join_type="inner")
    return joined.select([*left.column_names, *right.column_names])


def candidate_tuples(ports: Mapping[str, pa.Table], aliases: Sequence[str]) -> list[tuple[int, ...]]:
    """The tuples a join evaluates, in `aliases` order: its `candidates` input, else every left × right pair."""
    table = ports.get("candidates")
    if table is None:
        left = _distinct(ports["left"].select([a for a in aliases if a in ports["left"].column_names]))
        right = _distinct(ports["right"].select([a for a in aliases if a in ports["right"].column_names]))
        table = _cross(left, right)
    return sorted({tuple(row[a] for a in aliases) for row in table.select(list(aliases)).to_pylist()})


def _distinct(table: pa.Table) -> pa.Table:
    return table.group_by(table.column_names).aggregate([]) if table.num_columns else table


def recombine_join(left: pa.Table, right: pa.Table, answers: pa.Table, semantics: Semantics,
                   candidates: pa.Table | None = None) -> pa.Table:
    """Full: left ⋈ TRUE answers ⋈ right. Exists / anti: left rows with / without a TRUE answer.
    Left: the full join, and every left row without a TRUE answer once, its right side NULL.

    With `candidates` (the left ⋈ right rows that satisfy the join's column equalities) the answers are
    joined through those rows: an equality may read an alias the predicate does not, and the answers,
    keyed by the predicate's aliases alone, cannot say which left rows a TRUE tuple belongs to."""
    answer_aliases = [c for c in answers.column_names if c not in ("answer", "margin")]
    true = _distinct(answers.filter(pc.field("answer")).select(answer_aliases))
    left_keys = [a for a in answer_aliases if a in left.column_names]
    order = [*left.column_names, *[c for c in right.column_names if c not in left.column_names]]
    if candidates is None and semantics in ("exists", "anti"):
        matched = true.select(left_keys).group_by(left_keys).aggregate([])
        join_type = "left semi" if semantics == "exists" else "left anti"
        return _ordered(left.join(matched, left_keys, join_type=join_type), left_keys)
    if candidates is None:
        joined = _through_answers(left, right, true, answer_aliases)
    else:
        joined = candidates.select(order).join(true, answer_aliases, join_type="left semi") if (
            candidates.num_rows and true.num_rows) else candidates.select(order).slice(0, 0)
    if semantics in ("exists", "anti"):
        return _ordered(_rows_matched(left, joined, semantics == "exists"), _row_columns(left))
    if semantics == "left":
        alone = _rows_matched(left, joined, False)
        nulls = {c: pa.nulls(alone.num_rows, right.schema.field(c).type) for c in order if c not in left.column_names}
        joined = pa.concat_tables([joined, pa.table({**{c: alone.column(c) for c in left.column_names}, **nulls})])
    return _ordered(joined, [c for c in order if joined.schema.field(c).type == ROW])


def _through_answers(left: pa.Table, right: pa.Table, true: pa.Table, answer_aliases: Sequence[str]) -> pa.Table:
    """Every left × right row whose tuple of the predicate's aliases has a TRUE answer."""
    left_keys = [a for a in answer_aliases if a in left.column_names]
    through = left.join(true, left_keys, join_type="inner")
    right_keys = [a for a in answer_aliases if a in right.column_names]
    extra = [c for c in right.column_names if c not in through.column_names or c in right_keys]
    joined = through.join(right.select(extra), right_keys, join_type="inner")
    return joined.select([*left.column_names, *[c for c in right.column_names if c not in left.column_names]])


def _row_columns(table: pa.Table) -> list[str]:
    """The columns that name a row: one row id per alias (AI outputs beside them follow from those)."""
    return [c for c in table.column_names if table.schema.field(c).type == ROW]


def _rows_matched(left: pa.Table, joined: pa.Table, keep: bool) -> pa.Table:
    """The left rows that appear in `joined` (keep) or that do not; a NULL row id (a LEFT JOIN's missing
    side) matches a NULL, which Acero's joins never do, so the ids are compared with NULL as -1."""
    columns = _row_columns(left)
    keys = [f"__row_{i}" for i in range(len(columns))]

    def keyed(table: pa.Table) -> pa.Table:
        return pa.table({k: pc.fill_null(table.column(c), -1) for k, c in zip(keys, columns, strict=True)})

    matched = _distinct(keyed(joined)) if joined.num_rows else keyed(joined).slice(0, 0)
    marked = keyed(left).append_column("__position", pa.array(range(left.num_rows), pa.int64()))
    join_type = "left semi" if keep else "left anti"
    positions = marked.join(matched, keys, join_type=join_type).column("__position").combine_chunks()
    return left.take(pc.take(positions, pc.sort_indices(positions)))


def add_labels(rows: pa.Table, answers: pa.Table, alias: str, output: str,
               allowed: Sequence[str] | None) -> pa.Table:
    """The label of each row's document (NULL for a row the model did not answer: a NULL document)."""
    joined = _add_column(rows, answers.select([alias, output]), alias, output)
    if allowed is not None:
        joined = joined.filter(pc.is_in(joined.column(output), pa.array(list(allowed), pa.string())))
    return joined


def add_scores(rows: pa.Table, answers: pa.Table, alias: str, output: str) -> pa.Table:
    """The score of each row's document (NULL for a row the model did not answer: a NULL document)."""
    return _add_column(rows, answers.select([alias, output]), alias, output)


def add_verdicts(rows: pa.Table, answers: pa.Table, alias: str, output: str) -> pa.Table:
    """A one-stage filter's TRUE / FALSE per row as a column (NULL for a row the model did not answer)."""
    verdicts = answers.select([alias, "answer"]).rename_columns([alias, output])
    return _add_column(rows, verdicts, alias, output)


def _add_column(rows: pa.Table, values: pa.Table, alias: str, output: str) -> pa.Table:
    """`rows` with `values[output]` by the alias's row (one value per row; NULL where there is none), every row
    kept. Taken by position, not joined: Acero joins carry no list column, and a generation's is one."""
    at = {row: index for index, row in enumerate(values.column(alias).to_pylist())}
    indices = pa.array([at.get(row) for row in rows.column(alias).to_pylist()], pa.int64())
    added = rows.append_column(output, values.column(output).take(indices))
    sortable = [f.name for f in rows.schema if not pa.types.is_nested(f.type)]  # a generation's ids are no key
    return _ordered(added, sortable)


def add_generations(rows: pa.Table, answers: pa.Table, alias: str, output: str) -> pa.Table:
    """The generated token ids of each row's document as column `output` (NULL for a row the model did not
    answer); `decode_texts` makes them text where the query was asked."""
    return _add_column(rows, answers.select([alias, "tokens"]).rename_columns([alias, output]), alias, output)


def add_embeddings(rows: pa.Table, answers: pa.Table, alias: str, output: str) -> pa.Table:
    """Each row's vector as column `output` (NULL for a row the model did not answer)."""
    return _add_column(rows, answers.select([alias, "embedding"]).rename_columns([alias, output]), alias, output)


def decode_texts(rows: pa.Table, outputs: Mapping[str, SchemaType | None],
                 decode: Callable[[Sequence[int]], str]) -> pa.Table:
    """`rows` with each generation column's token ids decoded to text (the whitespace around it dropped: the answer
    cue leaves a generation starting with a space or a line break), each distinct generation once; a structured
    one read into its schema's fields, with a status saying why where it does not parse."""
    for name, schema in outputs.items():
        if name not in rows.column_names:
            continue
        lists = rows.column(name).to_pylist()
        found: dict[tuple[int, ...], object] = {}
        values = [None if ids is None else found.setdefault(tuple(ids), _read(decode(ids).strip(), schema))
                  for ids in lists]
        kind = pa.string() if schema is None else answer_type(schema)
        rows = rows.set_column(rows.column_names.index(name), name, pa.array(values, kind))
    return rows


def _read(text: str, schema: SchemaType | None) -> object:
    return text if schema is None else parse_answer(text, schema)


def with_documents(tokens: Mapping[str, TokenColumn], aliases: Sequence[str]) -> dict[str, pa.Array]:
    """Per alias: the rows that hold a document (their text is not NULL)."""
    return {a: pc.indices_nonzero(tokens[a].present()).cast(ROW) for a in aliases if a in tokens}


def present_documents(rows: pa.Table, present: Mapping[str, pa.Array], distinct: bool = False) -> pa.Table:
    """The rows whose position is not NULL and holds a document (in `present`) for each alias named there —
    the rows an AI function can read; with `distinct`, each row of the one alias once."""
    keep = pa.array([True] * rows.num_rows, pa.bool_())
    for alias, documents in present.items():
        if alias in rows.column_names:
            keep = pc.and_(keep, pc.fill_null(pc.is_in(rows.column(alias), value_set=documents), False))
    kept = rows.filter(keep)
    if not distinct:
        return kept
    (alias,) = present
    return _ordered(kept.select([alias]).group_by(alias).aggregate([]), [alias])
