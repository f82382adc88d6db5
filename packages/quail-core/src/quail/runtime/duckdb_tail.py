"""The root of every plan: the relational tail, one DuckDB statement over the model's rows.

Each alias's scan view is taken at the row positions the model part left (a NULL position — a LEFT
JOIN without a partner — gives a row of NULLs), so the relations line up row by row with the AI
output columns; the statement reads them by POSITIONAL JOIN. Nothing relational is done by hand.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa

from quail.data.database import Database
from quail.data.relational import RowSource
from quail.data.tokenizer import Tokenizer
from quail.frontend.relational import OUTPUTS_RELATION, rows_relation
from quail.physical import nodes as ph


class DuckTail:
    """Runs a plan's root Project on the session's DuckDB."""

    def __init__(self, database: Database, tokenizer: Tokenizer) -> None:
        self.database = database
        self.tokenizer = tokenizer

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def run(self, node: ph.Project, rows: pa.Table, views: Mapping[str, RowSource]) -> pa.Table:
        relations = {rows_relation(i): views[alias].take(rows.column(alias)) for i, alias in enumerate(node.relations)}
        outputs = [name for name in rows.column_names if name not in node.relations]
        if outputs:
            relations[OUTPUTS_RELATION] = rows.select(outputs)
        return self.database.run(node.statement, relations)
