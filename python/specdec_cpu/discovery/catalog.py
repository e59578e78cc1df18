"""Every model found on this machine: the stores searched in one pass.

Only directories and ollama's manifests are read here, never a GGUF file, so
building a catalog is cheap; metadata comes later, on demand (``store``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator, List, Sequence, Tuple, Union

from . import folders, hf_cache, lmstudio, ollama
from .entry import SOURCE_TITLES, ModelEntry

__all__ = ["Catalog", "discover"]


@dataclass
class Catalog:
    """The models found, and where they were looked for.

    ``entries`` holds usable models and, with a ``problem``, unusable ones
    (a missing blob, a corrupt manifest, a missing part); ``searched`` lists
    ``(source, folder, exists)`` in the order searched.
    """

    entries: List[ModelEntry] = field(default_factory=list)
    searched: List[Tuple[str, Path, bool]] = field(default_factory=list)

    def usable(self) -> List[ModelEntry]:
        return [e for e in self.entries if e.problem is None]

    def problems(self) -> List[ModelEntry]:
        return [e for e in self.entries if e.problem is not None]

    def where(self) -> str:
        """The folders searched, in one phrase for messages."""
        found = [f"{SOURCE_TITLES[s]} {p}" for s, p, exists in self.searched if exists]
        missing = list(dict.fromkeys(str(p) for _, p, exists in self.searched if not exists))
        text = "; ".join(found) if found else "no model store found"
        if missing:
            text += f" (absent: {', '.join(missing)})"
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
    for source, root, scan in _sources(model_dirs):
        exists = root.is_dir()
        catalog.searched.append((source, root, exists))
        if exists:
            _add(catalog, by_file, scan(root))
    if demo:
        _add(catalog, by_file, _demo())
    return catalog


def _add(catalog: Catalog, by_file: dict, entries: Iterable[ModelEntry]) -> None:
    try:
        for e in entries:
            if e.problem is None:
                real = e.real_path()
                i = by_file.get(real)
                if i is not None and catalog.entries[i].source != e.source:
                    first = catalog.entries[i]
                    catalog.entries[i] = replace(first, aliases=first.aliases + (e.name, *e.aliases))
                    continue
                by_file.setdefault(real, len(catalog.entries))
            catalog.entries.append(e)
    except OSError:  # a store that vanished or became unreadable while walked
        pass
