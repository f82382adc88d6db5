"""`Backend`: what backends share, in one base class a plugin may subclass (or ignore and write the contract whole).

A subclass names itself and boots its engine (`name`, `start`); everything else has a default that fits a
backend reading a Hugging Face checkpoint found on this machine:

* `supports` — the checkpoint is there (`quail.catalog.locations.local_model_directory`);
* `tokenizer` — its tokenizer.json (Gemma's BOS first, as Quail's executor reads it);
* `model_identity` — its files by content, plus `identity_settings` (precision, device kind), so the answer
  store keeps what this backend computed apart from every other backend's;
* `plan` — Quail's planner (filter order, join anchors, KV prefixes), laid out in `prompt_style`, with the
  TRUE/FALSE ids of `answer_tokens` and calibration as `calibrates` decides; `refuse` may turn down a node
  kind the engine cannot answer, with its reason, before any model work;
* `execute_request` — the shared worker side (`quail.serving.engines`): the engine `start` boots is kept
  in the worker's `runtime_state` across queries, stored answers are read instead of computed, and the
  model nodes reach the engine one at a time as `ModelExecution.execute(node, inputs)`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from quail.backends.base import (
    BackendExecutionContext,
    GpuContext,
    ModelExecution,
    ModelIdentity,
    ModelRegion,
    PhysicalCandidate,
    PlanningContext,
    SupportResult,
)
from quail.catalog.devices import DeviceSpec
from quail.catalog.locations import local_model_directory
from quail.catalog.models import ModelSpec
from quail.compute.request import PhysicalResponse
from quail.config import EngineConfig
from quail.data.tokenizer import HuggingFaceTokenizer, Tokenizer
from quail.errors import Refusal, RefusalError
from quail.physical.graph import PhysicalGraph
from quail.planner.calibration import calibrates
from quail.planner.physical import plan_query
from quail.prompts import AnswerTokens, PromptStyle, answer_tokens, style_for
from quail.serving.engines import execute_request

CHECKPOINT_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
                    "*.safetensors")
"""What an engine reads of a checkpoint directory: the files its answers are a function of."""


EMBEDDING_FILES = ("config.json", "*.safetensors", "tokenizer.json", "tokenizer_config.json", "modules.json",
                   "sentence_bert_config.json", "1_Pooling/config.json")
"""What an embedding model's vectors are a function of besides the ids: the weights, the tokenizer (an engine
reads its special tokens there) and the sentence-transformers modules that say how to pool and normalise."""


def embedding_identity(model: ModelSpec, device: DeviceSpec) -> ModelIdentity | None:
    """An embedding model's `EMBEDDING_FILES`, run in float32 (whatever precision the session asks of its generative
    model) on this device kind; None when its package is not here."""
    try:
        directory = local_model_directory(model)
    except RefusalError:
        return None
    files = tuple(sorted({p for pattern in EMBEDDING_FILES for p in directory.glob(pattern)}))
    return ModelIdentity(files, (("precision", "fp32"), ("pooling", "as the modules say"), ("device", device.kind)))


def checkpoint_tokenizer(model: ModelSpec) -> Tokenizer:
    """The checkpoint's tokenizer.json; Gemma puts its BOS token first, as Quail's executor does. An embedding
    model's without special tokens (its engine frames each document itself) and without the truncation the file
    asks for (the engine truncates)."""
    directory = local_model_directory(model)
    if model.kind == "embedding":
        return HuggingFaceTokenizer(directory / "tokenizer.json", bos_id=None)
    config = json.loads((directory / "config.json").read_text())
    bos = config.get("bos_token_id") if model.architecture == "gemma3" else None
    return HuggingFaceTokenizer(directory / "tokenizer.json", bos if isinstance(bos, int) else None)


class Backend:
    """The backend contract with shared defaults: override `start` (and `name`), and only what else differs.

    Backends that compare equal share a booted engine across sessions; the default equality is by class
    and name, so a subclass holding settings that change its engine extends `__eq__` and `__hash__`.
    """

    name: str = ""

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and isinstance(other, Backend) and other.name == self.name

    def __hash__(self) -> int:
        return hash((type(self), self.name))

    # -- what the engine can run --------------------------------------------------------------

    def supports(self, model: ModelSpec, device: DeviceSpec, gpu_count: int) -> SupportResult:
        """Accepts a model whose checkpoint is on this machine; rejects saying how to get it otherwise."""
        try:
            local_model_directory(model)
        except RefusalError as refused:
            return SupportResult.reject(str(refused))
        return SupportResult.accept()

    def start(self, context: GpuContext) -> ModelExecution:
        """Boot the engine for one device worker; it is kept and reused until the worker releases it."""
        raise NotImplementedError(f"backend {self.name!r} does not say how to start its engine")

    def refuse(self, graph: PhysicalGraph) -> Refusal | None:
        """A reason this backend cannot run a planned graph (a node kind its engine cannot read), or None."""
        return None

    # -- what its numbers depend on -----------------------------------------------------------

    def tokenizer(self, model: ModelSpec) -> Tokenizer:
        return checkpoint_tokenizer(model)

    def identity_settings(self, model: ModelSpec, device: DeviceSpec,
                          config: EngineConfig) -> tuple[tuple[str, str], ...]:
        """Everything besides the checkpoint's files that changes the numbers (Quail adds the backend's name)."""
        return (("precision", config.precision), ("device", device.kind))

    def model_identity(self, model: ModelSpec, device: DeviceSpec, config: EngineConfig) -> ModelIdentity | None:
        """The checkpoint's files and `identity_settings`; None (no answer store) when the checkpoint is not here."""
        if model.kind == "embedding":
            return embedding_identity(model, device)
        try:
            directory = local_model_directory(model)
        except RefusalError:
            return None
        files = tuple(sorted({p for pattern in CHECKPOINT_FILES for p in directory.glob(pattern)}))
        return ModelIdentity(files, self.identity_settings(model, device, config))

    # -- planning -----------------------------------------------------------------------------

    def prompt_style(self, model: ModelSpec) -> PromptStyle:
        """How prompts are laid out for `model`: its chat turn when it has one, plain text otherwise."""
        return style_for(model.chat_template, model.architecture)

    def answer_tokens(self, tokenizer: Tokenizer) -> AnswerTokens | None:
        """The TRUE-like and FALSE-like first-token ids the model nodes read (refuses a tokenizer that cannot
        tell them apart); the margin is max over TRUE ids minus max over FALSE ids of the next-token logits."""
        return answer_tokens(tokenizer)

    def calibrates(self, context: PlanningContext) -> bool:
        """Whether margins are corrected by the model's answer on content-free documents (`auto`: base models)."""
        return calibrates(context)

    def plan(self, region: ModelRegion, context: PlanningContext) -> Sequence[PhysicalCandidate] | Refusal:
        if context.tokenizer is None:
            return Refusal(f"backend {self.name!r} plans with the model's tokenizer, and none was given")
        planned = plan_query(self.name, region, context, self.prompt_style(context.model),
                             calibrate=self.calibrates(context), answers=self.answer_tokens(context.tokenizer))
        refusal = self.refuse(planned.graph)
        return refusal if refusal is not None else [planned]

    # -- the worker side ----------------------------------------------------------------------

    def execute_request(self, context: BackendExecutionContext) -> PhysicalResponse:
        return execute_request(self, context)
