"""Worker setup hooks for the compute-provider tests (`EngineConfig(worker_setup="support.compute_setup:...")`).

A `process` worker builds its own registry from the installed plugins; backends that tests register
in code reach it through these hooks, as a user's would through theirs. The fake engines answer
from the margin table the test process taught and wrote to the file named by `MARGINS_FILE`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from support.fake_sglang import FakeSGLang
from support.request_helpers import LABELS, TOKENIZER, VOCAB

import quail
from quail.backends.base import NodeInputs, NodeOutput
from quail.physical import nodes as ph
from quail.testing import ByteTokenizer, KeywordBackend, KeywordExecution

MARGINS_FILE = "QUAIL_TEST_FAKE_MARGINS"
SLOW_NODE_S = 0.05


def save_margins(margins: dict[tuple[int, ...], float], path: Path) -> None:
    path.write_text(json.dumps([[list(ids), margin] for ids, margin in margins.items()]))


def load_margins() -> dict[tuple[int, ...], float]:
    return {tuple(ids): margin for ids, margin in json.loads(Path(os.environ[MARGINS_FILE]).read_text())}


def register_fakes(registry: quail.ExtensionRegistry) -> None:
    """The keyword backend and the fake vLLM / SGLang engines, answering from the taught margin table."""
    from support.fake_vllm import FakeLLM

    from quail_sglang.backend import SGLangBackend
    from quail_sglang.engine import EngineSettings, SGLangEngine
    from quail_vllm.backend import PIPELINED as VLLM_PIPELINED
    from quail_vllm.backend import VLLMBackend
    from quail_vllm.engine import VLLMEngine

    margins = load_margins()

    def boot_vllm(context: quail.GpuContext) -> VLLMEngine:
        return VLLMEngine(FakeLLM(margins, LABELS))  # type: ignore[arg-type]

    def boot_sglang(context: quail.GpuContext) -> SGLangEngine:
        settings = EngineSettings(Path("/models/fake"), kv_tokens=1 << 20, context_length=4096)
        return SGLangEngine(FakeSGLang(margins, LABELS, vocab=VOCAB, **settings.server_args()))  # type: ignore[arg-type]

    registry.register_backend(KeywordBackend(TOKENIZER))
    registry.register_backend(VLLMBackend("fake_vllm", VLLM_PIPELINED, boot=boot_vllm))
    registry.register_backend(SGLangBackend("fake_sglang", boot=boot_sglang))


class SlowExecution(KeywordExecution):
    """The keyword rule, slowly: it reports progress, takes its time, reports again, on every model node."""

    pause_s = SLOW_NODE_S

    def execute(self, node: ph.PhysicalNode, inputs: NodeInputs) -> NodeOutput:
        if self.progress is not None:
            self.progress(0, 1)
        time.sleep(self.pause_s)
        if self.progress is not None:
            self.progress(1, 1)
        return super().execute(node, inputs)


class SlowKeywordBackend(KeywordBackend):
    name = "slow-keyword"
    execution = SlowExecution

    def start(self, context: quail.GpuContext) -> SlowExecution:
        self.started += 1
        return self.execution(self._tokenizer)


def register_slow(registry: quail.ExtensionRegistry) -> None:
    registry.register_backend(SlowKeywordBackend(ByteTokenizer()))
