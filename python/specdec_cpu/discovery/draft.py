"""Choosing a draft model for a target among the models on this machine.

A candidate must pass, in this order (cheapest checks first, so most files
are never opened):

* usable, not the target's own file, and fewer bytes than the target: a
  draft that reads more bytes per pass than the target is never cheaper on a
  CPU, where a pass is bound by memory bandwidth;
* a language model that can draft: not a vocabulary cut written by
  specdec-cpu, not a recurrent or hybrid architecture (their caches cannot
  drop rejected tokens);
* the same vocabulary by the rule ``engine.check_vocab_compatible`` applies
  at load (same type, BOS and EOS ids, same token texts over the shared ids;
  sizes may differ), checked on cached fingerprints (``fingerprint``);
* smaller than the target: fewer parameters, or as many and fewer bytes (a
  lower-bit quantisation of the same model).

Among those, the one with the fewest parameters, then the fewest bytes,
wins: the cheapest pass.  The loader checks the vocabularies again on the
real files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional

from ..errors import ModelLoadError
from .catalog import Catalog
from .entry import ModelEntry
from .fingerprint import mismatch
from .shards import other_parts
from .store import ModelInfo, describe, is_cached, vocabulary
from .units import format_bytes, format_params

__all__ = ["DraftChoice", "choose_draft", "NO_DRAFT_ARCHS"]

#: Architectures whose cache cannot drop a suffix (refused as drafts by the engine).
NO_DRAFT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7", "jamba",
                            "falcon-h1", "granitehybrid", "nemotron_h", "lfm2", "plamo2", "qwen3next",
                            "clip"})


@dataclass(frozen=True)
class DraftChoice:
    """The draft chosen (None: none fits) and the one line that says why."""

    entry: Optional[ModelEntry]
    line: str
    compatible: int = 0


def _rank(info: ModelInfo) -> "tuple[int, int]":
    return (info.meta.n_params or 0, info.size)


def choose_draft(target: Path, catalog: Catalog,
                 say: Optional[Callable[[str], None]] = None) -> DraftChoice:
    """The best draft for ``target`` among ``catalog``'s models (see the module docstring).

    Raises ModelLoadError when the target's own metadata cannot be read.
    ``say`` gets one line before files are read for the first time.
    """
    target = Path(target)
    t_info = describe(target, other_parts(target))
    t_vocab = vocabulary(target, other_parts(target))
    if t_vocab is None:
        return DraftChoice(None, "draft: none (the target has no vocabulary in its metadata)")
    t_real = os.path.realpath(target)
    pool = [e for e in catalog.usable() if e.real_path() != t_real and (e.size() or 0) < t_info.size]
    fresh = [e for e in pool if not is_cached(e.path, e.extra_parts)]
    if say is not None and sum(e.size() or 0 for e in fresh) > 256_000_000:
        say(f"reading the metadata of {len(fresh)} model file{'s' if len(fresh) != 1 else ''} found on "
            "this machine (once: it is cached) ...")

    compatible: List["tuple[tuple[int, int], ModelEntry, ModelInfo]"] = []
    n_same_vocab = 0
    for e in pool:
        try:
            info = describe(e.path, e.extra_parts)
            # no tensors: a vocabulary-only file (llama.cpp's models/ggml-vocab-*.gguf) drafts nothing
            if info.meta.cut or not info.meta.n_params or (info.meta.architecture or "") in NO_DRAFT_ARCHS:
                continue
            vocab = vocabulary(e.path, e.extra_parts)
        except ModelLoadError:
            continue
        if vocab is None or mismatch(t_vocab, vocab) is not None:
            continue
        n_same_vocab += 1
        if _rank(info) < _rank(t_info):
            compatible.append((_rank(info), e, info))
    if not compatible:
        why = (f"{n_same_vocab} with the target's vocabulary, none smaller" if n_same_vocab else
               f"none of the {len(pool)} smaller models found shares the target's vocabulary" if pool else
               "no smaller model found on this machine")
        return DraftChoice(None, f"draft: none ({why})", 0)
    compatible.sort(key=lambda c: (c[0], c[1].name))
    _, entry, info = compatible[0]
    if (info.meta.n_params or 0) < (t_info.meta.n_params or 0):
        why = (f"same vocabulary, {format_params(info.meta.n_params)} vs "
               f"{format_params(t_info.meta.n_params)} parameters")
    else:
        why = (f"same vocabulary and parameters, {info.meta.file_type or '?'} {format_bytes(info.size)} "
               f"vs {t_info.meta.file_type or '?'} {format_bytes(t_info.size)}")
    if len(compatible) > 1:
        why += f"; smallest of {len(compatible)} candidates"
    return DraftChoice(entry, f"draft: {entry.name} ({why})", len(compatible))
