"""The ``specdec-cpu`` command line.

Each subcommand lives in its own module exposing ``register(subparsers)``,
which adds its parser and sets ``func`` (``run(args) -> int``).  Subcommands
import heavy pieces (llama.cpp, the C++ extension) only when they run, so
``specdec-cpu plan`` works without any model.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from importlib import import_module
from typing import Optional, Sequence

from .. import __version__
from ..settings import env_errors
from ._common import PROG, UsageError, emit, silence_stdout

__all__ = ["build_parser", "main"]

# Module names under specdec_cpu.cli, in the order `--help` lists them.
COMMANDS: tuple[str, ...] = ("generate", "chat", "serve", "models", "pull", "plan", "calibrate", "audit")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Exact speculative decoding for GGUF language models on CPUs.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        import_module(f".{name}", __name__).register(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 runtime error, 2 usage)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help/--version (0) and usage errors (2)
        return exc.code if isinstance(exc.code, int) else 2
    if getattr(args, "func", None) is None:
        parser.print_usage(sys.stderr)
        emit(f"{PROG}: error: choose a command ({', '.join(COMMANDS)})", sys.stderr)
        return 2
    bad_env = env_errors(args)
    if bad_env:
        emit(f"{PROG} {args.command}: error: {'; '.join(bad_env)}", sys.stderr)
        return 2
    try:
        with warnings.catch_warnings():  # restores the usual display when main() returns
            warnings.showwarning = _warning_line
            return int(args.func(args) or 0)
    except UsageError as exc:
        emit(f"{PROG} {args.command}: error: {exc}", sys.stderr)
        return 2
    except KeyboardInterrupt:
        emit(f"{PROG}: interrupted", sys.stderr)
        return 130
    except BrokenPipeError:  # `| head`: the reader of the output is gone, and that is no error
        silence_stdout()
        return 0
    except Exception as exc:  # one clear line, not a traceback, unless asked for
        if os.environ.get("SPECDEC_DEBUG"):
            raise
        emit(f"{PROG}: error: {_describe(exc)}", sys.stderr)
        return 1


def _warning_line(message: Warning | str, category: type, filename: str, lineno: int, file: object = None,
                  line: Optional[str] = None) -> None:
    """A warning as one line for the user, not Python's file, line and source."""
    emit(f"{PROG}: warning: {message}", sys.stderr)


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, OSError) and exc.filename is not None and str(exc.filename) not in text:
        text = f"{exc.filename}: {text}"
    first = text.splitlines()[0] if text else type(exc).__name__
    cause = getattr(exc, "cause", None)  # a Ray task's error: its first line only names the task
    if isinstance(cause, BaseException) and cause is not exc:
        return f"{first}: {type(cause).__name__}: {_describe(cause)}"
    return first
