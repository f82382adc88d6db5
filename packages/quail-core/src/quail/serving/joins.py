"""An AiJoin through the answer store: candidate tuples keyed by their whole prompt.

Stored tuples are answered at once; an exists / anti anchor with a stored TRUE needs nothing more.
The rest go to the backend as the same node restricted (through its `candidates` port) to one
tuple per distinct prompt, chunked by anchor so each anchor's prefix is still computed once per
call. Exists / anti anchors stop at their first TRUE, which may leave a copied tuple of another
anchor unasked: such anchors go round again with what they still lack until every anchor is
decided. The merged answers list every candidate tuple that has an answer, stored or computed,
per anchor in candidate order — the same set whichever order the backend asked them in.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from quail.backends import shapes
from quail.backends.base import NodeInputs
from quail.cache.keys import Key
from quail.data.relational import candidate_tuples
from quail.physical import nodes as ph
from quail.serving.node_run import Found, NodeRun

Tuple = tuple[int, ...]


class _JoinItems:
    """The node's candidate tuples (in its prompt's alias order), their keys, grouped by anchor row."""

    def __init__(self, node: ph.AiJoin, inputs: NodeInputs, run: NodeRun) -> None:
        self.node = node
        self.aliases = [c.alias for c in node.predicate.prompt.columns]
        self.texts = {alias: inputs.tokens(alias) for alias in self.aliases}
        self.anchor_at = self.aliases.index(node.anchor.alias)
        self.partner_at = [self.aliases.index(p.alias) for p in node.partners]
        self.by_anchor: dict[int, list[Tuple]] = {}
        for item in candidate_tuples(inputs.ports, self.aliases):
            self.by_anchor.setdefault(item[self.anchor_at], []).append(item)
        self.keys: dict[Tuple, Key] = {}
        for anchor, items in self.by_anchor.items():
            prefix = run.keys.prompt("margin", node.anchor_prefix(self.anchor_text(anchor)))  # hashed once per anchor
            for item in items:
                self.keys[item] = prefix.then(self.suffix(item)).key()
        self.owner: dict[Tuple, Tuple] = {item: item for item in self.keys}
        """The tuple whose own prompt is asked for an item: itself, or for a symmetric pair asked in both orders,
        the order whose prompt key is the smaller."""
        if node.predicate.prompt.symmetric and len(self.aliases) == 2:
            self._share_reversed_pairs(run)

    def _share_reversed_pairs(self, run: NodeRun) -> None:
        """A pair whose reversed prompt is another candidate's prompt is answered once, by the smaller key's
        tuple; a pair asked in one order only keeps its own prompt (its answer is never stored as another's)."""
        own = {key: item for item, key in reversed(self.keys.items())}  # the first tuple asking each prompt
        partner_at = self.partner_at[0]
        for item, key in list(self.keys.items()):
            swapped = run.keys.prompt("margin", self.node.anchor_prefix(self.texts[self.aliases[partner_at]][
                item[partner_at]])).then(self.node.suffix([self.anchor_text(item[self.anchor_at])])).key()
            if swapped in own and swapped < key:
                self.keys[item], self.owner[item] = swapped, own[swapped]

    def anchor_text(self, row: int) -> tuple[int, ...]:
        return self.texts[self.aliases[self.anchor_at]][row]

    def suffix(self, item: Tuple) -> tuple[int, ...]:
        return self.node.suffix([self.texts[self.aliases[i]][item[i]] for i in self.partner_at])

    def cost(self, anchor_items: tuple[int, list[Tuple]]) -> int:
        anchor, items = anchor_items
        return len(self.node.anchor_prefix(self.anchor_text(anchor))) + sum(len(self.suffix(i)) for i in items)

    def inputs(self, items: list[Tuple], inputs: NodeInputs) -> NodeInputs:
        """The node's inputs with `candidates` listing exactly `items` (and only their documents attached)."""
        columns = {alias: pa.array([item[i] for item in items], pa.int32()) for i, alias in enumerate(self.aliases)}
        documents = {}
        for alias, rows in columns.items():
            table = inputs.documents[alias]
            documents[alias] = table.filter(pc.is_in(table.column(alias), value_set=pc.unique(rows)))
        ports = {port: inputs.ports[port] for port in ("left", "right")}
        return NodeInputs({**ports, "candidates": pa.table(columns)}, documents)


def answer_join(node: ph.AiJoin, inputs: NodeInputs, run: NodeRun) -> pa.Table:
    items = _JoinItems(node, inputs, run)
    early = node.semantics != "full"
    offsets = run.known_offsets(node)
    stored = run.lookup(list(items.keys.values()))
    answered: dict[Key, Found] = {}
    for key in set(items.keys.values()):
        decided = run.decided(node.predicate, stored.get(key), offsets)
        if decided is not None:
            answered[key] = decided
    run.begin(len(items.keys), 0)
    while asked := _unanswered(items, answered, early):
        before = len(answered)
        for chunk in run.chunks(list(asked.items()), items.cost):
            flat = [item for _, group in chunk for item in group]
            table = run.compute(node, items.inputs(flat, inputs), len(flat))
            for row in zip(*(table.column(c).to_pylist() for c in (*items.aliases, "answer", "margin")), strict=True):
                item, answer, margin = tuple(row[:-2]), bool(row[-2]), float(row[-1])
                answered[items.keys[item]] = Found(answer, margin, False, item)
                run.keep(items.keys[item], "margin", (margin,))
            run.commit()
        if len(answered) == before:
            raise RuntimeError(f"the backend answered none of the {sum(map(len, asked.values()))} tuples of "
                               f"{node.kind} {node.id!r} it was asked for")
    return _merged(items, answered, run)


def _unanswered(items: _JoinItems, answered: dict[Key, Found], early: bool) -> dict[int, list[Tuple]]:
    """Per undecided anchor, one tuple per distinct prompt not yet answered (first asker of a prompt asks it)."""
    asked: dict[int, list[Tuple]] = {}
    seen: set[Key] = set()
    for group in items.by_anchor.values():
        if early and any(answered[k].answer for k in (items.keys[i] for i in group) if k in answered):
            continue
        for item in group:
            key = items.keys[item]
            if key not in answered and key not in seen:
                seen.add(key)
                owner = items.owner[item]  # a symmetric pair's other order may belong to another anchor
                asked.setdefault(owner[items.anchor_at], []).append(owner)
    return asked


def _merged(items: _JoinItems, answered: dict[Key, Found], run: NodeRun) -> pa.Table:
    rows: dict[str, list[int]] = {alias: [] for alias in items.aliases}
    answers: list[bool] = []
    margins: list[float] = []
    for anchor in sorted(items.by_anchor):
        for item in items.by_anchor[anchor]:
            found = answered.get(items.keys[item])
            if found is None:
                continue
            run.count(found.stored, own=found.origin == item)
            for alias, row in zip(items.aliases, item, strict=True):
                rows[alias].append(row)
            answers.append(found.answer)
            margins.append(found.margin)
    node = items.node
    return shapes.join_answers(rows, answers, margins, anchor=node.anchor.alias,
                               partners=[p.alias for p in node.partners], semantics=node.semantics,
                               position=node.predicate.position)
