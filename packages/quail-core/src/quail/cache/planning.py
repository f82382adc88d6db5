"""The answer store as the planner sees it: which prompts of a query need no model work (for prices only).

Filter stages and outputs are looked up for every distinct document; join tuples from a fixed
sample (all tuples of a large join would cost more to hash than to plan) of the documents no
stored FALSE of their filters drops (the optimizer prices filters before joins). A stored margin counts
as a decision with the predicate's stored calibration offset when there is one, else uncalibrated
— a price, never an answer: the answers are read again where the model nodes run.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from quail.backends import shapes
from quail.backends.base import ModelBackend, StagePrompt
from quail.cache.access import StoredAnswerAccess
from quail.catalog.devices import DeviceSpec
from quail.catalog.models import ModelSpec
from quail.config import EngineConfig
from quail.data.tokenizer import TokenIds, Tokenizer
from quail.data.tokens import TokenColumn
from quail.prompts import content_free_documents

SAMPLED_TUPLES = 256
"""Join tuples looked up to estimate the stored share of a join."""


class StoredAnswerView:
    """`quail.backends.base.StoredAnswers` over one store, one model and one query's token columns."""

    def __init__(self, access: StoredAnswerAccess, tokens: Mapping[str, TokenColumn], tokenizer: Tokenizer) -> None:
        self.access = access
        self.tokens = tokens
        self.content_free = content_free_documents(tokenizer)
        self._distinct: dict[str, list[TokenIds]] = {}
        self._dropped: dict[str, set[TokenIds]] = {}
        """Per alias, the documents a stored FALSE of its filters drops: joins never see them."""

    def documents(self, alias: str) -> list[TokenIds]:
        """The alias's distinct documents (duplicates are computed once, so they are priced once; NULL
        documents are never computed, so never priced)."""
        if alias not in self._distinct:
            rows = self.tokens[alias].tokens.to_pylist()
            self._distinct[alias] = list(dict.fromkeys(tuple(row) for row in rows if row is not None))
        return self._distinct[alias]

    def pending_stages(self, alias: str, stages: Sequence[StagePrompt]) -> list[list[int]]:
        documents = self.documents(alias)
        keys = self.access.keys
        prompt_keys = [[keys.margin(prompt(d)) for d in documents] for _, prompt in stages]
        offset_keys = [keys.calibration([prompt(d) for d in self.content_free]) for _, prompt in stages]
        stored = self.access.get([k for row in prompt_keys for k in row] + offset_keys)
        offsets = [stored.get(k, (0.0,))[0] for k in offset_keys]
        pending: list[list[int]] = [[] for _ in stages]
        for index, document in enumerate(documents):
            margins = [stored.get(row[index]) for row in prompt_keys]
            decisions = [None if m is None or len(m) != 1 else shapes.predicate_holds(p, m[0], o)
                         for (p, _), m, o in zip(stages, margins, offsets, strict=True)]
            if False in decisions:
                self._dropped.setdefault(alias, set()).add(document)
                continue
            for stage, decision in enumerate(decisions):
                if decision is None:
                    pending[stage].append(len(document))
        return pending

    def pending_labels(self, alias: str, prompt: Callable[[TokenIds], TokenIds],
                       labels: Sequence[TokenIds]) -> list[int]:
        documents = self.documents(alias)
        keys = [self.access.keys.labels(prompt(d), labels) for d in documents]
        stored = self.access.get(keys)
        return [len(d) for d, k in zip(documents, keys, strict=True) if len(stored.get(k, ())) != len(labels)]

    def stored_share(self, aliases: Sequence[str], prompt: Callable[[Sequence[TokenIds]], TokenIds]) -> float:
        pools = [[d for d in self.documents(alias) if d not in self._dropped.get(alias, ())] for alias in aliases]
        if not all(pools):
            return 0.0
        sample = random.Random(0)
        keys = [self.access.keys.margin(prompt([sample.choice(pool) for pool in pools]))
                for _ in range(SAMPLED_TUPLES)]
        stored = self.access.get(keys)
        return sum(1 for k in keys if k in stored) / len(keys)


@contextmanager
def stored_answers(backend: ModelBackend, model: ModelSpec, device: DeviceSpec, config: EngineConfig,
                   tokens: Mapping[str, TokenColumn], tokenizer: Tokenizer) -> Iterator[StoredAnswerView | None]:
    """The planner's view of the store `config` names, open while planning; None when nothing is stored."""
    access = StoredAnswerAccess.open(backend, model, device, config)
    try:
        yield StoredAnswerView(access, tokens, tokenizer) if access.active else None
    finally:
        access.close()
