"""A CPU test backend and tokenizer for checking engine semantics without a model.

`KeywordBackend` answers by a deterministic rule (keywords, shared words, a hash) through the
real backend contract. It is never a default and is not registered as a user backend: tests
register it on their own registry.
"""

from quail.testing.backend import KeywordBackend, KeywordExecution
from quail.testing.rules import classify_margins, predicate_margin
from quail.testing.tokenizer import ByteTokenizer

BASE_MODEL = "gemma-3-270m"
"""A catalog model laid out without a chat turn: what a backend that plans per model (vLLM, SGLang) needs when its
tokenizer is `ByteTokenizer`, which has no chat control tokens (the default model is a chat model)."""

__all__ = ["BASE_MODEL", "ByteTokenizer", "KeywordBackend", "KeywordExecution", "classify_margins",
           "predicate_margin"]
