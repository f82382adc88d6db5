"""The naive baseline: one plain transformers forward of the full prompt per (document, predicate) or tuple.

It re-evaluates exactly the items the engine evaluated (from its answer tables), with the same
canonical prompt ids, so wall time and agreement compare like with like.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import torch

from quail import PhysicalGraph
from quail.extend import AiClassify, AiFilter, AiJoin, AiScore, AnswerTokens, PhysicalNode, Tokenizer, predicate_holds

Texts = dict[str, list[str]]


@dataclass(frozen=True)
class NaiveRun:
    seconds: float
    tokens: int
    items: int
    agreeing: int

    @property
    def agreement(self) -> float:
        return self.agreeing / self.items if self.items else 1.0


class NaiveModel:
    def __init__(self, directory: Path, tokenizer: Tokenizer, answers: AnswerTokens,
                 device: torch.device | None = None) -> None:
        from transformers import AutoModelForCausalLM

        self.device = device or torch.device("cpu")
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).to(self.device).eval()
        self.tokenizer = tokenizer
        self.answers = answers
        self.measured: dict[tuple[tuple[int, ...], int], tuple[float, float]] = {}
        self.seconds = 0.0

    def timed(self, ids: tuple[int, ...], label: int, compute: Callable[[], float]) -> float:
        """One forward, measured once: asked again (another backend, same prompt) its time is counted again
        without recomputing, so every backend is compared with the same per-request baseline."""
        key = (ids, label)
        if key not in self.measured:
            started = time.perf_counter()
            value = compute()
            self.measured[key] = (value, time.perf_counter() - started)
        value, seconds = self.measured[key]
        self.seconds += seconds
        return value

    def margin(self, ids: tuple[int, ...]) -> float:
        def compute() -> float:
            with torch.inference_mode():
                logits = self.model(torch.tensor([ids], device=self.device), logits_to_keep=1).logits[0, -1].float()
            return (logits[list(self.answers.true_ids)].max() - logits[list(self.answers.false_ids)].max()).item()

        return self.timed(ids, -1, compute)

    def label_score(self, prompt: tuple[int, ...], label: tuple[int, ...]) -> float:
        ids = prompt + label

        def compute() -> float:
            with torch.inference_mode():
                logits = self.model(torch.tensor([ids], device=self.device),
                                    logits_to_keep=len(label) + 1).logits[0, :-1]
            labels = torch.tensor(label, device=self.device)[:, None]
            return torch.log_softmax(logits.float(), -1).gather(1, labels).sum().item()

        return self.timed(ids, len(label), compute)

    def offset(self, prompts: list[tuple[int, ...]]) -> float:
        """Mean margin of the content-free prompts (calibration), 0 when there are none."""
        return sum(self.margin(p) for p in prompts) / len(prompts) if prompts else 0.0

    def encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text))

    def run(self, graph: PhysicalGraph, answers: dict[str, pa.Table], texts: Texts) -> NaiveRun:
        self.seconds = 0.0
        tokens = items = agreeing = 0
        for node in graph.nodes:
            table = answers.get(node.id)
            if table is None:
                continue
            for prompt, expected, check in self.items(node, table, texts):
                tokens += len(prompt)
                items += 1
                agreeing += int(check(expected))
        return NaiveRun(self.seconds, tokens, items, agreeing)

    def items(self, node: PhysicalNode, table: pa.Table, texts: Texts):  # noqa: ANN201 - a local generator
        rows = table.to_pylist()
        if isinstance(node, AiFilter):
            stages = {s.predicate.position: k for k, s in enumerate(node.stages)}
            offsets = {p: self.offset(prompts) for p, prompts in node.calibration_prompts().items()}
            for row in rows:
                stage = stages[row["predicate"]]
                ids = node.prompt(self.encode(texts[node.alias][row[node.alias]]), stage)
                margin = self.margin(ids)
                predicate, offset = node.stages[stage].predicate, offsets[row["predicate"]]
                yield ids, row["answer"], lambda answer, m=margin, p=predicate, o=offset: \
                    predicate_holds(p, m, o) == answer
        elif isinstance(node, AiJoin):
            offset = self.offset(node.calibration_prompts()[node.predicate.position])
            for row in rows:
                ids = node.prompt(self.encode(texts[node.anchor.alias][row[node.anchor.alias]]),
                                  [self.encode(texts[p.alias][row[p.alias]]) for p in node.partners])
                margin = self.margin(ids)
                yield ids, row["answer"], lambda answer, m=margin: predicate_holds(node.predicate, m, offset) == answer
        elif isinstance(node, AiClassify):
            names = [label.name for label in node.labels]
            for row in rows:
                prompt = node.document_prompt(self.encode(texts[node.alias][row[node.alias]]))
                scores = [self.label_score(prompt, label) for label in node.label_tokens]
                best = names[max(range(len(scores)), key=lambda k: (scores[k], -k))]
                yield prompt, row[node.output], lambda label, b=best: label == b
        elif isinstance(node, AiScore):
            for row in rows:
                ids = node.document_prompt(self.encode(texts[node.alias][row[node.alias]]))
                margin = self.margin(ids)
                yield ids, row["margin"], lambda value, m=margin: abs(value - m) < 1e-3

