"""ByteTokenizer: one token per UTF-8 byte; exact round trips, no vocabulary files."""

from __future__ import annotations

from collections.abc import Sequence

OFFSET = 3
BOS = 1
EOS = 2
CONTROL = {"<bos>": BOS, "<eos>": EOS}


class ByteTokenizer:
    identity = "quail-bytes-v1"
    bos_id = BOS

    def encode(self, text: str) -> list[int]:
        return [b + OFFSET for b in text.encode("utf-8")]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i - OFFSET for i in ids if i >= OFFSET).decode("utf-8", errors="replace")

    def token_id(self, token: str) -> int | None:
        if token in CONTROL:
            return CONTROL[token]
        encoded = token.encode("utf-8")
        return encoded[0] + OFFSET if len(encoded) == 1 else None
