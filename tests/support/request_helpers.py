"""What the request backends' fake-engine tests share, whichever engine the fake speaks for.

A spaced-byte tokenizer (so " TRUE" and " FALSE" differ at their first token), a session on a
request backend beside the keyword backend, and `teach`: the table of exact prompt ids → the
keyword rule's margin that a fake engine answers from, so a prompt laid out wrongly is a KeyError
in the fake, not a silently different answer. Nothing here imports an engine.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from support.cases import CASES, KEPT_ENGINES, Case, assert_matches_oracle, result_rows
from support.e2e_data import TABLES, arrow_table

import quail
from quail.backends.base import ModelBackend
from quail.physical import nodes as ph
from quail.prompts import answer_tokens
from quail.testing import BASE_MODEL, ByteTokenizer, KeywordBackend
from quail.testing.rules import predicate_margin

Margins = dict[tuple[int, ...], float]


class SpacedByteTokenizer(ByteTokenizer):
    """Bytes, except a space and the byte after it are one token, so " TRUE" and " FALSE" differ at once."""

    identity = "quail-spaced-bytes-v1"
    SPACED = 300

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        data = text.encode("utf-8")
        index = 0
        while index < len(data):
            if data[index] == 0x20 and index + 1 < len(data) and data[index + 1] != 0x20:
                out.append(self.SPACED + data[index + 1])
                index += 2
            else:
                out.append(data[index] + 3)
                index += 1
        return out

    def decode(self, ids: Sequence[int]) -> str:
        raw = bytearray()
        for i in ids:
            raw += bytes([0x20, i - self.SPACED]) if i >= self.SPACED else bytes([i - 3])
        return raw.decode("utf-8", errors="replace")


TOKENIZER = SpacedByteTokenizer()
LABELS = answer_tokens(TOKENIZER)
VOCAB = SpacedByteTokenizer.SPACED + 256


def request_session(backend: ModelBackend, use: str | None = None, calibration: str = "off") -> quail.Session:
    """A session on `backend` (or, by name, on the keyword backend with the same tokenizer and tables).

    Calibration is off unless asked for: the keyword rule compared against has no bias to remove.
    """
    registry = quail.ExtensionRegistry.with_built_ins()
    registry.register_backend(backend)
    registry.register_backend(KeywordBackend(TOKENIZER))
    session = quail.Session(quail.EngineConfig(model=BASE_MODEL, backend=use or backend.name, calibration=calibration,
                                               engines_per_device=KEPT_ENGINES),
                            registry=registry, tokenizer=TOKENIZER)
    for table, (_, id_column) in TABLES.items():
        session.register(table, quail.DocumentProvider.from_table(arrow_table(table), id_column))
    return session


def column_texts(alias_tables: dict[str, str], column: ph.ColumnRef) -> list[str]:
    columns, _ = TABLES[alias_tables[column.alias]]
    return [str(v) for v in columns[column.column]]


def teach(margins: Margins, query: quail.Query) -> list[ph.PhysicalNode]:
    """Fill a fake's table: every prompt the plan could send, with the keyword rule's margin; the model nodes."""
    graph = query.plan().graph
    tables = {n.alias: n.table for n in graph.nodes if isinstance(n, ph.Scan)}
    model_nodes = [n for n in graph.nodes if n.is_model_node]
    for node in model_nodes:
        if isinstance(node, ph.AiFilter):
            _teach_filter(margins, node, tables)
        elif isinstance(node, ph.AiScore):
            _teach_score(margins, node, tables)
        elif isinstance(node, ph.AiJoin):
            _teach_join(margins, node, tables)
    return model_nodes


def _teach_filter(margins: Margins, node: ph.AiFilter, tables: dict[str, str]) -> None:
    documents = [(text, tuple(TOKENIZER.encode(text))) for text in column_texts(tables, node.column)]
    documents += [(TOKENIZER.decode(d), d) for d in node.calibration]
    for text, document in documents:
        for k, stage in enumerate(node.stages):
            margins[node.prompt(document, k)] = predicate_margin(stage.predicate.prompt.template, [text])


def _teach_score(margins: Margins, node: ph.AiScore, tables: dict[str, str]) -> None:
    for text in column_texts(tables, node.column):
        margins[node.document_prompt(tuple(TOKENIZER.encode(text)))] = predicate_margin(node.prompt.template, [text])


def _teach_join(margins: Margins, node: ph.AiJoin, tables: dict[str, str]) -> None:
    columns = node.predicate.prompt.columns
    template = node.predicate.prompt.template
    for texts in itertools.product(*(column_texts(tables, c) for c in columns)):
        by_alias = dict(zip((c.alias for c in columns), texts, strict=True))
        ids = node.prompt(tuple(TOKENIZER.encode(by_alias[node.anchor.alias])),
                          [tuple(TOKENIZER.encode(by_alias[p.alias])) for p in node.partners])
        margins[ids] = predicate_margin(template, list(texts))
    for document in node.calibration:
        ids = node.prompt(document, [document] * len(node.partners))
        margins[ids] = predicate_margin(template, [TOKENIZER.decode(document)] * len(columns))


def classifies(case: Case) -> bool:
    return bool(case.oracle.classifies)


def join_case() -> Case:
    return next(c for c in CASES if c.id == "join_with_filters_on_both_sides")


def assert_keyword_rows(query: quail.Query, case: Case, keyword: quail.Session) -> None:
    """The query's rows match the oracle and, without a LIMIT, the keyword backend's rows exactly."""
    got = query.run().collect()
    assert_matches_oracle(got, case.oracle)
    if case.oracle.limit is None:
        expected = case.query(keyword).run().collect()
        assert got.column_names == expected.column_names
        assert sorted(result_rows(got, got.column_names)) == sorted(result_rows(expected, expected.column_names))
