"""Worker setup hooks for the `ray` provider tests (`EngineConfig(worker_setup="ray_setup:...")`).

A Ray worker builds its registry from the installed plugins; backends a test registers in code
reach it through these hooks, the module reaching the workers through the test cluster's
`runtime_env`. The slow backend takes long enough per model node that a worker can be killed, or a
shard cancelled, while it is still at work.
"""

from __future__ import annotations

import time

import quail
from quail.backends.base import NodeInputs, NodeOutput
from quail.physical import nodes as ph
from quail.testing import ByteTokenizer, KeywordBackend, KeywordExecution

SLOW_NODE_S = 1.0


def register_keyword(registry: quail.ExtensionRegistry) -> None:
    registry.register_backend(KeywordBackend(ByteTokenizer()))


class UnhurriedExecution(KeywordExecution):
    """The keyword rule, after a report of progress and a pause, on every model node."""

    def execute(self, node: ph.PhysicalNode, inputs: NodeInputs) -> NodeOutput:
        if self.progress is not None:
            self.progress(0, 1)
        time.sleep(SLOW_NODE_S)
        if self.progress is not None:
            self.progress(1, 1)
        return super().execute(node, inputs)


class UnhurriedKeywordBackend(KeywordBackend):
    name = "unhurried-keyword"

    def start(self, context: quail.GpuContext) -> UnhurriedExecution:
        self.started += 1
        return UnhurriedExecution(self._tokenizer)


def register_unhurried(registry: quail.ExtensionRegistry) -> None:
    registry.register_backend(KeywordBackend(ByteTokenizer()))
    registry.register_backend(UnhurriedKeywordBackend(ByteTokenizer()))
