"""The keyword rule: a deterministic stand-in for a model's TRUE/FALSE margin.

* A prompt with "double-quoted" words: margin = hits − keywords + 0.5 (TRUE iff every keyword
  appears in the documents).
* Otherwise, over two or more documents: margin = shared words − 0.5 (TRUE iff they share a word).
* Otherwise: a hash of the template and the document, spread over [−2, 2).
Words are lower-case runs of three or more letters. A generation is the document's first sentence
(`generated_text`); a structured one fills each field from the document by its type (`generated_value`). An
embedding is the document's words hashed into a unit vector (`embedded_vector`): texts sharing words are similar.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Sequence

WORD = re.compile(r"[a-z]{3,}")
QUOTED = re.compile(r'"([^"]*)"')


def words(text: str) -> set[str]:
    return set(WORD.findall(text.lower()))


def keywords(template: str) -> set[str]:
    found: set[str] = set()
    for phrase in QUOTED.findall(template):
        found |= words(phrase)
    return found


def predicate_margin(template: str, documents: Sequence[str]) -> float:
    """`documents` in placeholder order ({0}, {1}, ...)."""
    wanted = keywords(template)
    if wanted:
        present = words(" ".join(documents))
        return len(wanted & present) - len(wanted) + 0.5
    if len(documents) > 1:
        shared = words(documents[0])
        for document in documents[1:]:
            shared &= words(document)
        return len(shared) - 0.5
    digest = hashlib.blake2b(f"{template}\x00{documents[0]}".encode(), digest_size=2).digest()
    return int.from_bytes(digest, "big") / 65536 * 4 - 2


def classify_margins(labels: Sequence[str], document: str) -> list[float]:
    """Each label's score: how often its words occur in the document."""
    text = document.lower()
    return [float(sum(text.count(w) for w in words(label) or {label.lower()})) for label in labels]


SENTENCE_END = re.compile(r"(?<=[.!?])\s")


def generated_text(document: str) -> str:
    """What the keyword backend "generates" after any instruction: the document's first sentence, as written."""
    return SENTENCE_END.split(document.strip(), maxsplit=1)[0]


def generated_value(kind: str, document: str) -> object:
    """A scalar field's value: text the first sentence, an integer the number of words, a number a tenth of it, a
    boolean whether it says "great" (lists and objects are filled field by field, `KeywordExecution.generated`)."""
    found = WORD.findall(document.lower())
    if kind == "int":
        return len(found)
    if kind == "double":
        return len(found) / 10
    if kind == "bool":
        return "great" in found
    return generated_text(document)


def embedded_vector(document: str, dimensions: int) -> list[float]:
    """A unit vector of `dimensions` numbers: one count per word at its hashed position, normalised (a text without
    words is the first axis), in float32 as an encoder's are."""
    counts = [0.0] * dimensions
    for word in WORD.findall(document.lower()):
        digest = hashlib.blake2b(word.encode(), digest_size=4).digest()
        counts[int.from_bytes(digest, "big") % dimensions] += 1.0
    norm = sum(c * c for c in counts) ** 0.5
    if norm == 0:
        counts[0], norm = 1.0, 1.0
    return [float(struct.unpack("f", struct.pack("f", c / norm))[0]) for c in counts]
