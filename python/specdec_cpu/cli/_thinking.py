"""A chat reply in the terminal, a reasoning model's thinking told apart.

A reply is written as it streams.  On a colour terminal the thinking of a
reasoning model (its ``<think>`` block, chat/reasoning.py) is dimmed and set
off from the answer by a blank line; elsewhere (a pipe, ``TERM=dumb``,
``NO_COLOR``) the text is written exactly as the model gave it.  Either way
the conversation keeps the answer as the turn's content and the thinking as
its ``reasoning_content``, for the chat template to keep or drop, as the
server does.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, TextIO

from ..chat import ReasoningSplitter

__all__ = ["ReplyPrinter", "colour_terminal"]

DIM, RESET = "\x1b[2m", "\x1b[0m"


def colour_terminal(out: TextIO) -> bool:
    """Whether ``out`` is a terminal that shows ANSI colours (no ``NO_COLOR``, no ``TERM=dumb``)."""
    isatty = getattr(out, "isatty", lambda: False)
    return bool(isatty()) and os.environ.get("TERM", "") != "dumb" and "NO_COLOR" not in os.environ


class ReplyPrinter:
    """Writes a reply's pieces to ``out``; ``thinks``: the model is a reasoning model (its vocabulary has
    the tags); ``inside``: the prompt opened a thinking block."""

    def __init__(self, out: TextIO, *, thinks: bool, inside: bool, colour: bool) -> None:
        self._colour = colour and thinks
        self._out = out
        self._splitter = ReasoningSplitter(inside=inside) if thinks else None
        self._thinking: List[str] = []
        self._answer: List[str] = []
        self._dimmed = False
        self.last = ""  # the last character written

    def write(self, piece: str) -> None:
        if not self._colour:
            self._put(piece)
        if self._splitter is not None:
            self._take(self._splitter.feed(piece))

    def finish(self) -> None:
        """The end of the reply (or its interruption): what the splitter held, and the colour reset."""
        if self._splitter is not None:
            self._take(self._splitter.finish())
        if self._dimmed:
            self._put(RESET)
            self._dimmed = False

    def message(self, raw: str) -> Dict[str, Any]:
        """The assistant's turn for the conversation (``raw``: the reply's whole text)."""
        if not self._thinking:
            return {"role": "assistant", "content": raw if not self._answer else "".join(self._answer)}
        return {"role": "assistant", "content": "".join(self._answer), "reasoning_content": "".join(self._thinking)}

    def _take(self, deltas: List[Dict[str, Any]]) -> None:
        for delta in deltas:
            if "reasoning_content" in delta:
                self._thinking.append(delta["reasoning_content"])
                if self._colour:
                    if not self._dimmed:
                        self._put(DIM)
                        self._dimmed = True
                    self._put(delta["reasoning_content"])
            else:
                self._answer.append(delta["text"])
                if self._colour:
                    if self._dimmed:
                        self._put(RESET + "\n\n")
                        self._dimmed = False
                    self._put(delta["text"])

    def _put(self, text: str) -> None:
        if text:
            self._out.write(text)
            self._out.flush()
            self.last = text[-1]
