"""Side-by-side: the packed executor vs one plain transformers forward per (document, predicate).

    python -m quail_native.benchmark.naive_filters [--reviews 64] [--chunk-tokens N]

Both evaluate the same canonical prompts with the same weights; the ratio lines compare them in
one run, so the machine's speed cancels out.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import torch

import quail
from quail.extend import AiFilter, answer_tokens, datasets

FILTER_SQL = """SELECT r.id FROM reviews r
WHERE AI_FILTER(PROMPT('Is this movie review positive? {0}', r.body), {'selectivity': 0.45})
  AND AI_FILTER(PROMPT('Would the reviewer recommend this movie to a friend? {0}', r.body), {'selectivity': 0.5})"""


@dataclass(frozen=True)
class Measured:
    seconds: float
    tokens: int
    margins: dict[tuple[int, int], float]

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def run_native(session: quail.Session) -> tuple[Measured, list[tuple[int, int, tuple[int, ...]]]]:
    query = session.sql(FILTER_SQL)
    query.run()  # warm: model loaded, preamble cached
    started = time.perf_counter()
    result = query.run()
    seconds = time.perf_counter() - started
    table = result.answer_tables["filter_r"]
    margins = {(r, p): m for r, p, m in zip(table.column("r").to_pylist(), table.column("predicate").to_pylist(),
                                           table.column("margin").to_pylist(), strict=True)}
    node = query.plan().graph.node("filter_r")
    texts = datasets.reviews().column("body").to_pylist()
    assert session.tokenizer is not None and isinstance(node, AiFilter)
    stages = {s.predicate.position: k for k, s in enumerate(node.stages)}
    prompts = [(row, position, node.prompt(tuple(session.tokenizer.encode(texts[row])), stages[position]))
               for row, position in margins]
    fresh = result.report["fresh_tokens"]
    return Measured(seconds, int(fresh) if isinstance(fresh, int) else 0, margins), prompts


def run_naive(directory: str, prompts: list[tuple[int, int, tuple[int, ...]]], true_ids: tuple[int, ...],
              false_ids: tuple[int, ...]) -> Measured:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    model.eval()
    margins: dict[tuple[int, int], float] = {}
    tokens = 0
    started = time.perf_counter()
    with torch.inference_mode():
        for row, position, ids in prompts:
            logits = model(torch.tensor([ids]), logits_to_keep=1).logits[0, -1]
            margins[(row, position)] = (logits[list(true_ids)].max() - logits[list(false_ids)].max()).item()
            tokens += len(ids)
    return Measured(time.perf_counter() - started, tokens, margins)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reviews", type=int, default=64)
    parser.add_argument("--chunk-tokens", type=int, default=quail.EngineConfig.chunk_tokens)
    args = parser.parse_args()
    from quail_native.models.embedded import embedded_model_dir

    config = quail.EngineConfig(chunk_tokens=args.chunk_tokens)
    directory = embedded_model_dir(config.model)
    with quail.Session(config) as session:
        session.register("reviews", quail.DocumentProvider.from_table(datasets.reviews().slice(0, args.reviews), "id"))
        native, prompts = run_native(session)
        assert session.tokenizer is not None
        tokens = answer_tokens(session.tokenizer)
    naive = run_naive(str(directory), prompts, tokens.true_ids, tokens.false_ids)
    worst = max(abs(native.margins[k] - naive.margins[k]) for k in native.margins)
    agree = sum((native.margins[k] > 0) == (naive.margins[k] > 0) for k in native.margins) / len(native.margins)
    print(f"evaluations: {len(prompts)} (document, predicate) over {args.reviews} reviews")
    print(f"naive transformers: {naive.seconds:.2f} s, {naive.tokens} prompt tokens, "
          f"{naive.tokens_per_second:.0f} prompt tokens/s")
    print(f"native executor:    {native.seconds:.2f} s, {native.tokens} fresh tokens, "
          f"{native.tokens_per_second:.0f} fresh tokens/s")
    print(f"agreement: {agree:.1%} of answers; worst |margin difference| {worst:.2e}")
    print(f"ratio native/naive wall: {native.seconds / naive.seconds:.3f} "
          f"(speed-up {naive.seconds / native.seconds:.2f}x)")
    print(f"ratio tokens/s native/naive: {native.tokens_per_second / naive.tokens_per_second:.2f}")


if __name__ == "__main__":
    main()
