"""The tokenizer role: core is model-agnostic, backends hand it a concrete tokenizer."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from quail.errors import ModelFileError

if TYPE_CHECKING:
    from tokenizers import Tokenizer as TokenizerFile

TokenIds = tuple[int, ...]
"""A token sequence as Quail passes it around: immutable and hashable (a prompt, a document, a label)."""


@runtime_checkable
class Tokenizer(Protocol):
    """Text ↔ token ids for one model. `identity` keys cached token files.

    `encode` treats its text as data: it never adds special tokens, and a control token's spelling
    in the text (`<eos>`, `<start_of_turn>`, `<|im_end|>`) is encoded as those characters, never as
    the control token, so a document cannot forge the prompt's structure. The structure is the
    prompt layout's alone: it places the beginning-of-sequence token and a chat model's turn
    markers by id (`bos_id`, `token_id`), and concatenates the per-part ids around the documents.
    """

    @property
    def identity(self) -> str:
        """Keys cached token files and remembered ids (`quail.cache.token_ids`): it must differ whenever the
        ids of some text could."""
        ...

    @property
    def bos_id(self) -> int | None: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_id(self, token: str) -> int | None:
        """The id of one vocabulary entry, or None when the vocabulary lacks it."""
        ...


class HuggingFaceTokenizer:
    """The Tokenizer role over a `tokenizer.json` (the `tokenizers` library, imported lazily).

    Shared by every backend that runs Hugging Face checkpoints, so planning sees the exact ids the
    engine will. `bos_id` is the token the layout puts first (None for models that use none).
    Special tokens are not parsed in encoded text (`encode_special_tokens`): documents are data.
    The file is parsed on the first call that needs it, not when the tokenizer is made: its identity
    (the file's digest) and `bos_id` are known without it, and a query whose texts' ids are all
    remembered (`quail.cache.token_ids`) never needs it.
    """

    def __init__(self, path: Path, bos_id: int | None) -> None:
        if importlib.util.find_spec("tokenizers") is None:  # optional: only backends that load HF checkpoints
            raise ImportError("reading tokenizer.json needs the tokenizers package: pip install tokenizers")
        self._path = path
        self._identity = _identity(path.read_bytes())
        self._bos = bos_id
        self._parsed: TokenizerFile | None = None
        self._parsing = threading.Lock()

    @property
    def _tokenizer(self) -> TokenizerFile:
        if self._parsed is None:
            with self._parsing:
                if self._parsed is None:
                    self._parsed = self._parse()
        return self._parsed

    def _parse(self) -> TokenizerFile:
        """The file as it was when its identity was taken: one that changed since is an error, never ids
        under another file's identity."""
        from tokenizers import Tokenizer as TokenizerFile

        content = self._path.read_bytes()
        if _identity(content) != self._identity:
            raise ValueError(f"{self._path} changed after it was opened as tokenizer {self._identity}; open it again")
        try:
            parsed = TokenizerFile.from_str(content.decode("utf-8"))
        except Exception as error:  # the tokenizers library raises plain Exceptions for a malformed file
            raise ModelFileError(f"the tokenizer file {self._path} cannot be read: {error}; restore the model's "
                                 "tokenizer.json (or convert the model again)") from None
        parsed.encode_special_tokens = True
        parsed.no_truncation()  # a file may ask for truncation or padding (BERT's do): Quail decides lengths itself
        parsed.no_padding()
        return parsed

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def bos_id(self) -> int | None:
        return self._bos

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(e.ids) for e in self._tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=False))

    def token_id(self, token: str) -> int | None:
        found = self._tokenizer.token_to_id(token)
        return None if found is None else int(found)


ENCODING_SETTINGS = b"add_special_tokens=False;encode_special_tokens=True;no_truncation;no_padding"
"""How `HuggingFaceTokenizer` encodes: part of its identity, like the library's version."""


def _identity(content: bytes) -> str:
    """What decides a Hugging Face tokenizer's ids: its file, the `tokenizers` version that reads it, and the
    encoding settings above (the version is read from the package metadata, without importing it)."""
    state = hashlib.sha256(content)
    state.update(f"\0tokenizers={_library_version()}\0".encode() + ENCODING_SETTINGS)
    return "hf-" + state.hexdigest()[:20]


@functools.cache
def _library_version() -> str:
    return importlib.metadata.version("tokenizers")
