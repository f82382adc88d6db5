"""What the planner measures of the data before it plans, from explicit inputs.

Per alias: the token length of every document, the whole pages documents share with a neighbour
(prefix sharing), and per column equality the fraction of candidate pairs it keeps. Nothing here
reads a session: the caller hands in each alias's rows (its scan view), token columns and settings.
A NULL document is no document: the lengths the planner prices are those of the documents there are.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from quail.backends.base import OrderRule, PlanningContext, StoredAnswers
from quail.catalog.devices import DeviceSpec
from quail.catalog.models import ModelSpec
from quail.config import EngineConfig, Switch
from quail.data.relational import RowSource
from quail.data.tokenizer import Tokenizer
from quail.data.tokens import TokenColumn
from quail.logical.expressions import Equality
from quail.logical.nodes import AiOutput, LogicalNode, SemanticFilter, SemanticJoin, walk
from quail.planner.oversize import taking_part
from quail.planner.prefixes import shareable_tokens


class TableRows(RowSource, Protocol):
    """An alias's rows as the planner reads them: by position, and whole columns (a scan view)."""

    def to_table(self, columns: list[str]) -> pa.Table: ...


def document_columns(plan: LogicalNode) -> dict[str, str]:
    """alias → the one column its prompts read (the compiler guarantees one per alias)."""
    columns: dict[str, str] = {}
    for node in walk(plan):
        prompts = []
        if isinstance(node, SemanticFilter):
            prompts = [p.prompt for p in node.predicates]
        elif isinstance(node, SemanticJoin):
            prompts = [node.predicate.prompt]
        elif isinstance(node, AiOutput):
            prompts = [node.prompt]
        for prompt in prompts:
            for column in prompt.columns:
                columns[column.alias] = column.column
    return columns


def equality_fractions(plan: LogicalNode, providers: Mapping[str, TableRows]) -> dict[tuple[str, str], float]:
    """The fraction of candidate pairs each equality keeps, from the key columns' value counts."""
    fractions: dict[tuple[str, str], float] = {}
    for equality in (e for node in walk(plan) for e in getattr(node, "equalities", ())):
        fractions[equality.aliases] = fractions.get(equality.aliases, 1.0) * _pair_fraction(equality, providers)
    return fractions


def _pair_fraction(equality: Equality, providers: Mapping[str, TableRows]) -> float:
    counts = []
    for ref in (equality.left, equality.right):
        column = providers[ref.alias].to_table([ref.column]).column(ref.column).combine_chunks()
        counts.append(pc.value_counts(column))
    left = pa.table({"k": counts[0].field("values"), "a": counts[0].field("counts")})
    right = pa.table({"k": counts[1].field("values"), "b": counts[1].field("counts")})
    matched = left.join(right, "k", join_type="inner")
    pairs = pc.sum(pc.multiply(matched.column("a").cast(pa.int64()), matched.column("b").cast(pa.int64()))).as_py()
    total = (pc.sum(counts[0].field("counts")).as_py() or 0) * (pc.sum(counts[1].field("counts")).as_py() or 0)
    return (pairs or 0) / total if total else 0.0


def shared_prefixes(tokens: Mapping[str, TokenColumn], page_tokens: int, switch: Switch) -> dict[str, int]:
    """Per alias, the whole pages its documents share with a neighbour (not measured when sharing is off)."""
    if switch == "off":
        return {}
    return {alias: _shareable(column, page_tokens) for alias, column in tokens.items()}


@lru_cache(maxsize=64)
def _shareable(column: TokenColumn, page_tokens: int) -> int:
    return shareable_tokens([t for t in column.tokens.to_pylist() if t is not None], page_tokens)


def planning_context(plan: LogicalNode, providers: Mapping[str, TableRows], tokens: Mapping[str, TokenColumn],
                     tokenizer: Tokenizer, config: EngineConfig, model: ModelSpec, device: DeviceSpec,
                     order: OrderRule, skipped: Mapping[str, pa.Array],
                     stored: StoredAnswers | None = None) -> PlanningContext:
    """Everything a backend's `plan` may consult, measured from the query's data: the rows its scans
    kept, without those `skipped` (oversized) and without NULL documents; and the answers stored."""
    lengths = {alias: taking_part(tokens[alias], skipped.get(alias)) if alias in tokens else [0] * provider.num_rows
               for alias, provider in providers.items()}
    return PlanningContext(
        model=model, device=device, gpu_count=config.gpus, document_token_lengths=lengths, order_rule=order,
        tokenizer=tokenizer, equality_pair_fractions=equality_fractions(plan, providers),
        chunk_tokens=config.chunk_tokens, kv_budget_bytes=config.kv_budget_bytes,
        kv_page_tokens=config.kv_page_tokens, prefix_sharing=config.prefix_sharing,
        question_first=config.question_first, join_conditions=config.join_conditions,
        document_shared_prefix_tokens=shared_prefixes(tokens, config.kv_page_tokens, config.prefix_sharing),
        calibration=config.calibration, stored_answers=stored,
        null_documents={a: c.null_count for a, c in tokens.items()},
    )
