"""AiGenerate through the answer store: one greedy generation per distinct document, never paid twice.

Greedy decoding is a function of the prompt's token ids, the token bound and the stop tokens, so a generation is
stored like a judgement: keyed by those, its value how it ended and the ids it wrote. Stored documents are
answered at once; the rest go to the backend as the same node over fewer rows; duplicates copy their
representative's generation. Ids stay ids here: the text is decoded where the query was asked, with the
session's tokenizer (`quail.data.relational.decode_texts`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from quail.backends import shapes
from quail.backends.base import NodeInputs
from quail.cache.store import Readout
from quail.physical import nodes as ph
from quail.serving.node_run import NodeRun, representatives, row_inputs


@dataclass(frozen=True)
class Generation:
    """What one document's generation wrote, how it ended, and whether it came from the store."""

    tokens: tuple[int, ...]
    finish: shapes.Finish
    stored: bool
    origin: int | None = None

    def readout(self) -> Readout:
        return (float(shapes.FINISHES.index(self.finish)), *map(float, self.tokens))

    @classmethod
    def from_readout(cls, readout: Readout) -> Generation | None:
        """A stored generation, or None for a value that is not one (read as a miss)."""
        code, *ids = readout
        if not (0 <= code < len(shapes.FINISHES) and code == int(code)) or any(i != int(i) or i < 0 for i in ids):
            return None
        return cls(tuple(int(i) for i in ids), shapes.FINISHES[int(code)], True)


def answer_generations(node: ph.AiGenerate, inputs: NodeInputs, run: NodeRun) -> pa.Table:
    documents = inputs.tokens(node.alias)
    groups = representatives(inputs.rows(node.alias), documents)
    grammar = node.grammar  # a JSON text written per access: once per node, not per document
    keys = {row: run.keys.generation(node.document_prompt(documents[row]), node.max_tokens, node.stop, grammar)
            for row in groups}
    stored = run.lookup(list(keys.values()))
    found = {row: g for row, key in keys.items() if key in stored
             and (g := Generation.from_readout(stored[key])) is not None}
    pending = [row for row in groups if row not in found]
    run.begin(len(groups), len(groups) - len(pending))
    for chunk in run.chunks(pending, lambda row: len(node.document_prompt(documents[row])) + node.max_tokens):
        table = run.compute(node, row_inputs(node.alias, chunk, inputs), len(chunk))
        for row, generation in _generated(node, table):
            found[row] = generation
            run.keep(keys[row], "generation", generation.readout())
        run.commit()
    missing = [row for row in groups if row not in found]
    if missing:
        raise RuntimeError(f"backend {run.execution.backend_name!r} generated nothing for rows {missing[:5]} of "
                           f"{node.id!r}: a backend answers every row it is given")
    return _merged(node, groups, found, run)


def _generated(node: ph.AiGenerate, table: pa.Table) -> list[tuple[int, Generation]]:
    rows = table.column(node.alias).to_pylist()
    tokens = table.column("tokens").to_pylist()
    finishes = table.column("finish").to_pylist()
    out = []
    for row, ids, finish in zip(rows, tokens, finishes, strict=True):
        if finish not in shapes.FINISHES or len(ids) > node.max_tokens:
            raise RuntimeError(f"a generation of {node.id!r} ended {finish!r} after {len(ids)} tokens: a backend "
                               f"ends one at a stop token ('stop') or at {node.max_tokens} tokens ('length')")
        out.append((row, Generation(tuple(ids), finish, False, row)))
    return out


def _merged(node: ph.AiGenerate, groups: dict[int, list[int]], found: dict[int, Generation],
            run: NodeRun) -> pa.Table:
    """Every row's generation (a duplicate copies its representative's)."""
    entries = sorted((row, found[representative]) for representative, rows in groups.items() for row in rows)
    for row, generation in entries:
        run.count(generation.stored, own=row == generation.origin)
    return shapes.generation_answers(node.alias, [row for row, _ in entries], [g.tokens for _, g in entries],
                                     [g.finish for _, g in entries])

