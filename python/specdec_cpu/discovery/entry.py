"""A model found on this machine: how it is named, where it is, whether it can be used."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Tuple

__all__ = ["ModelEntry", "SOURCES", "SOURCE_TITLES"]

#: Where models are found, in the order they are listed (and win duplicates).
SOURCES = ("ollama", "hf", "lmstudio", "dir", "demo")
SOURCE_TITLES = {"ollama": "ollama", "hf": "Hugging Face cache", "lmstudio": "LM Studio",
                 "dir": "model folder", "demo": "demo pair", "file": "file"}


@dataclass(frozen=True)
class ModelEntry:
    """One model found in a store.

    ``name`` is how the user names it (``qwen2.5-coder:7b``,
    ``org/repo:file.gguf``, ...); ``group`` the model or repository it belongs
    to (``qwen2.5-coder``, ``org/repo``), ``file`` the file's own name where
    it means something (not for ollama's content-addressed blobs).
    ``problem`` says why it cannot be used (a missing blob, a corrupt
    manifest, a missing part); such entries are listed but never loaded.
    """

    name: str
    source: str
    path: Path
    extra_parts: Tuple[Path, ...] = ()
    group: str = ""
    file: str = ""
    aliases: Tuple[str, ...] = ()
    problem: Optional[str] = None
    root: Optional[Path] = field(default=None, compare=False)

    @property
    def qualified(self) -> str:
        """``source:name``: unique across stores."""
        return f"{self.source}:{self.name}"

    @property
    def parts(self) -> Tuple[Path, ...]:
        return (self.path, *self.extra_parts)

    def size(self) -> Optional[int]:
        """Bytes of all parts, or None when one cannot be read."""
        try:
            return sum(os.stat(p).st_size for p in self.parts)
        except OSError:
            return None

    def real_path(self) -> str:
        return os.path.realpath(self.path)
