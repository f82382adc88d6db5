"""explain(): the logical plan, the physical plan with estimates per node, the planner's decisions
in words, and — after a run — the measurements beside the estimates."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from quail.backends.base import PhysicalCandidate
from quail.compute.request import NodeMetrics, ShardMetrics
from quail.logical.nodes import LogicalNode, render
from quail.physical.graph import PhysicalGraph
from quail.physical.nodes import NodeEstimate, PhysicalNode


def _number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "?"
    if unit == "s":
        return f"{value:.3g} s"
    return f"{value:,.0f}" if value >= 10 else f"{value:.3g}"


def _estimate(estimate: NodeEstimate) -> str:
    parts = []
    if estimate.rows is not None:
        parts.append(f"rows≈{_number(estimate.rows)}")
    if estimate.tokens is not None:
        parts.append(f"tokens≈{_number(estimate.tokens)}")
    if estimate.seconds is not None:
        parts.append(f"est {_number(estimate.seconds, 's')}")
    return ", ".join(parts)


def _measured(metrics: NodeMetrics | None) -> str:
    if metrics is None:
        return ""
    parts = [f"wall {metrics.wall_s:.3g} s"]
    if metrics.rows_out is not None:
        parts.append(f"rows {metrics.rows_out:,}")
    if metrics.fresh_tokens is not None:
        parts.append(f"fresh tokens {metrics.fresh_tokens:,}")
    if metrics.chunks is not None:
        parts.append(f"chunks {metrics.chunks}")
    if metrics.kv_evictions:
        parts.append(f"KV evictions {metrics.kv_evictions:,} ({metrics.recomputed_tokens or 0:,} tokens recomputed)")
    if metrics.computed_answers is not None:
        stored = "" if metrics.stored_answers is None else f"{metrics.stored_answers:,} stored, "
        parts.append(f"answers {stored}{metrics.computed_answers:,} computed, "
                     f"{metrics.duplicate_answers or 0:,} copied from identical prompts")
    for position, offset in metrics.calibration_offsets or ():
        parts.append(f"#{position} TRUE above margin {offset:+.3f}")
    return "measured: " + ", ".join(parts)


def render_physical(graph: PhysicalGraph, measured: Mapping[str, NodeMetrics] | None = None) -> str:
    lines: list[str] = []
    shown: set[str] = set()

    def visit(node: PhysicalNode, depth: int, via: str) -> None:
        label = f"{'  ' * depth}{via}{node.describe()} [{node.id}]"
        if node.id in shown:
            lines.append(f"{label} (shown above)")
            return
        shown.add(node.id)
        notes = [n for n in (_estimate(node.estimate), _measured((measured or {}).get(node.id))) if n]
        lines.append(label + (f"  — {'; '.join(notes)}" if notes else ""))
        for port, edge in sorted(graph.inputs_of(node.id).items()):
            visit(graph.node(edge.source), depth + 1, f"{port}: ")

    visit(graph.node(graph.root), 0, "")
    return "\n".join(lines)


def render_shards(shards: Sequence[ShardMetrics]) -> list[str]:
    """One line per shard a provider ran: its documents, its worker, what it took; first, when a LIMIT stopped
    the model early, how many of the documents it read."""
    lines = []
    stopped = [shard for shard in shards if shard.cancelled]
    if stopped:
        phase = max(shard.phase for shard in stopped)
        last = [shard for shard in shards if shard.phase == phase]
        read = sum(shard.documents for shard in last if not shard.cancelled)
        lines.append(f"stopped after {read:,} of {sum(shard.documents for shard in last):,} documents of "
                     f"{last[0].alias}: the LIMIT had its rows")
    for shard in shards:
        split = f"split on {shard.alias}" if shard.alias is not None else "unsplit"
        took = "cancelled: the LIMIT had its rows" if shard.cancelled else f"wall {_number(shard.wall_s, 's')}"
        boot = f", {shard.boot_kind} boot" if shard.boot_kind is not None else ""
        retries = f", re-run {shard.retries}× after a worker was lost" if shard.retries else ""
        lines.append(f"phase {shard.phase} shard {shard.shard} ({split}) on {shard.worker}: {shard.documents:,} "
                     f"documents, {shard.tokens:,} tokens; {took}{boot}{retries}")
    return lines


def explain_text(logical: LogicalNode, candidate: PhysicalCandidate | None, order_rule: str, rules: str, model: str,
                 refusal: str | None = None, measured: Mapping[str, NodeMetrics] | None = None,
                 engine: tuple[str, ...] = (), sharding: Sequence[str] = ()) -> str:
    optimized = "optimized, " if candidate is not None else ""
    sections = [f"== Logical plan ({optimized}rules: {rules}) ==", render(logical)]
    if candidate is None:
        sections += ["== Physical plan ==", f"not planned: {refusal}"]
        return "\n".join(sections)
    sol = "?" if candidate.sol_seconds is None else f"{candidate.sol_seconds:.3g} s"
    sections += [
        f"== Physical plan (backend {candidate.backend}, model {model}; order rule {order_rule}; "
        f"estimated {candidate.estimated_seconds:.3g} s; speed of light {sol}) ==",
        render_physical(candidate.graph, measured),
        "== Planner decisions ==",
        *(f"- {remark}" for remark in candidate.remarks),
    ]
    if engine:
        sections += ["== Engine ==", *(f"- {note}" for note in engine)]
    if sharding:
        sections += ["== Shards over workers ==", *sharding]
    return "\n".join(sections)
