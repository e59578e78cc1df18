"""From what the user typed (a path or a model's name) to a GGUF file.

:func:`find_model` tries, in order, stopping at the first step that matches:

1. an existing file: used as it is (no store is searched);
2. ``source:name`` (``ollama:``, ``hf:``, ``lmstudio:``, ``dir:``, ``demo:``)
   restricts the search to one store;
3. a model's name or alias, ignoring case: ``qwen2.5-coder:7b``,
   ``qwen2.5-coder`` for ``:latest``, ``org/repo:file.gguf``,
   ``folder/file.gguf``;
4. a file name alone (``file.gguf``, or without ``.gguf``; a split file's
   name without its ``-00001-of-0000N``) when one model has it;
5. a model or repository: ``org/repo`` when it holds one GGUF file,
   ``org/repo:Q4_K_M`` for the file whose name carries that tag.

Several matches in one step is an error listing them (with their
``source:name``); no match is an error listing close names and where the
search went.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import List, Optional, Sequence, Union

from ..errors import AmbiguousModelError, ModelLoadError, ModelNotFoundError
from .catalog import Catalog, discover
from .entry import SOURCE_TITLES, SOURCES, ModelEntry
from .shards import split_name

__all__ = ["find_model", "resolve_model", "looks_like_path", "tag_matches"]

PathLike = Union[str, "os.PathLike[str]"]


def looks_like_path(text: str) -> bool:
    """True for what reads as a file path rather than a model's name."""
    return (text.lower().endswith(".gguf") and ":" not in text.replace(os.sep, "/").split("/")[-1]) \
        or text.startswith(("/", "./", "../", "~")) or (os.sep != "/" and os.sep in text)


def tag_matches(file_name: str, tag: str) -> bool:
    """True when ``tag`` (``Q4_K_M``) is a whole word of ``file_name`` (words split at ``-._``)."""
    words = re.split(r"[-._]", file_name.lower())
    tag_words = re.split(r"[-._]", tag.lower())
    n = len(tag_words)
    return any(words[i:i + n] == tag_words for i in range(len(words) - n + 1))


def _file_names(file: str) -> "set[str]":
    """What a file may be called by: ``f.gguf``, ``f``; for a split file's first part also its stem."""
    if not file:
        return set()
    low = file.lower()
    out = {low, low[: -len(".gguf")] if low.endswith(".gguf") else low}
    split = split_name(file)
    if split is not None:
        out |= {split[0].lower(), split[0].lower() + ".gguf"}
    return out


def _steps(query: str, entries: Sequence[ModelEntry]) -> List[ModelEntry]:
    q = query.lower()
    exact = [e for e in entries if q == e.name.lower() or q in (a.lower() for a in e.aliases)]
    if exact:
        return exact
    by_file = [e for e in entries if q in _file_names(e.file)]
    if by_file:
        return by_file
    group, _, tag = q.rpartition(":") if ":" in q else (q, "", "")
    members = [e for e in entries if e.group and e.group.lower() == group]
    if tag:
        return [e for e in members if tag_matches(e.file or e.name, tag)]
    return members


def _usable_first(matches: List[ModelEntry]) -> List[ModelEntry]:
    good = [e for e in matches if e.problem is None]
    return good or matches


def _close(query: str, catalog: Catalog) -> List[str]:
    names: dict[str, str] = {}  # lower-cased name or file -> the entry's name
    for e in catalog.entries:
        for n in (e.name, e.file):
            if n:
                names.setdefault(n.lower(), e.name)
    q = query.lower()
    close = difflib.get_close_matches(q, list(names), n=5, cutoff=0.5)
    close += [k for k in names if q and q in k and k not in close]
    out: List[str] = []
    for k in close:
        if names[k] not in out:
            out.append(names[k])
    return out[:5]


def find_model(query: str, catalog: Optional[Catalog] = None,
               model_dirs: Sequence[PathLike] = ()) -> ModelEntry:
    """The model ``query`` names (see the module docstring for the rules).

    Raises ModelNotFoundError, AmbiguousModelError, or ModelLoadError for a
    model that was found but cannot be used (its ``problem``).
    """
    try:
        path = Path(query).expanduser()
    except RuntimeError:  # "~user/..." of no user on this machine: no such file
        path = Path(query)
    if path.is_file():
        return ModelEntry(name=query, source="file", path=path, file=path.name)
    catalog = discover(model_dirs) if catalog is None else catalog
    # A folder in the working directory hides no model of its name ("tinyllama").
    if path.is_dir() and (looks_like_path(query) or not _steps(query, catalog.entries)):
        raise ModelLoadError(f"{query}: is a directory, not a GGUF file")
    entries, rest = catalog.entries, query
    prefix, sep, after = query.partition(":")
    if sep and prefix.lower() in SOURCES and after:
        entries, rest = [e for e in entries if e.source == prefix.lower()], after
    matches = _usable_first(_steps(rest, entries))
    if len(matches) > 1:
        listed = ", ".join(e.qualified for e in matches[:8]) + (", ..." if len(matches) > 8 else "")
        raise AmbiguousModelError(f"{query}: matches {len(matches)} models ({listed}); name one of them")
    if matches:
        entry = matches[0]
        if entry.problem is not None:
            raise ModelLoadError(f"{query}: {SOURCE_TITLES[entry.source]} model {entry.name} "
                                 f"cannot be used: {entry.problem}")
        return entry
    what = "no such file, and no model of that name" if looks_like_path(query) else "no model of that name"
    close = _close(rest, catalog)
    hint = f"; close matches: {', '.join(close)}" if close else ""
    raise ModelNotFoundError(f"{query}: {what} (searched {catalog.where()}){hint}; "
                             "`specdec-cpu models` lists the models found")


def resolve_model(name_or_path: PathLike, model_dirs: Sequence[PathLike] = ()) -> Path:
    """The GGUF file that ``name_or_path`` names: an existing path as it is,
    else a model found by :func:`~specdec_cpu.discovery.discover` (ollama,
    the Hugging Face cache, LM Studio, ``model_dirs``, ``$SPECDEC_MODEL_DIRS``).
    For a split model, the first part (llama.cpp finds the others).

    Raises ModelNotFoundError (naming close matches), AmbiguousModelError
    (listing the candidates) or ModelLoadError (a model found but unusable).
    """
    return find_model(os.fspath(name_or_path), model_dirs=model_dirs).path
