"""The command line's hook into model discovery: model names wherever a path
is accepted, the draft picked when none is given, the memory check.

Subcommands add the flags with :func:`add_discovery_args` and turn their
model flags into files with :func:`finish_models`; nothing else of theirs
changes.  Names shown to the user (``qwen2.5-coder:7b`` rather than an
ollama blob's hash) come from :func:`label`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ..errors import ModelLoadError
from ._common import emit

__all__ = ["add_discovery_args", "finish_models", "label", "served_name"]

_LABELS: Dict[str, str] = {}  # file -> the name the user gave or discovery found


def add_discovery_args(group, *, auto_draft: bool = True) -> None:
    """``--model-dir``, ``--no-memory-check`` and (with ``auto_draft``) ``--no-auto-draft``."""
    group.add_argument("--model-dir", action="append", default=[], metavar="DIR",
                       help="also look for models (by name, and for a draft) in DIR, searched "
                            "recursively; repeatable (and $SPECDEC_MODEL_DIRS)")
    if auto_draft:
        group.add_argument("--no-auto-draft", action="store_true",
                           help="with --target but no --draft, do not pick a draft among the models "
                                "on this machine (default: the smallest sharing the target's "
                                "vocabulary, else n-gram drafting; --gamma 0 never drafts)")
    group.add_argument("--no-memory-check", action="store_true",
                       help="load even when the models and their KV caches look larger than the "
                            "memory available")


def label(path: Optional[str]) -> str:
    """How to show a model file: its model name when it was named, else its file name."""
    if not path:
        return "?"
    return _LABELS.get(str(path), Path(path).name)


def served_name(path: str) -> str:
    """The model id a server announces: the model's name, else the file's stem."""
    return _LABELS.get(str(path), Path(path).stem)


def _resolve(flag: str, value: str, catalog_box: list, model_dirs: Sequence[str]) -> str:
    from ..discovery import discover, find_model

    if Path(value).is_file():  # a path as given; find_model expands "~" (and names a "~user" of no user)
        return value
    if not catalog_box:
        catalog_box.append(discover(model_dirs))
    try:
        entry = find_model(value, catalog_box[0])
    except ModelLoadError as exc:
        raise type(exc)(f"{flag} {exc}") from None
    _LABELS[str(entry.path)] = entry.name
    return str(entry.path)


def _auto_draft(args: argparse.Namespace, target: str, catalog_box: list,
                model_dirs: Sequence[str], say) -> Optional[str]:
    from ..discovery import choose_draft, discover

    if not catalog_box:
        catalog_box.append(discover(model_dirs))
    try:
        choice = choose_draft(Path(target), catalog_box[0], say=say)
    except ModelLoadError:
        return None  # the target is unreadable: loading it says why
    if choice.entry is None:
        say(f"{choice.line}; n-gram drafting (prompt lookup). --draft D names one")
        args.ngram = True
        return None
    _LABELS[str(choice.entry.path)] = choice.entry.name
    say(choice.line)
    return str(choice.entry.path)


def check_model_files(models: Iterable[Tuple[str, Optional[str], Optional[str]]]) -> None:
    """Each ``(flag, as given, file)`` is a readable GGUF file; the error names the flag
    (and the name given, when a store's file was found for it)."""
    from ..engine.gguf_meta import check_gguf_file

    for flag, value, path in models:
        if path is None:
            continue
        try:
            check_gguf_file(path)
        except ModelLoadError as exc:
            raise type(exc)(f"{flag}{'' if value == path else ' ' + str(value)}: {exc}") from None


def finish_models(args: argparse.Namespace, target: str, draft: Optional[str], *,
                  flags: Tuple[str, str] = ("--target", "--draft"), n_ctx: int, n_seq: int = 1,
                  named: bool = True, auto_draft: bool = True) -> Tuple[str, Optional[str]]:
    """The files for ``target`` and ``draft`` as the user gave them.

    Names become files (``named``; an existing path is kept as it is).  With
    a target, no draft, ``auto_draft``, γ other than 0 and no
    ``--no-auto-draft``, the draft is picked among the models found (one
    line on stderr says which and why); when none fits, ``args.ngram`` is
    set and the line says so.  Last, unless ``--no-memory-check``, the files
    and their KV caches (``n_seq`` sequences of ``n_ctx`` tokens) must fit in
    the memory available.
    """
    model_dirs: List[str] = list(getattr(args, "model_dir", None) or [])
    box: list = []
    say = lambda line: emit(line, sys.stderr)  # noqa: E731
    given = (target, draft)
    if named:
        target = _resolve(flags[0], target, box, model_dirs)
        if draft is not None:
            draft = _resolve(flags[1], draft, box, model_dirs)
    check_model_files(zip(flags, given, (target, draft)))
    if (named and auto_draft and draft is None and not getattr(args, "no_auto_draft", True)
            and getattr(args, "gamma", "auto") != 0):
        draft = _auto_draft(args, target, box, model_dirs, say)
    if not getattr(args, "no_memory_check", False):
        from ..discovery import check_memory

        models = [(f"target {label(target)}", Path(target))]
        if draft is not None:
            models.append((f"draft {label(draft)}", Path(draft)))
        check_memory(models, n_ctx=n_ctx, n_seq=n_seq)
    return target, draft
