"""Contextual calibration: whether a query's TRUE/FALSE decisions are measured against content-free documents.

A small base model's TRUE−FALSE margin ranks documents well but is biased: it says TRUE to almost
everything. Measuring the margin the same question gets on documents that say nothing ("N/A", "",
"[MASK]") and answering TRUE only above it removes that bias, for a few extra forwards per predicate.
Instruction-tuned (chat) models are left alone.
"""

from __future__ import annotations

from quail.backends.base import PlanningContext

CALIBRATE_BASE_MODELS = True
"""The `auto` default for base models, decided on the labeled reviews (numbers in README.md)."""


def calibrates(context: PlanningContext) -> bool:
    """`on` and `off` are the user's; `auto` calibrates base models (no chat template) only."""
    if context.calibration != "auto":
        return context.calibration == "on"
    return CALIBRATE_BASE_MODELS and not context.model.chat_template


REMARK = ("calibrate TRUE/FALSE decisions: each predicate answers TRUE only where its margin beats the mean "
          "margin on the content-free documents 'N/A', '' and '[MASK]'")
