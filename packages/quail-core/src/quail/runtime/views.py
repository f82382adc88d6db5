"""Scan views of a query: each alias's rows after its column predicates, computed by DuckDB."""

from __future__ import annotations

from quail.data.database import Database
from quail.data.scan import ScanView, view_sql
from quail.data.sources import quoted
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
            views[node.alias] = database.view(view_sql(source, node.alias, node.columns, node.where, node.ctes))
    return views
