"""This plugin's backends: the keyword rule of quail.testing, published under names of its own.

A third-party distribution adds a backend with nothing but an entry point and one hook
(`plugin.py`); these two prove it end to end — discovered, selected by name, answering queries
through the same `execute_request` path as every backend.
"""

from __future__ import annotations

from quail.testing import KeywordBackend


class ExampleBackend(KeywordBackend):
    """The deterministic keyword backend as a third party would ship one (CPU only)."""

    name = "example"


class ExampleKeywordBackend(KeywordBackend):
    """The same rule under a second name: the CLI tests drive `quail query --backend example-keyword`."""

    name = "example-keyword"
