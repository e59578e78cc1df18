"""Shared command-line helpers: errors, argument types, safe printing."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, TextIO

PROG = "specdec-cpu"


class UsageError(Exception):
    """Bad or missing arguments: reported in one line with exit code 2."""


# ASCII stand-ins for terminals whose encoding cannot show the math symbols.
_ASCII = str.maketrans({
    "γ": "gamma", "α": "alpha", "Σ": "sum", "×": "x", "←": "<-", "→": "->",
    "−": "-", "≈": "~", "∞": "inf", "≥": ">=", "≤": "<=", "·": "*", "—": "-",
})


def emit(text: str, stream: Optional[TextIO] = None) -> None:
    """Print ``text``, transliterating symbols the stream's encoding lacks."""
    stream = sys.stdout if stream is None else stream
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        text = text.translate(_ASCII).encode(encoding, errors="replace").decode(encoding)
    print(text, file=stream, flush=True)  # a server's status lines reach its log file at once


def probability(text: str) -> float:
    """argparse type: a number in [0, 1]."""
    value = _number(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def nonneg_float(text: str) -> float:
    """argparse type: a number >= 0."""
    value = _number(text)
    if value < 0.0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    value = _number(text)
    if value <= 0.0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def int_in(lo: int, hi: int):
    """argparse type factory: an int in [lo, hi]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be in [{lo}, {hi}], got {value}")
        return value

    parse.__name__ = "int"
    return parse


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"must be finite, got {text}")
    return value


def silence_stdout() -> None:
    """After a broken pipe, keep the interpreter's final flush from failing again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # pragma: no cover
        pass
