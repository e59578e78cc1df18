"""GGUF files split into parts (``name-00001-of-00003.gguf``).

llama.cpp loads a split model from its first part and finds the others
beside it, so a split model is listed once, under its first part, with the
size of all parts; one with a part missing is listed as unusable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Optional, Tuple

__all__ = ["GGUFFile", "group_parts", "split_name", "other_parts"]

_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


@dataclass(frozen=True)
class GGUFFile:
    """One model file as found: its name relative to where it was found, the
    (first) file, the other parts of a split file, and why it cannot be used."""

    rel: str
    path: Path
    extra_parts: Tuple[Path, ...] = ()
    problem: Optional[str] = None


def split_name(name: str) -> Optional[Tuple[str, int, int]]:
    """``(stem, index, count)`` of a split part's file name, else None."""
    m = _SPLIT.match(name)
    if m is None:
        return None
    return m["stem"], int(m["index"]), int(m["count"])


def _part_name(stem: str, index: int, count: int) -> str:
    return f"{stem}-{index:05d}-of-{count:05d}.gguf"


def other_parts(path: Path) -> Tuple[Path, ...]:
    """The parts after the first of a split file's first part (empty otherwise)."""
    split = split_name(path.name)
    if split is None or split[1] != 1:
        return ()
    stem, _, count = split
    return tuple(path.with_name(_part_name(stem, i, count)) for i in range(2, count + 1))


def group_parts(found: Iterable[Tuple[str, Path]]) -> List[GGUFFile]:
    """Files as ``(rel, path)`` pairs -> models: single files as they are,
    split files once, under their first part (later parts are folded in)."""
    items = list(found)
    rels = {rel.lower() for rel, _ in items}
    out: List[GGUFFile] = []
    orphans = set()
    for rel, path in items:
        split = split_name(Path(rel).name)
        if split is None:
            out.append(GGUFFile(rel, path))
            continue
        stem, index, count = split
        parent = rel[: len(rel) - len(Path(rel).name)]
        if index != 1:
            first = f"{parent}{_part_name(stem, 1, count)}"
            if first.lower() not in rels and first.lower() not in orphans:
                orphans.add(first.lower())
                out.append(GGUFFile(rel, path, problem=f"part {index} of a split model whose first "
                                                        f"part ({_part_name(stem, 1, count)}) is missing"))
            continue
        parts = other_parts(path)
        missing = [p.name for p in parts if not p.is_file()]
        problem = (f"split into {count} parts, {len(missing)} missing ({', '.join(missing[:3])})"
                   if missing else None)
        out.append(GGUFFile(rel, path, parts, problem))
    return out
