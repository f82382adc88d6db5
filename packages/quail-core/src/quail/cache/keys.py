"""What names one stored answer: the model's identity, the kind of readout, and the exact prompt token ids.

A key is a 16-byte BLAKE2b digest of that triple. Token ids enter as fixed-width little-endian
integers, so a prompt hashed in pieces (a document prefix once, then each question after it) has
the key of the whole prompt hashed at once — the hashing follows the prompt layout's sharing.
Kinds:

* `margin` — max TRUE logit − max FALSE logit at a prompt's last token (filter stages, join
  tuples, scores: one float);
* `labels` — each label's summed log-probability after a prompt (one float per label; the key
  covers the label token ids too);
* `calibration` — one predicate's mean margin over its content-free prompts (one float; the key
  covers every one of those prompts);
* `generation` — a greedy generation after a prompt: how it ended, then its token ids (whole numbers,
  exact as floats; the key covers the token bound and the stop tokens too);
* `embedding` — an embedding model's vector of a text's token ids (its floats; the model identity is the embedding
  model's, so the key is of that model and those ids).
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Sequence
from typing import Literal

from quail.data.tokenizer import TokenIds

ReadoutKind = Literal["margin", "labels", "calibration", "generation", "embedding"]
READOUT_KINDS: tuple[ReadoutKind, ...] = ("margin", "labels", "calibration", "generation", "embedding")
Key = bytes

KEY_BYTES = 16
_PERSON = b"quail-answer-1"


def token_bytes(tokens: Sequence[int]) -> bytes:
    """Token ids as unsigned 32-bit little-endian integers, whatever the machine's byte order."""
    packed = array("I", tokens)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


class PromptHash:
    """A prompt hashed so far; `then` continues it without touching the bytes already hashed."""

    def __init__(self, state: hashlib._Hash) -> None:
        self._state = state

    def then(self, tokens: Sequence[int]) -> PromptHash:
        state = self._state.copy()
        state.update(token_bytes(tokens))
        return PromptHash(state)

    def key(self) -> Key:
        return self._state.digest()


class Keys:
    """Keys of one model's answers: `prompt` starts a prompt of a kind, the helpers key whole readouts."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._starts = {kind: _start(model, kind) for kind in READOUT_KINDS}

    def prompt(self, kind: ReadoutKind, tokens: Sequence[int] = ()) -> PromptHash:
        return PromptHash(self._starts[kind].copy()).then(tokens)

    def margin(self, prompt: Sequence[int]) -> Key:
        return self.prompt("margin", prompt).key()

    def labels(self, prompt: Sequence[int], labels: Sequence[TokenIds]) -> Key:
        """The label token ids come first, each after its length: no two label sets hash alike."""
        return self.prompt("labels", _framed(labels)).then(prompt).key()

    def generation(self, prompt: Sequence[int], max_tokens: int, stop: TokenIds, grammar: str | None = None) -> Key:
        """The bound, the stop tokens and the grammar (JSON Schema text) come first: the same prompt with another
        of them is another generation."""
        held = tuple(grammar.encode()) if grammar is not None else ()
        return self.prompt("generation", _framed([(max_tokens,), stop, held])).then(prompt).key()

    def embedding(self, document: Sequence[int]) -> Key:
        return self.prompt("embedding", document).key()

    def calibration(self, prompts: Sequence[TokenIds]) -> Key:
        return self.prompt("calibration", _framed(prompts)).key()


def _start(model: str, kind: ReadoutKind) -> hashlib._Hash:
    state = hashlib.blake2b(digest_size=KEY_BYTES, person=_PERSON)
    state.update(model.encode() + b"\0" + kind.encode() + b"\0")
    return state


def _framed(sequences: Sequence[TokenIds]) -> list[int]:
    """[count, len₀, ids₀…, len₁, ids₁…]: a list of sequences as one unambiguous run of integers."""
    framed = [len(sequences)]
    for sequence in sequences:
        framed.append(len(sequence))
        framed.extend(sequence)
    return framed
