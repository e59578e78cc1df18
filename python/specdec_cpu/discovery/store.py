"""What discovery knows of one GGUF file, cached on disk.

Reading a header takes a second or more for a large vocabulary, so the
metadata (:class:`ModelInfo`) and the vocabulary fingerprint are kept under
``<cache>/model-info/``, keyed by the file's real path, size and modification
time (of every part of a split file): a changed or replaced file is read
again.  The cache is an optimisation only; it is rebuilt when unreadable.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..errors import ModelLoadError
from ..paths import atomic_path, cache_dir
from .fingerprint import VocabPrint, make_print
from .gguf_info import GGUFInfo, read_error, read_gguf

__all__ = ["ModelInfo", "describe", "vocabulary", "is_cached", "info_dir"]

_VERSION = 1


@dataclass(frozen=True)
class ModelInfo:
    """One model file: where, how big (all parts), its metadata and vocabulary digest."""

    path: str
    size: int
    meta: GGUFInfo
    vocab_digest: Optional[str]

    def to_dict(self) -> dict:
        return {"path": self.path, "size": self.size, "vocab_digest": self.vocab_digest,
                **dataclasses.asdict(self.meta)}


def info_dir() -> Path:
    """``<cache>/model-info``."""
    return cache_dir() / "model-info"


def _parts(path: Path, extra: Sequence[Path]) -> list:
    return [Path(path), *(Path(p) for p in extra)]


def _key(parts: Sequence[Path]) -> "tuple[str, int]":
    h = hashlib.sha256(f"v{_VERSION}".encode())
    size = 0
    for p in parts:
        try:
            st = os.stat(p)
        except OSError as exc:
            raise read_error(p, exc) from None
        size += st.st_size
        h.update(f"|{os.path.realpath(p)}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:32], size


def is_cached(path: Path, extra_parts: Sequence[Path] = ()) -> bool:
    """True when :func:`describe` will not need to read the file."""
    try:
        key, _ = _key(_parts(path, extra_parts))
    except ModelLoadError:
        return False
    try:
        return (info_dir() / f"{key}.json").is_file() and (info_dir() / f"{key}.npy").is_file()
    except OSError:  # an unreadable cache is no cache
        return False


def _load(key: str, path: Path, size: int) -> Optional[ModelInfo]:
    try:
        data = json.loads((info_dir() / f"{key}.json").read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("version") != _VERSION:
            return None
        meta = GGUFInfo(**data["meta"])
        return ModelInfo(str(path), size, meta, data.get("vocab_digest"))
    except (OSError, ValueError, TypeError, KeyError):  # a damaged entry is read again from the file
        return None


def _save(key: str, info: ModelInfo, vocab: Optional[VocabPrint]) -> None:
    try:
        directory = info_dir()
        directory.mkdir(parents=True, exist_ok=True)
        with atomic_path(directory / f"{key}.npy", suffix=".npy") as tmp:
            np.save(tmp, vocab.hashes if vocab is not None else np.empty(0, dtype="<u8"))
        with atomic_path(directory / f"{key}.json") as tmp:
            Path(tmp).write_text(json.dumps({"version": _VERSION, "vocab_digest": info.vocab_digest,
                                             "meta": dataclasses.asdict(info.meta)}), encoding="utf-8")
    except OSError:  # a read-only cache only costs the next run a re-read
        pass


def _read(path: Path, parts: Sequence[Path], key: str, size: int) -> "tuple[ModelInfo, Optional[VocabPrint]]":
    contents = read_gguf(path, parts[1:])
    meta = contents.info
    vocab = None
    if meta.n_vocab:
        vocab = make_print(meta.vocab_type, meta.bos, meta.eos, contents.token_texts)
    info = ModelInfo(str(path), size, meta, vocab.digest if vocab is not None else None)
    _save(key, info, vocab)
    return info, vocab


def describe(path: Path, extra_parts: Sequence[Path] = ()) -> ModelInfo:
    """The metadata of ``path`` (the first part of a split file, the others in
    ``extra_parts``): from the cache, else read from the file and cached.

    Raises ModelLoadError naming the file when it is not a readable GGUF file.
    """
    parts = _parts(path, extra_parts)
    key, size = _key(parts)
    cached = _load(key, Path(path), size)
    if cached is not None:
        return cached
    return _read(Path(path), parts, key, size)[0]


def vocabulary(path: Path, extra_parts: Sequence[Path] = ()) -> Optional[VocabPrint]:
    """The vocabulary fingerprint of ``path`` (None for a file without a
    vocabulary); cached like :func:`describe`."""
    parts = _parts(path, extra_parts)
    key, size = _key(parts)
    info = _load(key, Path(path), size)
    if info is not None:
        if info.vocab_digest is None:
            return None
        try:
            hashes = np.load(info_dir() / f"{key}.npy", allow_pickle=False)
            vocab = make_print(info.meta.vocab_type, info.meta.bos, info.meta.eos, hashes)
            if vocab.digest == info.vocab_digest:
                return vocab
        except (OSError, ValueError, EOFError):  # a damaged entry (an empty .npy: EOFError) is read again
            pass
    return _read(Path(path), parts, key, size)[1]
