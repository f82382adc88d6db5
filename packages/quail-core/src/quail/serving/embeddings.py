"""AiEmbed through the answer store: one vector per distinct document, never computed twice.

An embedding is a function of the embedding model and the document's token ids (the encoder truncates and adds
its special tokens the same way every time), so it is stored keyed by those, its value the vector's floats.
Stored documents are answered at once; the rest go to the backend as the same node over fewer rows; duplicates
copy their representative's vector.
"""

from __future__ import annotations

import pyarrow as pa

from quail.backends import shapes
from quail.backends.base import NodeInputs
from quail.physical import nodes as ph
from quail.serving.node_run import NodeRun, representatives, row_inputs


def answer_embeddings(node: ph.AiEmbed, inputs: NodeInputs, run: NodeRun) -> pa.Table:
    documents = inputs.tokens(node.alias)
    groups = representatives(inputs.rows(node.alias), documents)
    keys = {row: run.keys.embedding(documents[row]) for row in groups}
    stored = run.lookup(list(keys.values()))
    found: dict[int, tuple[tuple[float, ...], bool]] = {
        row: (stored[key], True) for row, key in keys.items()
        if key in stored and len(stored[key]) == node.dimensions}
    pending = [row for row in groups if row not in found]
    run.begin(len(groups), len(groups) - len(pending))
    for chunk in run.chunks(pending, lambda row: node.positions(documents[row])):
        table = run.compute(node, row_inputs(node.alias, chunk, inputs), len(chunk))
        for row, vector in _embedded(node, table):
            found[row] = (vector, False)
            run.keep(keys[row], "embedding", vector)
        run.commit()
    missing = [row for row in groups if row not in found]
    if missing:
        raise RuntimeError(f"backend {run.execution.backend_name!r} embedded nothing for rows {missing[:5]} of "
                           f"{node.id!r}: a backend answers every row it is given")
    entries = sorted((row, representative) for representative, rows in groups.items() for row in rows)
    for row, representative in entries:
        run.count(found[representative][1], own=row == representative)
    return shapes.embedding_answers(node.alias, [row for row, _ in entries],
                                    [found[representative][0] for _, representative in entries])


def _embedded(node: ph.AiEmbed, table: pa.Table) -> list[tuple[int, tuple[float, ...]]]:
    rows = table.column(node.alias).to_pylist()
    vectors = table.column("embedding").to_pylist()
    out = []
    for row, vector in zip(rows, vectors, strict=True):
        if vector is None or len(vector) != node.dimensions:
            raise RuntimeError(f"an embedding of {node.id!r} has {0 if vector is None else len(vector)} numbers: its "
                               f"model's vectors have {node.dimensions}")
        out.append((row, tuple(vector)))
    return out
