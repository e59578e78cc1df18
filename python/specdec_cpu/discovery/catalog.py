"""Every model found on this machine: the stores searched in one pass.

Only directories and ollama's manifests are read here, never a GGUF file, so
building a catalog is cheap; metadata comes later, on demand (``store``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from . import folders, hf_cache, lmstudio, ollama
from .entry import SOURCE_TITLES, ModelEntry

__all__ = ["Catalog", "discover"]


@dataclass
class Catalog:
    """The models found, and where they were looked for.

    ``entries`` holds usable models and, with a ``problem``, unusable ones
    (a missing blob, a corrupt manifest, a missing part); ``searched`` lists
    ``(source, folder, exists)`` in the order searched (``exists`` None: the
    folder is there but this user may not read it).
    """

    entries: List[ModelEntry] = field(default_factory=list)
    searched: List[Tuple[str, Path, Optional[bool]]] = field(default_factory=list)

    def usable(self) -> List[ModelEntry]:
        return [e for e in self.entries if e.problem is None]

    def problems(self) -> List[ModelEntry]:
        return [e for e in self.entries if e.problem is not None]

    def where(self) -> str:
        """The folders searched, in one phrase for messages."""
        found = [f"{SOURCE_TITLES[s]} {p}" for s, p, exists in self.searched if exists]
        missing = list(dict.fromkeys(p for _, p, exists in self.searched if exists is False))
        unreadable = list(dict.fromkeys(str(p) for _, p, exists in self.searched if exists is None))
        files = [str(p) for p in missing if p.exists()]  # e.g. --model-dir naming a .gguf file
        absent = [str(p) for p in missing if not p.exists()]
        text = "; ".join(found) if found else "no model store found"
        if absent:
            text += f" (absent: {', '.join(absent)})"
        if files:
            text += f" (not a folder: {', '.join(files)})"
        if unreadable:
            text += f" (not readable by this user: {', '.join(unreadable)})"
        return text


def _demo() -> Iterator[ModelEntry]:
    from .. import demo_models as models

    for m in models.list_models():
        if m.exists:
            yield ModelEntry(name=m.name, source="demo", path=m.path, group="demo", file=m.path.name,
                             root=m.path.parent)


def _sources(model_dirs: Sequence[Union[str, "os.PathLike[str]"]]
             ) -> List[Tuple[str, Path, Callable[[Path], Iterable[ModelEntry]]]]:
    out: List[Tuple[str, Path, Callable[[Path], Iterable[ModelEntry]]]] = []
    out += [("ollama", root, ollama.scan) for root in ollama.default_roots()]
    out.append(("hf", hf_cache.default_root(), hf_cache.scan))
    out += [("lmstudio", root, lmstudio.scan) for root in lmstudio.default_roots()]
    out += [("dir", root, folders.scan) for root in folders.configured_dirs(model_dirs)]
    return out


def discover(model_dirs: Sequence[Union[str, "os.PathLike[str]"]] = (), *, demo: bool = True) -> Catalog:
    """Search ollama's store, the Hugging Face cache, LM Studio's folders,
    ``model_dirs`` and ``$SPECDEC_MODEL_DIRS`` (and the demo pair's files,
    when prepared).  A file found twice (e.g. a model folder inside LM
    Studio's) is listed once, under its first name; its other names become
    aliases.  Within one store every name stays (ollama tags often share a blob)."""
    catalog = Catalog()
    by_file: dict = {}
    scanned = set()
    for source, root, scan in _sources(model_dirs):
        exists = _folder(root)
        catalog.searched.append((source, root, exists))
        key = (source, os.path.realpath(root))
        if exists and key not in scanned:  # a folder reached twice (a link, ollama's two defaults) is read once
            scanned.add(key)
            _add(catalog, by_file, scan(root))
    if demo:
        _add(catalog, by_file, _demo())
    return catalog


def _folder(root: Path) -> Optional[bool]:
    """Whether ``root`` is a folder; None when this user may not look into it."""
    try:
        if not root.is_dir():
            return False
        os.scandir(root).close()
        return True
    except OSError:
        return None


def _add(catalog: Catalog, by_file: dict, entries: Iterable[ModelEntry]) -> None:
    try:
        for e in entries:
            if e.problem is None:
                real = e.real_path()
                i = by_file.get(real)
                # The same file under another store, or another folder of one (nested
                # model folders): an alias.  Within one folder every name stays.
                if i is not None and (catalog.entries[i].source != e.source or catalog.entries[i].root != e.root):
                    first = catalog.entries[i]
                    catalog.entries[i] = replace(first, aliases=first.aliases + (e.name, *e.aliases))
                    continue
                by_file.setdefault(real, len(catalog.entries))
            catalog.entries.append(e)
    except OSError:  # a store that vanished or became unreadable while walked
        pass
