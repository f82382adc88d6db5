"""Tiny checkpoints the exactness tests can trust, and the naive reference they are compared with.

`tiny_models.build` gives random Qwen3 / Gemma 3 checkpoints whose answer barely depends on the
document (the residual stream at the answer cue is its own embedding; Qwen3's margin varies by
< 0.01 across documents), so a wrong document KV could still pass a 1e-4 margin check. Before the
tests use them, `sharpen` redraws every projection at unit gain and sharpens QK-norm, so each
token of the prompt moves the answer, and `center` removes the document-independent part of the
TRUE − FALSE margin through the final norm's scale (the head only, never the input embeddings),
so answers are a mix of TRUE and FALSE. Both are seeded: the checkpoints are the same every run.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import tiny_models
import torch

import quail
from quail.data.tokenizer import HuggingFaceTokenizer
from quail.logical.expressions import ColumnRef, Prompt
from quail.prompts import (
    BASE_STYLE,
    answer_tokens,
    filter_tail,
    join_frame,
    partner_label,
    preamble_ids,
)

WINDOW = 16  # Gemma 3's sliding window: every test document is longer
SHARPEN_SEEDS = {"qwen2": 2, "qwen3": 0, "gemma3": 2}  # picked so filter and join answers are mixed TRUE / FALSE
LAYERS = {"qwen2": 2, "qwen3": 2, "gemma3": 3}
HEAD_DIMS = {"qwen2": 16, "qwen3": 32, "gemma3": 32}
QK_GAINS = {"qwen2": 3.0}


@dataclass(frozen=True)
class TinyModel:
    kind: str
    path: Path
    spec: quail.ModelSpec


def model_spec(kind: str, path: Path) -> quail.ModelSpec:
    gemma = kind == "gemma3"
    return quail.ModelSpec(
        name=f"tiny-{kind}", architecture=kind, layers=LAYERS[kind], hidden=64, heads=4, kv_heads=2,
        head_dim=HEAD_DIMS[kind], tied_embeddings=kind != "qwen2",
        ffn=128, vocab=400, context_length=4096, weight_bytes=4.0, kv_bytes=4.0,
        sliding_window=WINDOW if gemma else None, global_every=3 if gemma else None, source=str(path),
    )


def sharpen(model: torch.nn.Module, seed: int, gemma: bool, qk_gain: float = 1.0) -> None:
    """Unit-gain projections; QK-norm scale ~2 for Qwen3 and (1 + w) ~1 for Gemma 3, so attention is not flat;
    Qwen2 (no QK-norm) gets its sharpness from `qk_gain` on the q and k projections instead, and its q / k / v
    biases drawn at 0.3 and its layer norms at unit gain, so a wrong bias (or none) changes every answer."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() == 2 and "embed" not in name:
                gain = qk_gain if name.endswith(("q_proj.weight", "k_proj.weight")) else 1.0
                unit = torch.randn(parameter.shape, generator=generator) / math.sqrt(parameter.shape[1])
                parameter.copy_(unit * gain)
            elif name.endswith("proj.bias"):
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
            elif qk_gain != 1.0 and name.endswith("layernorm.weight"):
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3 + 1.0)
            elif "q_norm" in name or "k_norm" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3 + (0.0 if gemma else 2.0))


def calibration_prompts(tokenizer: HuggingFaceTokenizer) -> list[list[int]]:
    """Filter and join prompts in the canonical layout over random sentences of the tokenizer's words."""
    rng = random.Random(0)
    docs = [tokenizer.encode(" ".join(rng.choice(tiny_models.WORDS) for _ in range(rng.randint(6, 14))))
            for _ in range(24)]
    body, aspect = ColumnRef("r", "body"), ColumnRef("a", "aspect")
    preamble = list(preamble_ids(tokenizer, BASE_STYLE))
    tails = [tokenizer.encode(filter_tail(Prompt(q, (body,)))) for q in
             ("Is {0} about the story?", "Does {0} mention the cast?", "Is {0} positive?")]
    frame = tokenizer.encode(join_frame(Prompt("Does {0} discuss {1}?", (body, aspect)), "r"))
    label, cue = tokenizer.encode(partner_label(1)), tokenizer.encode(BASE_STYLE.cue)
    prompts = [preamble + d + tails[i % 3] for i, d in enumerate(docs)]
    prompts += [preamble + d + frame + label + docs[(i + 5) % 24][:4] + cue for i, d in enumerate(docs)]
    return prompts


def center(model: torch.nn.Module, prompts: Sequence[Sequence[int]], true_ids: Sequence[int],
           false_ids: Sequence[int], gemma: bool, rounds: int = 3) -> None:
    """Make the mean TRUE − FALSE margin over `prompts` ~0 by projecting the final norm's scale."""
    norm = model.model.norm
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
    head = model.get_output_embeddings().weight
    captured: list[torch.Tensor] = []
    hook = norm.register_forward_hook(lambda _m, args, _o: captured.append(args[0][0, -1].detach()))
    try:
        for _ in range(rounds):
            rows = []
            for ids in prompts:
                captured.clear()
                with torch.no_grad():
                    logits = model(torch.tensor([list(ids)])).logits[0, -1]
                x = captured[0]
                normed = x * torch.rsqrt(x.pow(2).mean() + eps)
                t = true_ids[int(logits[list(true_ids)].argmax())]
                f = false_ids[int(logits[list(false_ids)].argmax())]
                rows.append(normed * (head[t] - head[f]))
            u = torch.stack(rows).mean(0)
            with torch.no_grad():
                scale = norm.weight + (1.0 if gemma else 0.0)
                scale = scale - (scale @ u) / (u @ u) * u
                norm.weight.copy_(scale - (1.0 if gemma else 0.0))
    finally:
        hook.remove()


def build_tiny_model(kind: str, path: Path) -> TinyModel:
    from transformers import AutoModelForCausalLM

    tiny_models.build(kind, path, sliding_window=WINDOW)
    gemma = kind == "gemma3"
    tokenizer = HuggingFaceTokenizer(path / "tokenizer.json", 2 if gemma else None)
    answers = answer_tokens(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    sharpen(model, SHARPEN_SEEDS[kind], gemma, QK_GAINS.get(kind, 1.0))
    center(model, calibration_prompts(tokenizer), answers.true_ids, answers.false_ids, gemma)
    model.save_pretrained(path)
    return TinyModel(kind, path, model_spec(kind, path))


class NaiveModel:
    """The reference: Hugging Face transformers (eager attention, fp32), one plain forward per full prompt."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                          attn_implementation="eager").eval()
        self._tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        answers = answer_tokens(HuggingFaceTokenizer(path / "tokenizer.json", None))
        self.true_ids, self.false_ids = list(answers.true_ids), list(answers.false_ids)
        self._logits: dict[tuple[int, ...], torch.Tensor] = {}

    def encode(self, text: str) -> tuple[int, ...]:
        """A document's ids, tokenized independently of the engine's token store."""
        return tuple(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of a layout's ids, control tokens spelled out."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)

    def logits(self, ids: Sequence[int]) -> torch.Tensor:
        """Logits at every position of `ids` ([len, vocab]): one forward, cached by prompt."""
        key = tuple(ids)
        found = self._logits.get(key)
        if found is None:
            with torch.no_grad():
                found = self._logits[key] = self.model(torch.tensor([list(key)])).logits[0].float()
        return found

    def margin(self, ids: Sequence[int]) -> float:
        """max TRUE-like − max FALSE-like logit at the last position."""
        last = self.logits(ids)[-1]
        return float(last[self.true_ids].max() - last[self.false_ids].max())

    def label_log_prob(self, prompt: Sequence[int], label: Sequence[int]) -> float:
        """Σ_j log p(label[j] | prompt + label[:j]) from one forward of prompt + label."""
        rows = torch.log_softmax(self.logits(tuple(prompt) + tuple(label)), dim=-1)
        start = len(prompt) - 1
        return float(sum(rows[start + j, token] for j, token in enumerate(label)))

    def greedy(self, prompt: Sequence[int], max_tokens: int, stop: Sequence[int]) -> tuple[list[int], str]:
        """transformers' greedy `generate` from the prompt's ids: the tokens before the first stop token (and how
        it ended: `stop` or `length`)."""
        with torch.no_grad():
            output = self.model.generate(torch.tensor([list(prompt)]), attention_mask=torch.ones(1, len(prompt),
                                         dtype=torch.long), max_new_tokens=max_tokens, do_sample=False,
                                         eos_token_id=list(stop), pad_token_id=stop[0])
        written = output[0, len(prompt):].tolist()
        for index, token in enumerate(written):
            if token in stop:
                return written[:index], "stop"
        return written, "length"

    def gap(self, ids: Sequence[int]) -> float:
        """The logit gap between the best and the second-best next token after `ids`: a near tie under 1e-3."""
        top = self.logits(ids)[-1].topk(2).values
        return float(top[0] - top[1])
