"""Skipped and truncated documents on a request backend (vLLM's adapter over a fake engine).

The fake answers only the exact prompts it was taught, so a skipped document sent anyway, or a
truncated one sent whole, is a KeyError; every other document must get the keyword rule's answer.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="the fake speaks vLLM's own output types: install quail-vllm[cpu]")

import pyarrow as pa
from support.request_helpers import TOKENIZER
from test_request_backends import Fake

import quail
from quail import DocumentProvider, EngineConfig
from quail.physical import nodes as ph
from quail.requests import RequestStrategy
from quail.testing import BASE_MODEL
from quail.testing.rules import predicate_margin
from quail_vllm.backend import PIPELINED, VLLMBackend

LONG = "the acting and the plot " + "word " * 1_000  # its first tokens hold both keywords
BODIES = ["the acting carries the plot", "a plot with holes", LONG, "plot twists and fine acting"]
REVIEWS = pa.table({"id": [10, 11, 12, 13], "body": BODIES})
FILTERS = ("SELECT r.id FROM longreviews r WHERE AI_FILTER(PROMPT('Does {0} mention \"acting\"?', r.body)) "
           "AND AI_FILTER(PROMPT('Is {0} about the \"plot\"?', r.body))")
STRATEGIES = {"pipelined": PIPELINED, "operator": RequestStrategy("operator", "suffix_major")}


def teach(fake: Fake, query, documents: list[tuple[int, ...]]) -> None:
    """The fake learns the prompts of exactly these documents, nothing else."""
    for step in (n for n in query.plan().graph.nodes if n.is_model_node):
        assert isinstance(step, ph.AiFilter)
        for k, stage in enumerate(step.stages):
            for ids in documents:
                prompt = step.prompt(ids, k)
                fake.margins[prompt] = predicate_margin(stage.predicate.prompt.template, [TOKENIZER.decode(ids)])


@pytest.mark.parametrize(("policy", "expected"), [("skip", [10, 13]), ("truncate", [10, 12, 13])])
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_request_backend_answers_every_other_document_and_never_sends_a_skipped_one(policy, expected, strategy):
    fake = Fake(capacity=1 << 20)
    registry = quail.ExtensionRegistry.with_built_ins()
    registry.register_backend(VLLMBackend("fake_vllm", STRATEGIES[strategy], boot=fake.boot))
    config = EngineConfig(model=BASE_MODEL, backend="fake_vllm", calibration="off", chunk_tokens=512,
                          oversized_documents=policy)
    with quail.Session(config, registry=registry, tokenizer=TOKENIZER) as session:
        session.register("longreviews", DocumentProvider.from_table(REVIEWS, "id"))
        query = session.sql(FILTERS)
        prepared = query.prepared()
        oversized, tokens = prepared.oversized, prepared.tokens
        assert oversized.counts() == {"r": 1}
        documents = [tuple(TOKENIZER.encode(b)) for i, b in enumerate(BODIES) if i != 2]
        if policy == "truncate":
            documents.append(tuple(tokens["r"].row(2)))
            assert len(documents[-1]) == oversized.limits["r"] < len(TOKENIZER.encode(LONG))
        teach(fake, query, documents)
        assert sorted(row["id"] for row in query.run().to_rows()) == expected
