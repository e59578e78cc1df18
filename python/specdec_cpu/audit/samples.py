"""Generated sequences to audit, and reading them from a JSONL file.

Each line of an input file is one JSON object::

    {"prompt": "...", "tokens": [ids...]}            # preferred: the ids sampled
    {"prompt": "...", "text": "..."}                 # re-tokenized (see below)
    ... optionally with "stopped": true

``prompt`` is the exact text the engine was given (chat template already
applied; it is tokenized as the engine does: BOS where the model adds one,
special tokens parsed) or a list of prompt token ids.  ``stopped: true`` says
the generation ended at an end-of-generation token, which engines do not emit
as text: the audit then also checks that final outcome ("any EOG token").

``text`` is a fallback for engines that do not report ids.  Tokenizing the
emitted text again can give other ids than the engine sampled (a text has
many tokenizations and a sampler is free to produce a non-canonical one), and
that shifts ranks and surprisals: a token-level audit of re-tokenized text
can report a bias the engine does not have.  Prefer ids.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Union

from ..errors import SpecDecError

__all__ = ["AuditInputError", "GeneratedSequence", "read_jsonl", "parse_record", "TEXT_WARNING", "EOG_WARNING"]

TEXT_WARNING = (
    "{n} of {total} sequences give emitted text, not token ids: the text is tokenized again, which can "
    "split it differently from the ids the engine sampled (non-canonical tokenizations); a token-level "
    "audit of re-tokenized text can report a bias the engine does not have. Prefer \"tokens\"."
)
EOG_WARNING = (
    "{n} of {total} sequences hold an end-of-generation id in their tokens: it is audited as an ordinary "
    "outcome, and with \"stopped\": true one more position follows it that no engine drew. A generation "
    "that ended at it should leave it out and say \"stopped\": true (docs/audit.md)."
)


class AuditInputError(SpecDecError, ValueError):
    """A malformed audit input: the message names the file, the line and what was expected."""


@dataclass(frozen=True)
class GeneratedSequence:
    """One generation to audit.

    Exactly one of ``tokens`` (emitted ids) and ``text`` (emitted text) is
    set.  ``prompt`` is a text or a list of token ids.  ``stopped`` marks a
    generation that ended at an end-of-generation token.
    """

    prompt: Union[str, Sequence[int]]
    tokens: Optional[Sequence[int]] = None
    text: Optional[str] = None
    stopped: bool = False
    source: str = ""  # "file:line" for messages

    def __post_init__(self) -> None:
        where = f"{self.source}: " if self.source else ""
        if (self.tokens is None) == (self.text is None):
            raise AuditInputError(f"{where}give exactly one of 'tokens' (emitted ids) and 'text'")
        _check_prompt(self.prompt, where)
        if self.tokens is not None:
            _check_ids(self.tokens, "tokens", where)
        elif not isinstance(self.text, str):
            raise AuditInputError(f"{where}'text' must be a string, got {type(self.text).__name__}")
        if not isinstance(self.stopped, bool):
            raise AuditInputError(f"{where}'stopped' must be true or false, got {self.stopped!r}")


_KEYS = {"prompt", "tokens", "text", "stopped"}


def parse_record(record: object, source: str = "") -> GeneratedSequence:
    """A :class:`GeneratedSequence` from one decoded JSON object."""
    where = f"{source}: " if source else ""
    if not isinstance(record, dict):
        raise AuditInputError(f"{where}expected a JSON object with 'prompt' and 'tokens' or 'text', "
                              f"got {type(record).__name__}")
    unknown = sorted(set(record) - _KEYS)
    if unknown:
        raise AuditInputError(f"{where}unknown key(s) {', '.join(map(repr, unknown))}; "
                              f"expected {', '.join(sorted(_KEYS))}")
    if "prompt" not in record:
        raise AuditInputError(f"{where}missing 'prompt'")
    return GeneratedSequence(prompt=record["prompt"], tokens=record.get("tokens"), text=record.get("text"),
                             stopped=record.get("stopped", False), source=source)


def read_jsonl(path: Union[str, "os.PathLike[str]"]) -> List[GeneratedSequence]:
    """Every sequence of a JSONL file (blank lines skipped); errors name the line."""
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8") as fh:
            lines = fh.readlines()
    except UnicodeDecodeError as exc:
        raise AuditInputError(f"{name}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return parse_lines(lines, name)


def parse_lines(lines: Iterable[str], name: str = "<input>") -> List[GeneratedSequence]:
    """Sequences from JSONL lines (``name`` labels the messages)."""
    out: List[GeneratedSequence] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        source = f"{name}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise AuditInputError(f"{source}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        out.append(parse_record(record, source))
    if not out:
        raise AuditInputError(f"{name}: no sequences (expected one JSON object per line)")
    return out


def _check_prompt(prompt: object, where: str) -> None:
    if isinstance(prompt, str):
        if not prompt:
            raise AuditInputError(f"{where}'prompt' is empty")
        return
    if isinstance(prompt, list):
        if not prompt:
            raise AuditInputError(f"{where}'prompt' is an empty list of ids")
        _check_ids(prompt, "prompt", where)
        return
    raise AuditInputError(f"{where}'prompt' must be a string or a list of token ids, got {type(prompt).__name__}")


def _check_ids(ids: object, key: str, where: str) -> None:
    if not isinstance(ids, (list, tuple)):
        raise AuditInputError(f"{where}'{key}' must be a list of token ids, got {type(ids).__name__}")
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise AuditInputError(f"{where}'{key}'[{i}] must be a token id (an int >= 0), got {t!r}")
