"""`quail.extend`: everything a backend or compute-provider author uses, in one public module.

Users import `quail`; plugin authors import `quail` and this module, nothing deeper (the first-party plugins
are held to that by a test). docs/backends.md walks through writing a backend with it. The groups:

* **The contract** — `ModelBackend` (what a registry holds), `Backend` (its shared defaults: subclass it and
  override `start`), `ModelExecution` (a booted engine answering one model node at a time), the values they
  exchange, and the optional roles (`TokenizerSource`, `ModelIdentitySource`, `ForgetsKV`, `DescribesEngine`).
* **Node kinds** — the model nodes an engine answers (`AiFilter`, `AiJoin`, `AiScore`, `AiClassify`,
  `AiGenerate`, and `AiEmbed` for an embedding model), each laying out its own prompts (`prefix`, `question`,
  `document_prompt`, `anchor_prefix`, ...).
* **Answer shapes** — the Arrow tables a model node returns (`filter_answers`, `join_answers`, `score_answers`,
  `label_answers`, `generation_answers`, `embedding_answers`), and the rules that read margins (`predicate_holds`,
  `choose_label`, `sigmoid`).
* **Prompt layout and answers** — `PromptStyle`/`style_for`, `AnswerTokens`/`answer_tokens`; a TRUE/FALSE
  margin is max over the TRUE-like ids minus max over the FALSE-like ids of the next-token log-probabilities
  (`margin_of`); an AI.CLASSIFY label scores the summed log-probability of its whole continuation.
* **Request engines** — `RequestBackend` runs every node kind as prompt requests to an engine playing
  `RequestEngine` (vLLM's and SGLang's adapters); one that `ReadsContinuations` answers AI.CLASSIFY too, one that
  `GeneratesText` AI.GENERATE / AI_COMPLETE, one that `EmbedsText` (booted on an embedding model) AiEmbed.
* **Model files** — `local_model_directory` (a catalog model's Hugging Face checkpoint on this machine, found,
  never downloaded), `checkpoint_tokenizer`, `quail_cache_home`, `Tokenizer`, `TokenIds`.
* **The boundary and compute providers** — `PhysicalRequest`/`PhysicalResponse` (data only), `ComputeProvider`,
  `serve` (the far side of every provider), the wire codecs, and the sharding helpers a splitting provider uses.
* **Plugins** — `hookimpl`, `Registrar`; **the test kit** — `KeywordBackend`, `ByteTokenizer`, and `datasets` (the
  bundled tables a benchmark reads).
"""

from __future__ import annotations

from quail import datasets
from quail.backends.base import (
    BackendExecutionContext,
    BackendLookup,
    DescribesEngine,
    ForgetsKV,
    GpuContext,
    ModelBackend,
    ModelExecution,
    ModelIdentity,
    ModelIdentitySource,
    ModelRegion,
    NodeInputs,
    NodeOutput,
    OrderRule,
    PhysicalCandidate,
    PlanningContext,
    RuntimeState,
    StoredAnswers,
    SupportResult,
    TokenizerSource,
)
from quail.backends.default import CHECKPOINT_FILES, Backend, checkpoint_tokenizer, embedding_identity
from quail.backends.shapes import (
    Finish,
    choose_label,
    embedding_answers,
    empty_answers,
    filter_answers,
    generation_answers,
    join_answers,
    label_answers,
    predicate_holds,
    score_answers,
    sigmoid,
)
from quail.catalog.devices import DeviceSpec
from quail.catalog.locations import local_model_directory, quail_cache_home
from quail.catalog.models import ModelSpec
from quail.compute.base import Caller, ComputeProvider, ShardingProvider
from quail.compute.lifetime import on_release
from quail.compute.local import forget_kv_caches
from quail.compute.request import (
    BootKind,
    ExecutionMetrics,
    NodeMetrics,
    PhysicalRequest,
    PhysicalResponse,
    PortRef,
    ShardMetrics,
    TableInput,
)
from quail.compute.sharding import (
    Answers,
    ShardProgress,
    finish,
    limit_reached,
    merge_answers,
    merge_metrics,
    progress_of,
    request_partition,
    scan_port,
    shard_metrics,
    shard_request,
)
from quail.compute.wire import (
    Frames,
    Message,
    decode_error,
    decode_request,
    decode_response,
    encode_error,
    encode_request,
    encode_response,
    receive,
)
from quail.config import DEFAULT_MODEL, EngineConfig, Precision
from quail.data.relational import candidate_tuples
from quail.data.tokenizer import HuggingFaceTokenizer, TokenIds, Tokenizer
from quail.data.tokens import TOKENS_SCHEMA, TokenColumn
from quail.errors import ComputeError, ModelFileError, QuailError, Refusal, RefusalError, WorkerLostError
from quail.physical.graph import PhysicalGraph
from quail.physical.nodes import (
    AiClassify,
    AiEmbed,
    AiFilter,
    AiGenerate,
    AiJoin,
    AiScore,
    DocumentNode,
    FilterStage,
    ModelNode,
    PhysicalNode,
    Scan,
)
from quail.planner.calibration import calibrates
from quail.planner.partition import Partition, Phase, Shard
from quail.planner.physical import plan_query
from quail.planner.prefixes import plan_borrows
from quail.planner.statistics import document_columns
from quail.plugins.hookspecs import hookimpl
from quail.plugins.kinds import Registrar
from quail.progress import ProgressListener
from quail.prompts import AnswerTokens, PromptStyle, answer_tokens, style_for
from quail.requests import (
    EmbedsText,
    EngineAnswer,
    EngineGeneration,
    EngineRequest,
    GeneratesText,
    ReadsContinuations,
    RequestBackend,
    RequestEngine,
    RequestStrategy,
    margin_of,
)
from quail.requests.backend import EngineFactory, installed
from quail.runtime.report import ReportValue
from quail.runtime.results import QueryResult
from quail.serving.engines import execute_request, release_all, serve
from quail.testing import BASE_MODEL, ByteTokenizer, KeywordBackend

__all__ = [
    "BASE_MODEL",
    "CHECKPOINT_FILES",
    "DEFAULT_MODEL",
    "TOKENS_SCHEMA",
    "AiClassify",
    "AiEmbed",
    "AiFilter",
    "AiGenerate",
    "AiJoin",
    "AiScore",
    "AnswerTokens",
    "Answers",
    "Backend",
    "BackendExecutionContext",
    "BackendLookup",
    "BootKind",
    "ByteTokenizer",
    "Caller",
    "ComputeError",
    "ComputeProvider",
    "DescribesEngine",
    "DeviceSpec",
    "DocumentNode",
    "EmbedsText",
    "EngineAnswer",
    "EngineConfig",
    "EngineFactory",
    "EngineGeneration",
    "EngineRequest",
    "ExecutionMetrics",
    "FilterStage",
    "Finish",
    "ForgetsKV",
    "Frames",
    "GeneratesText",
    "GpuContext",
    "HuggingFaceTokenizer",
    "KeywordBackend",
    "Message",
    "ModelBackend",
    "ModelExecution",
    "ModelFileError",
    "ModelIdentity",
    "ModelIdentitySource",
    "ModelNode",
    "ModelRegion",
    "ModelSpec",
    "NodeInputs",
    "NodeMetrics",
    "NodeOutput",
    "OrderRule",
    "Partition",
    "Phase",
    "PhysicalCandidate",
    "PhysicalGraph",
    "PhysicalNode",
    "PhysicalRequest",
    "PhysicalResponse",
    "PlanningContext",
    "PortRef",
    "Precision",
    "ProgressListener",
    "PromptStyle",
    "QuailError",
    "QueryResult",
    "ReadsContinuations",
    "Refusal",
    "RefusalError",
    "Registrar",
    "ReportValue",
    "RequestBackend",
    "RequestEngine",
    "RequestStrategy",
    "RuntimeState",
    "Scan",
    "Shard",
    "ShardMetrics",
    "ShardProgress",
    "ShardingProvider",
    "StoredAnswers",
    "SupportResult",
    "TableInput",
    "TokenColumn",
    "TokenIds",
    "Tokenizer",
    "TokenizerSource",
    "WorkerLostError",
    "answer_tokens",
    "calibrates",
    "candidate_tuples",
    "checkpoint_tokenizer",
    "choose_label",
    "datasets",
    "decode_error",
    "decode_request",
    "decode_response",
    "document_columns",
    "embedding_answers",
    "embedding_identity",
    "empty_answers",
    "encode_error",
    "encode_request",
    "encode_response",
    "execute_request",
    "filter_answers",
    "finish",
    "forget_kv_caches",
    "generation_answers",
    "hookimpl",
    "installed",
    "join_answers",
    "label_answers",
    "limit_reached",
    "local_model_directory",
    "margin_of",
    "merge_answers",
    "merge_metrics",
    "on_release",
    "plan_borrows",
    "plan_query",
    "predicate_holds",
    "progress_of",
    "quail_cache_home",
    "receive",
    "release_all",
    "request_partition",
    "scan_port",
    "score_answers",
    "serve",
    "shard_metrics",
    "shard_request",
    "sigmoid",
    "style_for",
]
