"""Models downloaded with LM Studio.

LM Studio keeps them as ``<models>/<publisher>/<repo>/<file>.gguf`` in
``~/.lmstudio/models`` (older versions: ``~/.cache/lm-studio/models``; a home
moved elsewhere is named by ``~/.lmstudio-home-pointer``).  LM Studio has no
environment variable for the folder; ``$SPECDEC_LMSTUDIO_DIR`` (one or more
folders, separated by ``os.pathsep``) replaces these defaults, e.g. for a
models folder changed in LM Studio's settings.  Names are
``publisher/repo:file.gguf``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, List

from .entry import ModelEntry
from .folders import gguf_files, unreadable_folders
from .shards import group_parts

__all__ = ["default_roots", "scan", "ENV"]

ENV = "SPECDEC_LMSTUDIO_DIR"


def default_roots() -> List[Path]:
    """``$SPECDEC_LMSTUDIO_DIR`` when set, else LM Studio's model folders."""
    explicit = os.environ.get(ENV)
    if explicit is not None:
        return [Path(p).expanduser() for p in explicit.split(os.pathsep) if p]
    home = Path.home()
    roots = []
    try:
        pointed = Path((home / ".lmstudio-home-pointer").read_text(encoding="utf-8").strip())
        if pointed.is_absolute():
            roots.append(pointed / "models")
    except (OSError, ValueError):
        pass
    roots += [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]
    unique: List[Path] = []
    for r in roots:
        if r not in unique:
            unique.append(r)
    return unique


def scan(root: Path) -> Iterator[ModelEntry]:
    """Every GGUF file under ``root``, named ``publisher/repo:file``."""
    unreadable: List[OSError] = []
    for f in group_parts(gguf_files(root, unreadable)):
        parts = f.rel.split("/")
        if len(parts) >= 3:
            group = "/".join(parts[:2])
            name = f"{group}:{'/'.join(parts[2:])}"
        else:
            group, name = "/".join(parts[:-1]), f.rel
        yield ModelEntry(name=name, source="lmstudio", path=f.path, extra_parts=f.extra_parts,
                         group=group, file=Path(f.rel).name, problem=f.problem, root=root)
    yield from unreadable_folders("lmstudio", root, unreadable)
