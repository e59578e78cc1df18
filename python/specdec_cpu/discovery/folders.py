"""Folders of GGUF files the user names: ``--model-dir DIR`` (repeatable) and
``$SPECDEC_MODEL_DIRS`` (folders separated by ``os.pathsep``).

Each folder is searched recursively (hidden folders and symbolic links to
folders are skipped); a model is named by its path relative to the folder
(``model.gguf``, ``qwen/model-q4_k_m.gguf``).  Vision projector files
(``mmproj*.gguf``) are not language models and are left out, here and in
every other store.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple, Union

from .entry import ModelEntry
from .shards import group_parts

__all__ = ["configured_dirs", "gguf_files", "unreadable_folders", "scan", "ENV"]

ENV = "SPECDEC_MODEL_DIRS"


def configured_dirs(extra: Sequence[Union[str, "os.PathLike[str]"]] = ()) -> List[Path]:
    """``extra`` (e.g. from ``--model-dir``), then ``$SPECDEC_MODEL_DIRS``."""
    dirs = [_expanded(os.fspath(d)) for d in extra]
    dirs += [_expanded(p) for p in os.environ.get(ENV, "").split(os.pathsep) if p]
    unique: List[Path] = []
    for d in dirs:
        if d not in unique:
            unique.append(d)
    return unique


def _expanded(text: str) -> Path:
    """``~`` expanded; a ``~user`` of no user on this machine stays as it is (an absent folder)."""
    try:
        return Path(text).expanduser()
    except RuntimeError:
        return Path(text)


def gguf_files(root: Path, unreadable: Optional[List[OSError]] = None) -> List[Tuple[str, Path]]:
    """``(path relative to root, path)`` of every GGUF file under ``root``.

    A folder that cannot be listed (no permission) is skipped; its error is
    appended to ``unreadable`` when given, so the caller can say so."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=None if unreadable is None else unreadable.append):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for f in sorted(filenames):
            low = f.lower()
            if low.endswith(".gguf") and not low.startswith(("mmproj", ".")):
                path = Path(dirpath) / f
                found.append((path.relative_to(root).as_posix(), path))
    return found


def unreadable_folders(source: str, root: Path, errors: Sequence[OSError]) -> Iterator[ModelEntry]:
    """One unusable entry per folder under ``root`` that could not be listed:
    the models in it are not found, and ``specdec-cpu models`` says why."""
    for exc in errors:
        path = Path(exc.filename) if exc.filename else root
        rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
        yield ModelEntry(name=f"{rel}/", source=source, path=path, root=root,
                         problem=f"cannot read folder {path}: {exc.strerror or exc}")


def scan(root: Path) -> Iterator[ModelEntry]:
    """Every GGUF file under ``root``, named by its relative path."""
    unreadable: List[OSError] = []
    for f in group_parts(gguf_files(root, unreadable)):
        parent = f.rel.rsplit("/", 1)[0] if "/" in f.rel else ""
        yield ModelEntry(name=f.rel, source="dir", path=f.path, extra_parts=f.extra_parts,
                         group=parent, file=Path(f.rel).name, problem=f.problem, root=root)
    yield from unreadable_folders("dir", root, unreadable)
