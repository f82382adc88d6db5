"""The tokenizer role: core is model-agnostic, backends hand it a concrete tokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class Tokenizer(Protocol):
    """Text ↔ token ids for one model. `identity` keys cached token files.

    `encode` never adds special tokens: prompts are tokenized per part and concatenated, and the
    beginning-of-sequence token, when the model has one, is placed once by the prompt layout.
    """

    @property
    def identity(self) -> str: ...

    @property
    def bos_id(self) -> int | None: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_id(self, token: str) -> int | None:
        """The id of one vocabulary entry, or None when the vocabulary lacks it."""
        ...
