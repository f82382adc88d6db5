"""Worker setup hooks for the `ray` provider tests (`EngineConfig(worker_setup="support.ray_setup:...")`).

A Ray worker builds its registry from the installed plugins; backends a test registers in code
reach it through these hooks, the module reaching the workers through the test cluster's
`runtime_env`. The unhurried backend pauses long enough on every model node that a worker can be
killed, or a shard cancelled, while it is still at work.
"""

from __future__ import annotations

from support.compute_setup import SlowExecution, SlowKeywordBackend

import quail
from quail.testing import ByteTokenizer, KeywordBackend


class UnhurriedExecution(SlowExecution):
    pause_s = 1.0


class UnhurriedKeywordBackend(SlowKeywordBackend):
    name = "unhurried-keyword"
    execution = UnhurriedExecution


def register_unhurried(registry: quail.ExtensionRegistry) -> None:
    """The keyword rule twice: at once (`keyword`) and a second per model node (`unhurried-keyword`)."""
    registry.register_backend(KeywordBackend(ByteTokenizer()))
    registry.register_backend(UnhurriedKeywordBackend(ByteTokenizer()))
