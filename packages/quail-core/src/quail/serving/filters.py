"""An AiFilter through the answer store: each document's stages are first looked up.

A document with a stored FALSE on any stage is out before any model work. Otherwise every stage
without a stored answer is still to compute: documents needing the same stages go to the backend
together as the same node with only those stages — same preamble, frame and question ids, so the
same prompts — and the backend walks them as it always does (stopping at a FALSE). A document's
answers are then every stage it has an answer for, stored or computed, in plan order: the same
set whichever order a plan chose, so a re-planned query reads back exactly what was computed.
"""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa

from quail.backends import shapes
from quail.backends.base import NodeInputs
from quail.cache.keys import Key
from quail.physical import nodes as ph
from quail.serving.node_run import Found, NodeRun, representatives, row_inputs


def answer_filter(node: ph.AiFilter, inputs: NodeInputs, run: NodeRun) -> pa.Table:
    alias, stages = node.alias, node.stages
    documents = inputs.tokens(alias)
    groups = representatives(inputs.rows(alias), documents)
    keys = {row: stage_keys(node, documents[row], run) for row in groups}
    stored = run.lookup([key for row_keys in keys.values() for key in row_keys])
    offsets = run.known_offsets(node)
    found: dict[tuple[int, int], Found] = {}
    needs: dict[tuple[int, ...], list[int]] = {}
    for row, row_keys in keys.items():
        known = [run.decided(s.predicate, stored.get(k), offsets) for s, k in zip(stages, row_keys, strict=True)]
        found.update({(row, k): answer for k, answer in enumerate(known) if answer is not None})
        if any(answer is not None and not answer.answer for answer in known):
            continue  # a stored FALSE: out before any model work
        missing = tuple(k for k, answer in enumerate(known) if answer is None)
        if missing:
            needs.setdefault(missing, []).append(row)
    run.begin(len(groups), len(groups) - sum(len(rows) for rows in needs.values()))
    for missing, rows in needs.items():
        compute_stages(node, missing, rows, documents, keys, inputs, run, found)
    return merged(node, groups, found, run)


def stage_keys(node: ph.AiFilter, document: tuple[int, ...], run: NodeRun) -> list[Key]:
    """The key of every stage's prompt for one document (the shared prefix is hashed once)."""
    prefix = run.keys.prompt("margin", node.prefix(document))
    return [prefix.then(stage.question).key() for stage in node.stages]


def compute_stages(node: ph.AiFilter, missing: tuple[int, ...], rows: list[int],
                   documents: dict[int, tuple[int, ...]], keys: dict[int, list[Key]], inputs: NodeInputs,
                   run: NodeRun, found: dict[tuple[int, int], Found]) -> None:
    """The `missing` stages of `rows` on the backend, in committed chunks of documents."""
    partial = replace(node, stages=tuple(node.stages[k] for k in missing))
    stage_of = {node.stages[k].predicate.position: k for k in missing}
    questions = sum(len(node.stages[k].question) for k in missing)
    ordered = sorted(rows, key=documents.__getitem__) if node.share_prefixes else rows  # neighbours share prefixes
    for chunk in run.chunks(ordered, lambda row: len(node.prefix(documents[row])) + questions):
        table = run.compute(partial, row_inputs(node.alias, chunk, inputs), len(chunk))
        for row, position, answer, margin in zip(*(table.column(c).to_pylist() for c in
                                                   (node.alias, "predicate", "answer", "margin")), strict=True):
            stage = stage_of[position]
            found[(row, stage)] = Found(bool(answer), float(margin), False, row)
            run.keep(keys[row][stage], "margin", (float(margin),))
        run.commit()


def merged(node: ph.AiFilter, groups: dict[int, list[int]], found: dict[tuple[int, int], Found],
           run: NodeRun) -> pa.Table:
    """Every row's answers in plan order, duplicates copying their representative's."""
    entries: list[tuple[int, int, Found]] = []
    for representative, rows in groups.items():
        answered = answered_stages(node, representative, found)
        for row in rows:
            for stage in answered:
                answer = found[(representative, stage)]
                run.count(answer.stored, own=row == answer.origin)
                entries.append((row, stage, answer))
    entries.sort(key=lambda entry: entry[:2])
    return shapes.filter_answers(node.alias, [row for row, _, _ in entries],
                                 [node.stages[stage].predicate.position for _, stage, _ in entries],
                                 [a.answer for _, _, a in entries], [a.margin for _, _, a in entries])


def answered_stages(node: ph.AiFilter, row: int, found: dict[tuple[int, int], Found]) -> list[int]:
    """The stages a document has answers for; a document without a FALSE must have them all."""
    answered = [stage for stage in range(len(node.stages)) if (row, stage) in found]
    if len(answered) < len(node.stages) and all(found[(row, stage)].answer for stage in answered):
        raise RuntimeError(f"{node.kind} {node.id!r}: the backend left row {row} without an answer for "
                           f"{len(node.stages) - len(answered)} stage(s) and without a FALSE that would end it")
    return answered
