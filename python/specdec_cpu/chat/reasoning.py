"""A reasoning model's thinking, told apart from its answer.

Models such as DeepSeek-R1 and its distillations, QwQ and Qwen3 think
first, between ``<think>`` and ``</think>``, then answer.  Some chat
templates open the block themselves (the prompt ends with ``<think>``): the
output then starts inside it.  :class:`ReasoningSplitter` is fed the output
in pieces (any split, even inside a tag) and returns what they complete: the
thinking as ``{"reasoning_content": ...}`` (the field llama-server and
DeepSeek's API answer with), everything else as ``{"text": ...}`` for the
content and tool-call parsing that follows.  The block counts only at the
start of the output (after whitespace); a ``<think>`` later in the text is
text.  The tags' whitespace is dropped: the thinking is stripped at both
ends, and the answer's leading whitespace goes too.  Other tags may end
the thinking and start the answer (``ends``): a tool call's opening tag,
whose call the engine holds to its schema wherever the model writes it.

Only a model whose vocabulary has both tags as tokens of their own is
read so (:func:`has_thinking_tags`): another model writing ``<think>`` as
text is answered as it wrote it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Literal, Sequence, get_args

__all__ = ["THINK_OPEN", "THINK_CLOSE", "ReasoningFormat", "REASONING_FORMATS", "ReasoningSplitter",
           "ThinkingTokens", "opens_thinking", "has_thinking_tags"]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
#: How a server answers the thinking: "auto" apart (llama-server's name for it: "deepseek"), "none" in the content.
ReasoningFormat = Literal["auto", "deepseek", "none"]
REASONING_FORMATS = get_args(ReasoningFormat)
Delta = Dict[str, Any]


def has_thinking_tags(tokenizer: Any) -> bool:
    """Whether the vocabulary has ``<think>`` and ``</think>`` as tokens of their own (a reasoning model's)."""
    return all(len(tokenizer.tokenize(tag, add_special=False, parse_special=True)) == 1
               for tag in (THINK_OPEN, THINK_CLOSE))


def opens_thinking(prompt: str) -> bool:
    """Whether a rendered chat prompt leaves the model inside a thinking block (its template wrote the
    opening tag)."""
    return prompt.rstrip().endswith(THINK_OPEN)


class ReasoningSplitter:
    """``inside``: the output starts inside the block (the prompt opened it); ``ends``: tags that end it too,
    kept at the answer's start."""

    def __init__(self, *, inside: bool = False, ends: Sequence[str] = ()) -> None:
        self._ends = tuple(ends)
        self._state = "thinking" if inside else "start"  # start | thinking | after (the close) | answer
        self._buf = ""
        self._thought = False  # reasoning was sent: later pieces keep their leading whitespace
        self._pending = ""  # whitespace held back inside the block (it may be the block's last)

    def feed(self, piece: str) -> List[Delta]:
        """The deltas ``piece`` completes (possibly none)."""
        if self._state == "after":  # the block closed: the answer's leading whitespace goes
            piece = piece.lstrip()
            if not piece:
                return []
            self._state = "answer"
        if self._state == "answer":
            return [{"text": piece}] if piece else []
        self._buf += piece
        out: List[Delta] = []
        if self._state == "start":
            stripped = self._buf.lstrip()
            if THINK_OPEN.startswith(stripped):
                return out  # too little to tell (or nothing yet)
            if not stripped.startswith(THINK_OPEN):
                return self._answer(self._buf)
            self._state = "thinking"
            self._buf = stripped[len(THINK_OPEN):]
        at, tag = min(((self._buf.find(t), t) for t in (THINK_CLOSE, *self._ends) if t in self._buf),
                      default=(-1, ""))
        if at >= 0:
            out += self._reasoning(self._buf[:at], final=True)
            rest = self._buf[at + len(THINK_CLOSE):].lstrip() if tag == THINK_CLOSE else self._buf[at:]
            self._buf = ""
            self._state = "answer" if rest else "after"
            if rest:
                out.append({"text": rest})
            return out
        keep = max(_partial(self._buf, t) for t in (THINK_CLOSE, *self._ends))
        out += self._reasoning(self._buf[:len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep:]
        return out

    def finish(self) -> List[Delta]:
        """What is held at the end: a cut-off block's last thinking, or a start too short to tell."""
        if self._state == "start":
            return self._answer(self._buf)
        if self._state == "thinking":
            out = self._reasoning(self._buf, final=True)
            self._buf = ""
            return out
        return []

    def _answer(self, text: str) -> List[Delta]:
        self._state, self._buf = "answer", ""
        return [{"text": text}] if text else []

    def _reasoning(self, text: str, final: bool = False) -> List[Delta]:
        text = self._pending + text
        if not self._thought:
            text = text.lstrip()
        body = text.rstrip()
        self._pending = "" if final else text[len(body):]
        if not body:
            return []
        self._thought = True
        return [{"reasoning_content": body}]


class ThinkingTokens:
    """Which of an output's tokens, fed in order as their bytes, are its thinking (the tags included), as
    :class:`ReasoningSplitter` reads the text: for a vocabulary with the tags as tokens of their own
    (:func:`has_thinking_tags`), token by token.  ``count`` is OpenAI's ``reasoning_tokens``."""

    def __init__(self, *, inside: bool = False, ends: Sequence[str] = ()) -> None:
        self._state = "thinking" if inside else "start"  # start | thinking | answer
        self._ends = {tag.encode() for tag in ends}
        self.count = 0

    def feed(self, token: bytes) -> bool:
        """Whether this token is thinking."""
        if self._state == "start":
            if token == THINK_OPEN.encode():
                self._state = "thinking"
            elif token.strip():
                self._state = "answer"
            if self._state != "thinking":
                return False
        elif self._state == "answer":
            return False
        elif token in self._ends:  # it begins the answer
            self._state = "answer"
            return False
        elif token == THINK_CLOSE.encode():
            self._state = "answer"
        self.count += 1
        return True


def _partial(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` may begin ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
