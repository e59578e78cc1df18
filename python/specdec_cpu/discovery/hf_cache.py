"""Models in the Hugging Face hub cache (what ``huggingface_hub`` and
``specdec-cpu pull`` download).

The cache is ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``::

    models--<org>--<repo>/refs/main                  the current revision's hash
    models--<org>--<repo>/snapshots/<rev>/<file>     symlinks into ../../blobs/

Every ``.gguf`` file of every snapshot is listed once, preferring the
revision ``refs/main`` names, then the newest snapshot.  Names are
``org/repo:file.gguf`` (the file's path inside the repository).  A link whose
blob is missing (a download in progress or deleted) is listed as unusable.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, List, Optional

from .entry import ModelEntry
from .shards import group_parts

__all__ = ["default_root", "scan"]


def default_root() -> Path:
    """Where ``huggingface_hub`` keeps its cache, by the same variables."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def _snapshots(repo_dir: Path) -> List[Path]:
    snaps = repo_dir / "snapshots"
    try:
        found = [d for d in snaps.iterdir() if d.is_dir()]
    except OSError:
        return []
    try:
        main = (repo_dir / "refs" / "main").read_text(encoding="utf-8").strip()
    except OSError:
        main = ""

    def order(d: Path) -> "tuple[int, float]":
        try:
            mtime = d.stat().st_mtime
        except OSError:
            mtime = 0.0
        return (0 if d.name == main else 1, -mtime)

    return sorted(found, key=order)


def _gguf_links(snapshot: Path) -> Iterator["tuple[str, Path]"]:
    for dirpath, dirnames, filenames in os.walk(snapshot):
        dirnames.sort()
        for f in sorted(filenames):
            if f.lower().endswith(".gguf") and not f.lower().startswith("mmproj"):
                path = Path(dirpath) / f
                yield path.relative_to(snapshot).as_posix(), path


def _blob_problem(link: Path) -> Optional[str]:
    """Why the file behind a snapshot's link cannot be used, if it cannot."""
    try:
        if link.is_file():
            return None
    except OSError as exc:  # e.g. a repository whose blobs this user may not read
        return f"cannot read {link}: {exc.strerror or exc}"
    return f"not fully downloaded: {link} points to a missing blob"


def scan(root: Path) -> Iterator[ModelEntry]:
    """Every GGUF file of every model repository in the cache at ``root``."""
    try:
        repos = sorted(d for d in root.iterdir() if d.name.startswith("models--") and d.is_dir())
    except OSError:
        return
    for repo_dir in repos:
        repo_id = "/".join(repo_dir.name.split("--")[1:])
        seen: set[str] = set()
        for snapshot in _snapshots(repo_dir):
            links = [(rel, path) for rel, path in _gguf_links(snapshot) if rel not in seen]
            seen.update(rel for rel, _ in links)
            for f in group_parts(links):
                problem = f.problem or _blob_problem(f.path)
                yield ModelEntry(name=f"{repo_id}:{f.rel}", source="hf", path=f.path,
                                 extra_parts=f.extra_parts, group=repo_id, file=Path(f.rel).name,
                                 aliases=(f"hf.co/{repo_id}:{f.rel}",), problem=problem, root=root)
