"""What a person reads on a terminal: rows, the report rounded for reading, and progress bars.

The `report` dict keeps full precision for programs; only what is printed here is rounded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TextIO

import pyarrow as pa

from quail.physical.nodes import PhysicalNode
from quail.runtime.report import ReportValue

REPORT_KEYS = ("backend", "model", "device", "wall_s", "boot_s", "boot_kind", "estimated_seconds", "sol_seconds",
               "fresh_tokens", "cached_tokens", "minimum_tokens", "order_rule")
BAR_DESCRIPTION = 48
"""Characters of a node's description a bar shows, cut at a word."""
RATE_AFTER_S = 0.5
"""A rate over less time than this says more about the clock than the work: it is not shown."""


def human(value: ReportValue) -> str:
    """A report value for reading: four significant digits, thousands separated, no float noise."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def format_report(report: dict[str, ReportValue]) -> str:
    lines = [f"  {key}: {human(report[key])}" for key in REPORT_KEYS]
    fresh, minimum = report["fresh_tokens"], report["minimum_tokens"]
    if isinstance(fresh, int) and isinstance(minimum, int) and minimum:
        lines.append(f"  fresh / minimum tokens: {fresh / minimum:.3f}")
    answers = report.get("answers")
    if isinstance(answers, dict) and answers.get("computed") is not None:
        lines.append(f"  answers: {human(answers['stored'])} stored, {human(answers['computed'])} computed, "
                     f"{human(answers['duplicates'])} copied from identical prompts")
    stages = report["stages"]
    if isinstance(stages, list):
        for stage in stages:
            if isinstance(stage, dict):
                lines.append(f"  stage #{stage['position']} ({stage['node']}): evaluated {human(stage['evaluated'])}, "
                             f"observed selectivity {human(stage['observed_selectivity'])}, "
                             f"provided {human(stage['provided_selectivity'])}")
    unparsed = report.get("unparsed")
    if isinstance(unparsed, dict):
        for output, count in unparsed.items():
            if count:
                lines.append(f"  {output}: {human(count)} output(s) did not parse as the schema (NULL fields, a status "
                             "saying why; raise max_tokens if the bound cut them)")
    oversized = report.get("oversized_documents")
    if isinstance(oversized, dict) and oversized.get("documents"):
        lines.append(f"  oversized documents ({oversized['policy']}): {human(oversized['documents'])}")
    return "\n".join(lines)


def format_rows(table: pa.Table, limit: int = 30) -> str:
    rows = table.slice(0, limit).to_pylist()
    if not rows:
        return "(no rows)"
    names = table.column_names
    cells = [[printable(str(row[n]))[:60] for n in names] for row in rows]
    widths = [max(len(printable(n)), *(len(c[i]) for c in cells)) for i, n in enumerate(names)]
    lines = ["  ".join(printable(n).ljust(w) for n, w in zip(names, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(cell, widths, strict=True)) for cell in cells]
    if table.num_rows > limit:
        lines.append(f"... {table.num_rows - limit} more rows")
    return "\n".join(lines)


_CONTROL = {code: f"\\x{code:02x}" for code in [*range(0x20), 0x7F, *range(0x80, 0xA0)]}
_CONTROL.update({ord("\t"): "\\t", ord("\n"): "\\n", ord("\r"): "\\r"})


def printable(text: str) -> str:
    """`text` as a terminal should show a cell of data: control characters (an ANSI escape, a carriage return,
    a bell) written as visible escapes, never sent to the terminal to act on."""
    return text.translate(_CONTROL)


def progress_bar(out: TextIO) -> Callable[[PhysicalNode, int, int], None]:
    """A tqdm bar per model node, fed by the backend's progress reports.

    The rate is shown once the bar has run for `RATE_AFTER_S` (a first report that arrives a few
    microseconds after the bar opened would read as hundreds of thousands of items a second).
    """
    from tqdm import tqdm

    bars: dict[str, tqdm] = {}
    bar_format = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"

    def update(node: PhysicalNode, done: int, total: int) -> None:
        bar = bars.get(node.id)
        if bar is None:
            description = shortened(node.describe(), BAR_DESCRIPTION)
            bar = bars[node.id] = tqdm(total=total, desc=description, file=out, leave=True, bar_format=bar_format)
        bar.total = total
        bar.n = done
        elapsed = bar.format_dict["elapsed"]
        if done and elapsed >= RATE_AFTER_S:
            bar.set_postfix_str(_rate(done / elapsed), refresh=False)
        bar.refresh()
        if done >= total:
            bar.close()

    return update


def shortened(text: str, width: int) -> str:
    """`text` cut at the last space that fits `width` with an ellipsis; a word is never split (hyphens included)."""
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    cut = text.rfind(" ", 0, width - 1)
    return (text[:cut].rstrip(" -—:;,") if cut > 0 else text[: width - 1]) + "…"


def _rate(per_second: float) -> str:
    if per_second >= 1:
        return f"{per_second:,.1f} items/s"
    return f"{1 / per_second:,.1f} s/item"
