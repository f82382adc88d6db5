"""AiClassify and AiScore through the answer store: one readout per distinct document.

A score is the margin of [preamble][document][question] (the key a filter on the same prompt has,
so either one answers the other); a classification is every label's summed log-probability after
[preamble][document][tail], keyed with the label token ids. Stored rows are answered at once; the
rest go to the backend as the same node over fewer rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from quail.backends import shapes
from quail.backends.base import NodeInputs
from quail.cache.keys import Key, ReadoutKind
from quail.cache.store import Readout
from quail.physical import nodes as ph
from quail.serving.node_run import NodeRun, representatives, row_inputs

OutputNode = ph.AiClassify | ph.AiScore


@dataclass(frozen=True)
class _Value:
    """One document's readout, the backend's label when it classified it, and whether it was stored."""

    readout: Readout
    label: str | None
    stored: bool
    origin: int | None = None


def answer_outputs(node: OutputNode, inputs: NodeInputs, run: NodeRun) -> pa.Table:
    documents = inputs.tokens(node.alias)
    groups = representatives(inputs.rows(node.alias), documents)
    keys = {row: _key(node, documents[row], run) for row in groups}
    width = len(node.labels) if isinstance(node, ph.AiClassify) else 1
    stored = run.lookup(list(keys.values()))
    values = {row: _Value(stored[key], None, True) for row, key in keys.items() if len(stored.get(key, ())) == width}
    pending = [row for row in groups if row not in values]
    run.begin(len(groups), len(groups) - len(pending))
    kind: ReadoutKind = "labels" if isinstance(node, ph.AiClassify) else "margin"
    for chunk in run.chunks(pending, lambda row: len(node.document_prompt(documents[row]))):
        table = run.compute(node, row_inputs(node.alias, chunk, inputs), len(chunk))
        for row, readout, label in _answers(node, table):
            values[row] = _Value(readout, label, False, row)
            run.keep(keys[row], kind, readout)
        run.commit()
    return _merged(node, groups, values, run)


def _key(node: OutputNode, document: tuple[int, ...], run: NodeRun) -> Key:
    prompt = node.document_prompt(document)
    return run.keys.labels(prompt, node.label_tokens) if isinstance(node, ph.AiClassify) else run.keys.margin(prompt)


def _answers(node: OutputNode, table: pa.Table) -> list[tuple[int, Readout, str | None]]:
    """(row, readout, the backend's label for a classification) of every row a backend call answered."""
    rows = table.column(node.alias).to_pylist()
    if isinstance(node, ph.AiClassify):
        return [(row, tuple(float(m) for m in margins), str(label)) for row, margins, label in
                zip(rows, table.column("margins").to_pylist(), table.column(node.output).to_pylist(), strict=True)]
    return [(row, (float(margin),), None) for row, margin in zip(rows, table.column("margin").to_pylist(),
                                                                  strict=True)]


def _merged(node: OutputNode, groups: dict[int, list[int]], values: dict[int, _Value], run: NodeRun) -> pa.Table:
    """Every row's readout (a duplicate copies its representative's); stored labels are chosen again here."""
    entries = sorted((row, values[representative]) for representative, rows in groups.items() for row in rows)
    for row, value in entries:
        run.count(value.stored, own=row == value.origin)
    rows = [row for row, _ in entries]
    if isinstance(node, ph.AiScore):
        return shapes.score_answers(node.alias, node.output, rows, [value.readout[0] for _, value in entries])
    names = [label.name for label in node.labels]
    labels = [value.label or names[shapes.choose_label(value.readout)] for _, value in entries]
    return shapes.label_answers(node.alias, node.output, rows, labels, [list(value.readout) for _, value in entries])
