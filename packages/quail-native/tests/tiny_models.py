"""Tiny random Qwen2, Qwen3 and Gemma 3 checkpoints with a real byte-level BPE, built in-process (seeded)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

WORDS = [
    "the", "film", "movie", "acting", "plot", "story", "music", "ending", "great", "awful", "boring", "superb",
    "loved", "hated", "review", "document", "question", "answer", "task", "with", "one", "of", "positive",
    "negative", "TRUE", "FALSE", "True", "False", "discuss", "mention", "about", "is", "does", "DOCUMENT",
    "QUESTION", "ANSWER", "TASK", "above", "cast", "scene", "director", "pacing", "slow", "fast", "dialogue",
    "score", "funny", "sad",
]


def corpus() -> list[str]:
    lines = []
    for i in range(len(WORDS)):
        lines.append(" ".join(WORDS[(i + k) % len(WORDS)] for k in range(12)))
    lines += ["ANSWER: TRUE", "ANSWER: FALSE", " TRUE", " FALSE", " True", " False", "TRUE", "FALSE"] * 20
    return lines


def train_tokenizer(path: Path, vocab_size: int = 400) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<eos>", "<bos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus(), trainer)
    tokenizer.save(str(path / "tokenizer.json"))
    # what a checkpoint's tokenizer_config.json says of its special tokens (engines that load the tokenizer
    # through transformers, vLLM's structured outputs among them, read the end token from it)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<eos>", "bos_token": "<bos>",
              "pad_token": "<pad>"}
    (path / "tokenizer_config.json").write_text(json.dumps(config))


def build(kind: str, path: Path, *, seed: int = 0, sliding_window: int = 16) -> Path:
    """Save a random `kind` ("qwen2" / "qwen3" / "gemma3") model with its tokenizer into `path`."""
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    path.mkdir(parents=True, exist_ok=True)
    train_tokenizer(path)
    torch.manual_seed(seed)
    common = dict(vocab_size=400, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  intermediate_size=128, bos_token_id=2, eos_token_id=1, pad_token_id=0, max_position_embeddings=4096)
    if kind == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(num_hidden_layers=2, tie_word_embeddings=True, **common))
    elif kind == "qwen2":  # Qwen2's head_dim is hidden / heads; an untied head like the embedded Qwen2.5 files
        qwen2 = {**common, "head_dim": 16}
        model = Qwen2ForCausalLM(Qwen2Config(num_hidden_layers=2, tie_word_embeddings=False, **qwen2))
    else:
        config = Gemma3TextConfig(num_hidden_layers=3, sliding_window=sliding_window, query_pre_attn_scalar=32,
                                  layer_types=["sliding_attention", "sliding_attention", "full_attention"], **common)
        model = Gemma3ForCausalLM(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.normal_(0.0, 0.3)
            elif "embed" in name:
                parameter.normal_(0.0, 1.0)
    model.eval()
    model.save_pretrained(path)
    return path
