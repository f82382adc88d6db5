"""A CPU test backend and tokenizer for checking engine semantics without a model.

`KeywordBackend` answers by a deterministic rule (keywords, shared words, a hash) through the
real backend contract. It is never a default and is not registered as a user backend: tests
register it on their own registry.
"""

from quail.testing.backend import KeywordBackend, KeywordExecution
from quail.testing.rules import classify_margins, predicate_margin
from quail.testing.tokenizer import ByteTokenizer

__all__ = ["ByteTokenizer", "KeywordBackend", "KeywordExecution", "classify_margins", "predicate_margin"]
