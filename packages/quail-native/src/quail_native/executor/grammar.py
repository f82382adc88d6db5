"""Constrained decoding: a structured generation's JSON Schema held by llguidance, one matcher per sequence.

The grammar library owns the grammar (Quail writes only the JSON Schema, `AiGenerate.grammar`): before each token
the sequence's matcher says which vocabulary entries may come next, the chooser takes the best of those, and the
matcher consumes it. A sequence whose JSON is complete is ended at once (its next token could only be a stop).
The tokenizer is read from the checkpoint's tokenizer.json once per engine; stop tokens are its end tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from llguidance import LLMatcher, LLTokenizer


@dataclass
class Grammars:
    """Matchers for the structured generations of one engine; the grammar tokenizer is built on first need."""

    tokenizer_file: Path
    vocabulary: int
    _tokenizers: dict[tuple[int, ...], LLTokenizer] = field(default_factory=dict)
    _compiled: dict[str, str] = field(default_factory=dict)
    """JSON Schema text → the grammar llguidance compiles from it: once per schema, not once per sequence."""

    def matcher(self, grammar: str, stop: tuple[int, ...]) -> Constraint:
        tokenizer = self._tokenizers.get(stop)
        if tokenizer is None:
            tokenizer = self._tokenizers[stop] = LLTokenizer(str(self.tokenizer_file), n_vocab=self.vocabulary,
                                                             eos_token=list(stop))
        compiled = self._compiled.get(grammar)
        if compiled is None:
            compiled = self._compiled[grammar] = LLMatcher.grammar_from_json_schema(grammar)
        matcher = LLMatcher(tokenizer, compiled, log_level=0)
        if matcher.is_error():
            raise ValueError(f"the grammar library refused the output schema: {matcher.get_error()}")
        return Constraint(matcher)


@dataclass
class Constraint:
    """One sequence's place in its grammar."""

    matcher: LLMatcher

    def allowed(self) -> torch.Tensor:
        """Which vocabulary entries may come next ([vocabulary] bool)."""
        bias = np.frombuffer(self.matcher.compute_logit_bias(), dtype=np.uint8)
        return torch.from_numpy(bias != 0)

    def take(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"the grammar refused token {token} it had allowed: {self.matcher.get_error()}")

    @property
    def complete(self) -> bool:
        """The JSON is whole: nothing but a stop token may follow."""
        return bool(self.matcher.is_stopped())
