"""What a GGUF file says about itself, read without loading it: the header
check every load starts with, and the metadata keys this project writes (a
draft cut to part of its vocabulary records which source id each of its
tokens is, as runs of consecutive ids: ``start+length,...``).

Shared by the loader (weights.py) and the vocabulary cut (vocab_cut.py),
so neither needs the other.
"""

from __future__ import annotations

import os
import struct
from typing import Union

import numpy as np

from ..errors import ModelLoadError

__all__ = ["GGUF_MAGIC", "SOURCE_IDS_KEY", "SOURCE_N_VOCAB_KEY", "STAND_IN_KEY", "check_gguf_file",
           "format_runs", "parse_runs"]

SOURCE_IDS_KEY = "specdec.source_token_ids"
SOURCE_N_VOCAB_KEY = "specdec.source_n_vocab"
STAND_IN_KEY = "specdec.stand_in"

GGUF_MAGIC = b"GGUF"
_HEADER = struct.Struct("<4sIQQ")  # magic, version, n_tensors, n_kv


def check_gguf_file(path: Union[str, "os.PathLike[str]"]) -> str:
    """Validate that ``path`` looks like a GGUF file; return it as a str.

    Raises ModelLoadError naming the path and what is wrong (missing, a
    directory, unreadable, empty, not GGUF, header cut short).
    """
    try:
        spath = os.fspath(path)
    except TypeError:
        raise TypeError(f"model path must be a str or os.PathLike, got {path!r}") from None
    if isinstance(spath, bytes):
        spath = os.fsdecode(spath)
    if not os.path.exists(spath):
        if os.path.islink(spath):
            raise ModelLoadError(f"model file is a broken link: {spath} -> {os.readlink(spath)}")
        raise ModelLoadError(f"model file not found: {spath}")
    if os.path.isdir(spath):
        raise ModelLoadError(f"model path is a directory, not a GGUF file: {spath}")
    if not os.path.isfile(spath):  # a FIFO or a device: llama.cpp would block reading it
        raise ModelLoadError(f"model path is not a regular file: {spath}")
    try:
        size = os.path.getsize(spath)
        with open(spath, "rb") as fh:
            head = fh.read(_HEADER.size)
    except OSError as exc:
        raise ModelLoadError(f"cannot read model file {spath}: {exc.strerror or exc}") from exc
    if size == 0:
        raise ModelLoadError(f"model file is empty (0 bytes): {spath}")
    if not head.startswith(GGUF_MAGIC):
        raise ModelLoadError(
            f"not a GGUF file (starts with {head[:4]!r}, expected {GGUF_MAGIC!r}): {spath}"
        )
    if len(head) < _HEADER.size:
        raise ModelLoadError(f"GGUF file is truncated ({size} bytes, header incomplete): {spath}")
    _, version, _, _ = _HEADER.unpack(head)
    if version not in (2, 3):
        raise ModelLoadError(f"unsupported GGUF version {version} (expected 2 or 3): {spath}")
    return spath


def format_runs(ids: np.ndarray) -> str:
    """``ids`` (increasing) as runs of consecutive ids: ``start+length,...``."""
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    return ",".join(f"{int(r[0])}+{len(r)}" for r in np.split(ids, breaks))


def parse_runs(text: str) -> np.ndarray:
    """The ids of a ``start+length,...`` string (see the module docstring)."""
    try:
        parts = [tuple(int(x) for x in run.split("+")) for run in text.split(",")]
        return np.concatenate([np.arange(start, start + n, dtype=np.int64) for start, n in parts])
    except ValueError as exc:
        raise ValueError(f"malformed {SOURCE_IDS_KEY} value {text[:60]!r}: {exc}") from None
