"""What people read: the report rounded (the dict keeps full precision), calm progress bars, helpful --help."""

from __future__ import annotations

import io

import pytest

from quail.cli import main
from quail.presentation import format_report, human, progress_bar, shortened


class Node:
    id = "n1"

    def describe(self) -> str:
        return "AiFilter r: #0 AI_FILTER(PROMPT('Is {0} positive?', r.body)) with content-free calibration"


REPORT = {"backend": "keyword", "model": "gemma-3-270m", "device": "cpu", "wall_s": 13.89659764399994,
          "boot_s": None, "boot_kind": "cold", "estimated_seconds": 0.3333333333333333, "sol_seconds": 1234567.891,
          "fresh_tokens": 196608, "cached_tokens": 0, "minimum_tokens": 196608, "order_rule": "by_cost",
          "stages": [{"position": 0, "node": "filter_r", "evaluated": 3, "observed_selectivity": 0.3333333333333333,
                      "provided_selectivity": None}]}


def test_printed_report_values_are_rounded_for_reading():
    text = format_report(REPORT)
    assert "wall_s: 13.9\n" in text and "estimated_seconds: 0.3333\n" in text
    assert "sol_seconds: 1,234,568" in text and "fresh_tokens: 196,608" in text
    assert "observed selectivity 0.3333," in text
    assert "0.3333333333333333" not in text and "13.89659764399994" not in text


@pytest.mark.parametrize(("value", "shown"), [(0.5, "0.5"), (2.0, "2"), (12, "12"), (None, "None"), (True, "True")])
def test_human_numbers(value, shown):
    assert human(value) == shown


def test_a_first_progress_report_shows_no_rate_and_the_description_ends_at_a_word():
    out = io.StringIO()
    update = progress_bar(out)
    update(Node(), 4096, 8192)
    update(Node(), 8192, 8192)
    drawn = out.getvalue()
    assert "item/s" not in drawn and "items/s" not in drawn  # microseconds in: no rate to speak of
    description = drawn.strip("\r").split(":  ")[0].split("\r")[-1]
    assert description.endswith("…") and len(description) <= 48
    assert Node().describe().startswith(description[:-1].rstrip())
    assert "content-f" not in drawn or "content-free" in drawn


def test_shortened_never_splits_a_hyphenated_word():
    text = "AiFilter r: over r.body — content-free calibration"
    assert shortened(text, 30) == "AiFilter r: over r.body…"
    assert shortened(text, 40) == "AiFilter r: over r.body — content-free…"
    assert shortened("short", 40) == "short"


def test_bench_help_describes_its_options_and_their_defaults(capsys, monkeypatch):
    pytest.importorskip("quail_native")
    monkeypatch.setenv("COLUMNS", "200")  # argparse wraps at the terminal width
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: small)" in text and "(default: bench-out)" in text and "(default: native)" in text
    assert "results.json" in text
