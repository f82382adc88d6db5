"""Scan views of a query: each alias's rows after its column predicates, computed by DuckDB."""

from __future__ import annotations

import warnings

from quail.data.database import Database
from quail.data.scan import ScanView, view_sql
from quail.data.sources import quoted
from quail.errors import LargeInputWarning
from quail.logical.nodes import LogicalNode, Scan, walk


def scan_views(plan: LogicalNode, database: Database) -> dict[str, ScanView]:
    """alias → its view: only the columns the plan reads, only the rows its scan conditions keep.

    Tables whose files changed since they were read are read again first, so every view of one
    query reads the same data.
    """
    database.refresh()
    views = {}
    for node in walk(plan):
        if isinstance(node, Scan):
            source = node.source or quoted(node.table)
            views[node.alias] = database.view(view_sql(source, node.alias, node.columns, node.where, node.ctes,
                                                       node.order))
            _warn_when_large(node, views[node.alias].num_rows)
    return views


LARGE_SCAN_ROWS = 1_000_000
"""Rows of one alias past which the user is told before any token: every one is tokenized and asked."""


def _warn_when_large(node: Scan, rows: int) -> None:
    if rows <= LARGE_SCAN_ROWS:
        return
    what = "a CTE or subquery" if node.source else f"table {node.table!r}"
    warnings.warn(f"{node.alias} ({what}) keeps {rows:,} rows after its conditions: each is tokenized and read by "
                  "the model (explain() shows the estimate; Ctrl-C stops the query)", LargeInputWarning, stacklevel=4)
