"""Reading answers from the head at answer rows only: TRUE/FALSE margins and label log-probabilities."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quail_native.models.transformer import Transformer


@dataclass(frozen=True)
class AnswerColumns:
    """Vocabulary ids of the TRUE-like and FALSE-like first tokens."""

    true_ids: tuple[int, ...]
    false_ids: tuple[int, ...]

    def columns(self) -> torch.Tensor:
        return torch.tensor(self.true_ids + self.false_ids, dtype=torch.long)


def margins(model: Transformer, hidden: torch.Tensor, answers: AnswerColumns) -> list[float]:
    """max TRUE-like logit − max FALSE-like logit, per row: only those head columns are computed."""
    if hidden.shape[0] == 0:
        return []
    logits = model.logits(hidden, answers.columns().to(hidden.device))
    split = len(answers.true_ids)
    return (logits[:, :split].max(dim=1).values - logits[:, split:].max(dim=1).values).tolist()


def log_probabilities(model: Transformer, hidden: torch.Tensor, targets: torch.Tensor) -> list[float]:
    """log p(target_r | row r) with the full vocabulary (classification needs the normaliser)."""
    if hidden.shape[0] == 0:
        return []
    logits = model.logits(hidden)
    return torch.log_softmax(logits, dim=-1).gather(1, targets[:, None].to(hidden.device))[:, 0].tolist()
