"""EngineConfig: which model, on which device, through which backend."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from quail.errors import ConfigError

Precision = Literal["auto", "fp32", "bf16"]
Switch = Literal["auto", "on", "off"]
OversizedPolicy = Literal["refuse", "skip", "truncate"]
SWITCHES = ("auto", "on", "off")
PRECISIONS = ("auto", "fp32", "bf16")
OVERSIZED_POLICIES = ("refuse", "skip", "truncate")

DEFAULT_MODEL = "qwen2.5-coder-1.5b-instruct"
DEFAULT_EMBEDDING_MODEL = "all-minilm-l6-v2"
DEFAULT_DEVICE = "cpu"
DEFAULT_BACKEND = "native"
DEFAULT_COMPUTE = "local"
DEFAULT_CACHE = "auto"
DEFAULT_CACHE_LIMIT = 4_000_000


@dataclass(frozen=True)
class EngineConfig:
    """What a Session runs on. Names are looked up in the ExtensionRegistry.

    Every field is checked here, so a wrong type is a TypeError and a wrong value a ValueError
    (`ConfigError`) naming the field, before any session work.
    """

    model: str = DEFAULT_MODEL
    embedding_model: str = DEFAULT_EMBEDDING_MODEL
    """The embedding model of AI.EMBED / AI.SIMILARITY when a call names none."""
    model_aliases: tuple[tuple[str, str], ...] = ()
    """Names a statement may give a model (`AI_COMPLETE('llama3.1-8b', …)`, `endpoint => 'gemini-2.5-flash'`) and the
    catalog model each stands for, as (alias, model) pairs; a dict is accepted too and kept as sorted pairs. A call
    naming neither a catalog model nor an alias is refused."""
    device: str = DEFAULT_DEVICE
    backend: str = DEFAULT_BACKEND
    gpus: int = 1
    chunk_tokens: int = 2048
    kv_budget_bytes: float | None = None
    precision: Precision = "auto"
    kv_page_tokens: int = 16
    prefix_sharing: Switch = "auto"
    calibration: Switch = "auto"
    early_limit: Switch = "auto"
    """A LIMIT the first documents can meet is met early: the model reads documents in rounds and stops once
    the rows are there ("auto" and "on"); "off" reads every document, as a plan without the LIMIT would."""
    join_conditions: Switch = "auto"
    """Conditions between joined tables (`r1.id < r2.id`) restrict the pairs an AI join asks ("auto", "on"); "off"
    applies them after the model only, as before they were pushed down (the rows are the same)."""
    question_first: Switch = "auto"
    """A node asking each document one long question (a rubric over short documents) states it once, before the
    documents ("auto": when that is clearly cheaper in tokens; "on": for every such node; "off": never)."""
    oversized_documents: OversizedPolicy = "refuse"
    """A document too long for one forward pass with its prompt: "refuse" the query (the default),
    "skip" that document (it leaves the query), or "truncate" it to the tokens that fit. Skipped and
    truncated documents are counted in the report and named in the plan's remarks."""
    compute: str = DEFAULT_COMPUTE
    """Where model work runs: a compute provider by name (`local` in-process, `process`, plugins' own)."""
    worker_setup: str | None = None
    """`module:function` a worker process calls with its registry before its first request (registers
    backends that no entry point provides; Ray calls its counterpart `worker_process_setup_hook`)."""
    engines_per_device: int = 1
    """Booted engines a worker keeps per device; booting one more closes the least recently used."""
    cache: str = DEFAULT_CACHE
    """The answer store: `auto` (on, under $QUAIL_HOME), `off`, or the path of a store file (`quail.cache`)."""
    cache_limit: int = DEFAULT_CACHE_LIMIT
    """Answers the store keeps; beyond it the least recently used are evicted."""
    address: str | None = None
    """Cluster of a distributed provider (`ray`): None starts a local one (or joins the one this process
    already started), "auto" joins the cluster running on this machine, or a cluster address."""
    workers: int | None = None
    """Workers a distributed provider splits model work over; None: as many as the cluster has room for."""
    worker_cpus: float = 1.0
    """CPUs (threads) each distributed worker holds."""
    worker_gpus: float | None = None
    """GPUs each distributed worker holds; None: one on a GPU device, none on `cpu`."""
    external_access: bool = False
    """Whether a query's SQL may read files the session did not register (`read_csv('...')`, `glob`,
    `ATTACH`, COPY). Off: the relational part reads only the registered tables' files, installs no
    extension and cannot change its settings (what a server must guarantee); on: DuckDB as a local
    user has it."""

    def __post_init__(self) -> None:
        for name in ("model", "embedding_model", "device", "backend"):
            _require_name(name, getattr(self, name))
        object.__setattr__(self, "model_aliases", _alias_pairs(self.model_aliases))
        _require_count("gpus", self.gpus, 1)
        _require_count("chunk_tokens", self.chunk_tokens, 16)
        _require_count("kv_page_tokens", self.kv_page_tokens, 1)
        if self.kv_budget_bytes is not None:
            _require_positive_number("kv_budget_bytes", self.kv_budget_bytes)
        _require_choice("precision", self.precision, PRECISIONS)
        for name in ("prefix_sharing", "calibration", "early_limit", "question_first", "join_conditions"):
            _require_choice(name, getattr(self, name), SWITCHES)
        _require_choice("oversized_documents", self.oversized_documents, OVERSIZED_POLICIES)
        _require_name("compute", self.compute)
        if self.worker_setup is not None and (not isinstance(self.worker_setup, str) or
                                              self.worker_setup.count(":") != 1):
            raise ConfigError(f"EngineConfig.worker_setup must be 'module:function', got {self.worker_setup!r}")
        _require_count("engines_per_device", self.engines_per_device, 1)
        if not isinstance(self.cache, str) or not self.cache.strip():
            raise ConfigError(f"EngineConfig.cache must be 'auto', 'off' or a store file's path, got {self.cache!r}")
        _require_count("cache_limit", self.cache_limit, 1)
        if not isinstance(self.external_access, bool):
            raise TypeError(f"EngineConfig.external_access must be a bool, got {self.external_access!r}")
        self._check_placement()

    def _check_placement(self) -> None:
        if self.address is not None and not (isinstance(self.address, str) and self.address.strip()):
            raise ConfigError(f"EngineConfig.address must be None, 'auto' or a cluster address, got {self.address!r}")
        if self.workers is not None and (isinstance(self.workers, bool) or not isinstance(self.workers, int)
                                         or self.workers < 1):
            raise ConfigError(f"EngineConfig.workers must be None or at least 1, got {self.workers!r}")
        if isinstance(self.worker_cpus, bool) or not isinstance(self.worker_cpus, int | float):
            raise TypeError(f"EngineConfig.worker_cpus must be a number, got {self.worker_cpus!r}")
        if not self.worker_cpus > 0:
            raise ConfigError(f"EngineConfig.worker_cpus must be more than 0, got {self.worker_cpus!r}")
        if self.worker_gpus is not None and not self.worker_gpus >= 0:
            raise ConfigError(f"EngineConfig.worker_gpus must be None or at least 0, got {self.worker_gpus!r}")
        if self.compute == DEFAULT_COMPUTE:
            self._check_no_placement()

    def _check_no_placement(self) -> None:
        """`local` runs the model work in this process: a worker count, a cluster or a worker's share would
        be silently ignored, so each is refused by name."""
        given = {"workers": self.workers is not None, "address": self.address is not None,
                 "worker_cpus": self.worker_cpus != 1.0, "worker_gpus": self.worker_gpus is not None}
        for name, set_ in given.items():
            if set_:
                raise ConfigError(f"EngineConfig.{name} places work on the workers of a distributed compute "
                                  f"provider; compute={self.compute!r} runs it in this process (choose "
                                  "compute='ray', or leave it out)")

    def catalog_name(self, name: str) -> str:
        """The catalog model a name in a statement stands for: an alias's model, else the name itself."""
        return dict(self.model_aliases).get(name, name)

    def engine_settings(self) -> EngineConfig:
        """This config with every field that only planning or placement reads set to its default.

        Two configs with equal engine settings can share one booted engine.
        """
        return replace(self, embedding_model=DEFAULT_EMBEDDING_MODEL, model_aliases=(), prefix_sharing="auto",
                       calibration="auto", early_limit="auto", question_first="auto", join_conditions="auto",
                       oversized_documents="refuse", compute=DEFAULT_COMPUTE, worker_setup=None, engines_per_device=1,
                       cache=DEFAULT_CACHE, cache_limit=DEFAULT_CACHE_LIMIT, address=None, workers=None,
                       worker_cpus=1.0, worker_gpus=None, external_access=False)


def _alias_pairs(value: object) -> tuple[tuple[str, str], ...]:
    """Aliases as sorted (alias, model) pairs, from pairs or a mapping: hashable (a config keys booted engines) and
    plain data on the wire."""
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, tuple | list) and all(isinstance(p, tuple | list) and len(p) == 2 for p in value):
        pairs = [tuple(p) for p in value]
    else:
        raise TypeError(f"EngineConfig.model_aliases must map alias names to model names, got {value!r}")
    for alias, model in pairs:
        if not isinstance(alias, str) or not isinstance(model, str) or not alias.strip() or not model.strip():
            raise ConfigError(f"EngineConfig.model_aliases: {alias!r} -> {model!r} is not a pair of names")
    names = [alias for alias, _ in pairs]
    if len(set(names)) != len(names):
        raise ConfigError(f"EngineConfig.model_aliases names an alias twice: {sorted(names)}")
    return tuple(sorted((str(a), str(m)) for a, m in pairs))


def _require_name(field: str, value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"EngineConfig.{field} must be a name (str), got {type(value).__name__} {value!r}")
    if not value.strip():
        raise ConfigError(f"EngineConfig.{field} must not be empty")


def _require_count(field: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"EngineConfig.{field} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ConfigError(f"EngineConfig.{field} must be at least {minimum}, got {value}")


def _require_positive_number(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"EngineConfig.{field} must be a number of bytes or None, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"EngineConfig.{field} must be a positive, finite number of bytes (or None for the "
                          f"backend's default), got {value!r}")


def _require_choice(field: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        spelled = ", ".join(repr(c) for c in choices)
        raise ConfigError(f"EngineConfig.{field} must be one of {spelled}, got {value!r}")
