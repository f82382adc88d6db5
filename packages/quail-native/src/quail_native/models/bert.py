"""A sentence encoder (a BERT with mean pooling, as sentence-transformers builds all-MiniLM-L6-v2) in plain torch.

The native backend answers AI.EMBED / AI.SIMILARITY (and the embeddings of similarity blocking) with it, and must
not pull in transformers or sentence-transformers to do so: this module reads a sentence-transformers directory
(`config.json`, `model.safetensors`, `tokenizer.json`, `sentence_bert_config.json`, `1_Pooling/config.json`) and
computes the same vectors: [CLS] ids [SEP] through the BERT in float32, the last hidden state averaged over the real
tokens, then L2-normalised. It takes word-piece ids, not text, so the caller's tokenizer (`tokenizers`) stays the one
place that turns text into ids.

Documents are run in batches of similar length (sorted, padded only to the batch's longest, the padding masked
out of attention and pooling), so a long document does not make every short one pay for its padding.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from quail_native.models.projection import Projection

POOLING_MODES = ("pooling_mode_cls_token", "pooling_mode_mean_tokens", "pooling_mode_max_tokens",
                 "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
                 "pooling_mode_lasttoken")
"""The pooling switches sentence-transformers writes; only `pooling_mode_mean_tokens` may be on here."""

CPU_BATCH_TOKENS = 2048
"""The most padded tokens one batch takes even when the caller allows more. Measured on a 2-core CPU (fp32,
prepacked projections): 500 one-sentence texts ran ~15% and 100 texts of ~250 tokens ~40% faster in batches
of 1–2k tokens than of 16k, whose activations (up to 100 MB a tensor) spill out of cache in every elementwise op."""

PADDING_FILL = 0.9
"""A batch takes no document shorter than this fraction of its longest, so at most ~10% of its rows are padding."""


@dataclass(frozen=True)
class BertConfig:
    """The numbers of a BERT encoder that its math needs, read from `config.json`."""

    hidden: int
    layers: int
    heads: int
    intermediate: int
    eps: float
    max_positions: int
    type_vocab: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> BertConfig:
        """Read a Hugging Face BERT config, refusing the variants this encoder does not compute (another
        activation, relative positions) rather than silently computing something else."""
        model_type = data.get("model_type", "bert")
        if model_type != "bert":
            raise ValueError(f"config.json describes a {model_type!r} model, not a BERT")
        activation = data.get("hidden_act", "gelu")
        if activation != "gelu":
            raise ValueError(f"config.json asks for the activation {activation!r}; only the exact 'gelu' is computed")
        positions = data.get("position_embedding_type", "absolute")
        if positions != "absolute":
            raise ValueError(f"config.json asks for {positions!r} position embeddings; only 'absolute' is computed")
        config = cls(
            hidden=_integer(data, "hidden_size"), layers=_integer(data, "num_hidden_layers"),
            heads=_integer(data, "num_attention_heads"), intermediate=_integer(data, "intermediate_size"),
            eps=float(_number(data, "layer_norm_eps")), max_positions=_integer(data, "max_position_embeddings"),
            type_vocab=_integer(data, "type_vocab_size"), vocab=_integer(data, "vocab_size"),
        )
        if config.hidden % config.heads:
            raise ValueError(f"hidden_size {config.hidden} is not a multiple of num_attention_heads {config.heads}")
        return config


@dataclass(frozen=True, eq=False)  # tensors: compared by identity, not elementwise
class _Layer:
    """One encoder layer's weights; query, key and value fused into one projection (one GEMM instead of three).
    The projections are prepacked for oneDNN where it can (`Projection`): about half `F.linear`'s time here."""

    qkv: Projection
    out: Projection
    attention_norm_weight: torch.Tensor
    attention_norm_bias: torch.Tensor
    up: Projection
    down: Projection
    output_norm_weight: torch.Tensor
    output_norm_bias: torch.Tensor


@dataclass(frozen=True, eq=False)  # tensors: compared by identity, not elementwise
class _Weights:
    """The embedding tables and layers of the encoder, float32 on the CPU."""

    word: torch.Tensor
    position: torch.Tensor
    token_type: torch.Tensor
    norm_weight: torch.Tensor
    norm_bias: torch.Tensor
    layers: tuple[_Layer, ...]


@dataclass(frozen=True, eq=False)  # tensors: compared by identity, not elementwise
class SentenceEncoder:
    """all-MiniLM-L6-v2 (or any BERT sentence-transformers directory with mean pooling) as a function from
    word-piece ids to unit vectors, equal to `SentenceTransformer(directory).encode(texts,
    normalize_embeddings=True)` to float32 rounding.

    `max_tokens` counts [CLS] and [SEP]: a document keeps its first `max_tokens - 2` ids, as sentence-transformers
    truncates. `cls_id` and `sep_id` come from the tokenizer's post-processor, the same place `tokenizers` takes
    them from when it adds them itself."""

    config: BertConfig
    weights: _Weights
    max_tokens: int
    cls_id: int
    sep_id: int

    @property
    def dimensions(self) -> int:
        """The length of each embedding (the hidden size: mean pooling keeps it)."""
        return self.config.hidden

    @classmethod
    def load(cls, directory: Path) -> SentenceEncoder:
        """Read a sentence-transformers directory. Raises `ValueError` for a pooling other than mean, a config
        this encoder does not compute, or missing or misshapen weights — never a silently different model."""
        directory = Path(directory)
        config = BertConfig.from_json(_read_json(directory / "config.json"))
        _require_mean_pooling(_read_json(directory / "1_Pooling" / "config.json"), config)
        max_tokens = _integer(_read_json(directory / "sentence_bert_config.json"), "max_seq_length")
        if not 2 <= max_tokens <= config.max_positions:
            raise ValueError(f"max_seq_length {max_tokens} is outside 2…{config.max_positions} "
                             "(the model's max_position_embeddings)")
        cls_id, sep_id = _special_ids(_read_json(directory / "tokenizer.json"))
        for name, token in (("[CLS]", cls_id), ("[SEP]", sep_id)):
            if not 0 <= token < config.vocab:
                raise ValueError(f"the tokenizer's {name} id {token} is outside the vocabulary of {config.vocab}")
        weights = _load_weights(load_file(str(directory / "model.safetensors"), device="cpu"), config)
        return cls(config=config, weights=weights, max_tokens=max_tokens, cls_id=cls_id, sep_id=sep_id)

    def embed(self, documents: Sequence[Sequence[int]], batch_tokens: int = 16384) -> numpy.ndarray:
        """Unit-length float32 embeddings, one row per document in the input order.

        Each document is word-piece ids without special tokens (an empty one is valid); it is cut to
        `max_tokens - 2` ids and framed by [CLS] … [SEP]. A batch holds at most `batch_tokens` tokens
        counting its padding (but always at least one document), which bounds the activations' memory; it
        holds at most `CPU_BATCH_TOKENS` even when `batch_tokens` is larger (larger batches were slower)."""
        if batch_tokens < 1:
            raise ValueError(f"batch_tokens must be positive, not {batch_tokens}")
        sequences = [self._frame(document) for document in documents]
        result = numpy.empty((len(sequences), self.dimensions), dtype=numpy.float32)
        with torch.inference_mode():
            bound = min(batch_tokens, CPU_BATCH_TOKENS)
            for batch in _length_batches([len(sequence) for sequence in sequences], bound, PADDING_FILL):
                result[batch] = self._embed_batch([sequences[index] for index in batch]).numpy()
        return result

    def _frame(self, document: Sequence[int]) -> list[int]:
        """[CLS] + the first max_tokens-2 ids + [SEP], every id checked against the vocabulary (an id out of
        range would otherwise surface as an opaque index error deep inside a batch)."""
        ids = [int(token) for token in document[: self.max_tokens - 2]]
        if ids and not 0 <= min(ids) <= max(ids) < self.config.vocab:
            bad = next(token for token in ids if not 0 <= token < self.config.vocab)
            raise ValueError(f"token id {bad} is outside the vocabulary of {self.config.vocab}")
        return [self.cls_id, *ids, self.sep_id]

    def _embed_batch(self, sequences: list[list[int]]) -> torch.Tensor:
        """Mean-pooled, normalised embeddings of one batch of framed sequences ([batch, hidden])."""
        longest = max(len(sequence) for sequence in sequences)
        ids = torch.zeros((len(sequences), longest), dtype=torch.long)
        real = torch.zeros((len(sequences), longest), dtype=torch.bool)
        for row, sequence in enumerate(sequences):
            ids[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
            real[row, : len(sequence)] = True
        padded = not bool(real.all())
        hidden = self._encode(ids, real if padded else None)
        weights = real.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        return F.normalize(pooled, p=2.0, dim=1)

    def _encode(self, ids: torch.Tensor, real: torch.Tensor | None) -> torch.Tensor:
        """The last hidden state of the BERT ([batch, length, hidden]); `real` masks padded keys (None: none)."""
        weights, config = self.weights, self.config
        length = ids.shape[1]
        hidden = weights.word[ids] + weights.position[:length] + weights.token_type[0]
        hidden = F.layer_norm(hidden, (config.hidden,), weights.norm_weight, weights.norm_bias, config.eps)
        mask = real[:, None, None, :] if real is not None else None
        for layer in weights.layers:
            hidden = self._layer(layer, hidden, mask)
        return hidden

    def _layer(self, layer: _Layer, hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """One post-norm BERT layer: self-attention then the GELU feed-forward, each added back and normalised."""
        config = self.config
        batch, length, _ = hidden.shape
        qkv = layer.qkv(hidden)
        qkv = qkv.view(batch, length, 3, config.heads, config.head_dim).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=mask)
        attended = attended.transpose(1, 2).reshape(batch, length, config.hidden)
        hidden = F.layer_norm(hidden + layer.out(attended), (config.hidden,),
                              layer.attention_norm_weight, layer.attention_norm_bias, config.eps)
        inner = F.gelu(layer.up(hidden), approximate="none")
        return F.layer_norm(hidden + layer.down(inner), (config.hidden,),
                            layer.output_norm_weight, layer.output_norm_bias, config.eps)


def _length_batches(lengths: Sequence[int], batch_tokens: int, fill: float) -> list[list[int]]:
    """Indices grouped into batches of similar length: sorted longest first, so each batch's padded size
    (count × its first length) is known as it grows. A batch is closed before it would exceed `batch_tokens`,
    and before it takes a document shorter than `fill` × its longest: one long document would otherwise make
    hundreds of short ones compute its length in padding."""
    order = sorted(range(len(lengths)), key=lambda index: -lengths[index])
    batches: list[list[int]] = []
    for index in order:
        if batches:
            longest = lengths[batches[-1][0]]
            if (len(batches[-1]) + 1) * longest <= batch_tokens and lengths[index] >= fill * longest:
                batches[-1].append(index)
                continue
        batches.append([index])
    return batches


def _load_weights(tensors: Mapping[str, torch.Tensor], config: BertConfig) -> _Weights:
    """The encoder's weights from a BertModel state dict (with or without the `bert.` prefix), every shape
    checked against the config so a mismatched checkpoint fails here, not as a wrong answer later."""
    tensors = {name.removeprefix("bert."): tensor for name, tensor in tensors.items()}
    hidden, inner = config.hidden, config.intermediate

    def take(name: str, *shape: int) -> torch.Tensor:
        tensor = tensors.get(name)
        if tensor is None:
            raise ValueError(f"model.safetensors has no tensor {name}")
        if tuple(tensor.shape) != shape:
            raise ValueError(f"model.safetensors: {name} has shape {tuple(tensor.shape)}, expected {shape}")
        return tensor.to(torch.float32).contiguous()

    def layer(index: int) -> _Layer:
        prefix = f"encoder.layer.{index}."
        attention = prefix + "attention."
        parts = ("query", "key", "value")
        return _Layer(
            qkv=Projection(torch.cat([take(f"{attention}self.{part}.weight", hidden, hidden) for part in parts]),
                           torch.cat([take(f"{attention}self.{part}.bias", hidden) for part in parts])),
            out=Projection(take(attention + "output.dense.weight", hidden, hidden),
                           take(attention + "output.dense.bias", hidden)),
            attention_norm_weight=take(attention + "output.LayerNorm.weight", hidden),
            attention_norm_bias=take(attention + "output.LayerNorm.bias", hidden),
            up=Projection(take(prefix + "intermediate.dense.weight", inner, hidden),
                          take(prefix + "intermediate.dense.bias", inner)),
            down=Projection(take(prefix + "output.dense.weight", hidden, inner),
                            take(prefix + "output.dense.bias", hidden)),
            output_norm_weight=take(prefix + "output.LayerNorm.weight", hidden),
            output_norm_bias=take(prefix + "output.LayerNorm.bias", hidden),
        )

    return _Weights(
        word=take("embeddings.word_embeddings.weight", config.vocab, hidden),
        position=take("embeddings.position_embeddings.weight", config.max_positions, hidden),
        token_type=take("embeddings.token_type_embeddings.weight", config.type_vocab, hidden),
        norm_weight=take("embeddings.LayerNorm.weight", hidden),
        norm_bias=take("embeddings.LayerNorm.bias", hidden),
        layers=tuple(layer(index) for index in range(config.layers)),
    )


def _require_mean_pooling(pooling: Mapping[str, object], config: BertConfig) -> None:
    """Refuse a pooling other than plain mean: averaging would give vectors unlike the model's own."""
    others = [mode for mode in POOLING_MODES if mode != "pooling_mode_mean_tokens" and pooling.get(mode)]
    if not pooling.get("pooling_mode_mean_tokens") or others:
        enabled = [mode for mode in POOLING_MODES if pooling.get(mode)] or ["none"]
        raise ValueError(f"1_Pooling/config.json enables {', '.join(enabled)}; only mean pooling "
                         "(pooling_mode_mean_tokens alone) is supported")
    dimension = pooling.get("word_embedding_dimension", config.hidden)
    if dimension != config.hidden:
        raise ValueError(f"1_Pooling/config.json pools {dimension} dimensions, the model's hidden size is "
                         f"{config.hidden}")


def _special_ids(tokenizer: Mapping[str, object]) -> tuple[int, int]:
    """[CLS] and [SEP] as the tokenizer's post-processor adds them (TemplateProcessing or BertProcessing)."""
    processor = tokenizer.get("post_processor")
    if not isinstance(processor, dict):
        raise ValueError("tokenizer.json has no post_processor naming [CLS] and [SEP]")
    if processor.get("type") == "BertProcessing":
        return int(processor["cls"][1]), int(processor["sep"][1])
    special = processor.get("special_tokens")
    if not isinstance(special, dict):
        raise ValueError(f"tokenizer.json's post_processor ({processor.get('type')}) has no special_tokens")

    def single(name: str) -> int:
        entry = special.get(name)
        ids = entry.get("ids") if isinstance(entry, dict) else None
        if not isinstance(ids, list) or len(ids) != 1:
            raise ValueError(f"tokenizer.json's post_processor gives no single id for {name}")
        return int(ids[0])

    return single("[CLS]"), single("[SEP]")


def _read_json(path: Path) -> dict[str, object]:
    """A JSON object from `path`; a missing file or another JSON value is a ValueError naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as error:
        raise ValueError(f"{path} is missing") from error
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return data


def _number(data: Mapping[str, object], key: str) -> float | int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"config value {key!r} is {value!r}, not a number")
    return value


def _integer(data: Mapping[str, object], key: str) -> int:
    value = _number(data, key)
    if not isinstance(value, int):
        raise ValueError(f"config value {key!r} is {value!r}, not an integer")
    return value
