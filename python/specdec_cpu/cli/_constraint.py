"""The structured-output options of ``generate`` and ``chat``: a JSON schema,
any JSON object, a grammar file (Lark or GBNF), a regular expression or a
list of choices, read into a ``constraints.Grammar``
(docs/structured_output.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional

from ..constraints import Grammar
from ..errors import InvalidGrammarError
from ._common import UsageError

__all__ = ["add_constraint_args", "constraint_from_args", "grammar_file", "schema_file"]


def add_constraint_args(p: argparse.ArgumentParser) -> None:
    """The mutually exclusive ways to constrain the output."""
    g = p.add_argument_group("structured output (exact under speculation; forced tokens are free drafts)")
    m = g.add_mutually_exclusive_group()
    m.add_argument("--json-schema", metavar="FILE",
                   help="the output is JSON matching the JSON schema in FILE")
    m.add_argument("--json-object", action="store_true",
                   help="the output is one JSON object (any keys)")
    m.add_argument("--grammar", metavar="FILE",
                   help="the output matches the grammar in FILE: GBNF (llama.cpp's format, "
                        "a .gbnf file or one with '::=' rules) or Lark")
    m.add_argument("--regex", metavar="PATTERN", help="the output matches the regular expression PATTERN")
    m.add_argument("--choice", metavar="TEXT", action="append",
                   help="the output is exactly one of the texts given (repeat: --choice yes --choice no)")


def constraint_from_args(args: argparse.Namespace) -> Optional[Grammar]:
    """The grammar the options ask for, or None.  Checked now, before any
    model loads: a file that cannot be read or a grammar that is not valid
    (an empty one included) is a UsageError naming the option."""
    if getattr(args, "json_object", False):
        return Grammar.json_object()
    for flag, dest, make in (("--json-schema", "json_schema", schema_file), ("--grammar", "grammar", grammar_file),
                             ("--regex", "regex", Grammar.regex), ("--choice", "choice", Grammar.choice)):
        value = getattr(args, dest, None)
        if value is not None:
            try:
                grammar = make(value)
                grammar.check()
            except InvalidGrammarError as exc:
                raise UsageError(f"{flag}: {exc}") from None
            return grammar
    return None


def schema_file(path: str, what: str = "--json-schema") -> Grammar:
    """The JSON schema in ``path`` as a grammar (``what`` names the option in errors)."""
    text = _read(path, what)
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{what} {path}: not JSON ({exc})") from None
    if not isinstance(schema, dict):
        raise UsageError(f"{what} {path}: a JSON schema is an object, got {type(schema).__name__}")
    return Grammar.json_schema(schema)


def grammar_file(path: str) -> Grammar:
    """The grammar in ``path``: GBNF by its extension or its ``::=`` rules, else Lark."""
    text = _read(path, "--grammar")
    if path.endswith(".gbnf"):
        return Grammar.gbnf(text)
    return Grammar.lark(text) if path.endswith(".lark") else Grammar.gbnf_or_lark(text)


def _read(path: str, flag: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{flag}: cannot read {path}: {exc}") from None
    if not text.strip():
        raise UsageError(f"{flag}: {path} is empty")
    return text
