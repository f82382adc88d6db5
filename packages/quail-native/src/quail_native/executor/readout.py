"""Reading answers from the head at answer rows only: TRUE/FALSE margins and label log-probabilities."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quail_native.models import kernels
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


REFINED = 64
"""Logits recomputed in fp32 per row when the head is not fp32: the largest ones, which make the normaliser."""


def log_probabilities(model: Transformer, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(targets[r, j] | row r) over the full vocabulary (classification needs the normaliser).

    The whole head is multiplied in its own precision: converting a bf16 head (262k × 640) to fp32 on
    every call cost more than the forward pass it reads. In bf16 the targets and the REFINED largest
    logits are then recomputed in fp32, so the answer carries only the rounding of logits far below the
    maximum, whose share of the normaliser is small.
    """
    targets = targets.to(hidden.device)
    if hidden.shape[0] == 0:
        return torch.empty(targets.shape, dtype=torch.float32)
    logits = model.logits(hidden, fp32=False).float()
    if model.head_weight.dtype == torch.float32:
        return torch.log_softmax(logits, dim=-1).gather(1, targets)
    top = logits.topk(min(REFINED, logits.shape[1]), dim=1).indices
    logits.scatter_(1, top, _exact(model, hidden, top))
    return _exact(model, hidden, targets) - torch.logsumexp(logits, dim=-1, keepdim=True)


def _exact(model: Transformer, hidden: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """fp32 logits of row r at its own `columns[r]` (rows × k)."""
    weight = model.head_weight[columns].float()
    return torch.einsum("rh,rkh->rk", hidden.float(), weight)


NEAR_TOP = 8
"""Candidates a greedy choice recomputes in fp32 when the head is not fp32: rounding in bf16 cannot move a token
from beyond the top 8 to the top, but it can reorder two within it."""


def greedy_tokens(model: Transformer, hidden: torch.Tensor, allowed: torch.Tensor | None = None) -> list[int]:
    """The argmax of the head at each row, among its `allowed` tokens ([rows, vocabulary] bool; None: all); ties go
    to the lower id, as `torch.argmax` (and transformers) break them. In fp32 the whole head decides; otherwise its
    top NEAR_TOP allowed are recomputed in fp32 first."""
    if hidden.shape[0] == 0:
        return []
    exact_head = model.head_weight.dtype == torch.float32
    if not exact_head and allowed is None and hidden.shape[0] == 1:
        top = kernels.head_top(hidden.to(model.head_weight.dtype), model.head_weight, NEAR_TOP)
        if top is not None:  # one sequence: its candidates straight from the head, no logits written
            return _exactly_largest(model, hidden, top.sort().values[None], None)
    logits = model.logits(hidden) if exact_head else model.logits(hidden, fp32=False)
    if allowed is not None:
        logits = logits.masked_fill(~allowed[:, : logits.shape[1]].to(logits.device), float("-inf"))
    if exact_head:
        return logits.argmax(dim=-1).tolist()
    top = logits.topk(min(NEAR_TOP, logits.shape[1]), dim=1).indices.sort(dim=1).values
    return _exactly_largest(model, hidden, top, allowed)


def _exactly_largest(model: Transformer, hidden: torch.Tensor, candidates: torch.Tensor,
                     allowed: torch.Tensor | None) -> list[int]:
    """Each row's candidate ([rows, k] ids in increasing order) of the largest fp32 logit among its allowed ones;
    ties to the lower id."""
    exact = _exact(model, hidden, candidates)
    if allowed is not None:
        exact = exact.masked_fill(~allowed.to(candidates.device).gather(1, candidates), float("-inf"))
    return candidates.gather(1, exact.argmax(dim=1, keepdim=True)).squeeze(1).tolist()
