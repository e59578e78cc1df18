"""Tool calls in model output, as OpenAI's ``tool_calls``.

Qwen2.5 and the Hermes family write each call as::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

possibly several, after optional text.  :func:`parse_tool_calls` turns a
whole output into content plus calls; a block that is not such a call
(malformed JSON, no name, an unknown function, unclosed) stays in the
content as written.  Without any ``<tool_call>`` tag, an output that is as
a whole one JSON call object (``{"name": ..., "arguments": {...}}``) or a
list of them is read as calls too (models prompted without a tool format),
also inside one fenced ```` ```json ```` block, as small Qwen2.5 models often
write their calls (llama.cpp's Hermes parser reads that fence too).

``arguments`` is the text the model wrote for the arguments object (OpenAI
sends a JSON string); ``"parameters"`` is accepted for ``"arguments"``, and
arguments written as a JSON string holding an object are unwrapped.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Dict, List, Optional, Tuple

__all__ = ["ToolCall", "ParsedOutput", "parse_tool_calls", "new_call_id", "TOOL_CALL_OPEN", "TOOL_CALL_CLOSE"]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
ARGUMENT_KEYS = ("arguments", "parameters")

_ALPHABET = string.ascii_letters + string.digits
JSON_FENCE_OPEN = "```json"
_JSON_FENCE = re.compile(r"\s*```json[ \t]*\n(.*?)\n?[ \t]*```\s*", re.DOTALL)
_decoder = json.JSONDecoder()


def new_call_id() -> str:
    """An OpenAI-style call id: ``call_`` and 24 random letters and digits."""
    return "call_" + "".join(secrets.choice(_ALPHABET) for _ in range(24))


@dataclass(frozen=True)
class ToolCall:
    """One function call: ``arguments`` is the JSON text of an object."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> Dict[str, Any]:
        """The call as an entry of an OpenAI message's ``tool_calls``."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ParsedOutput:
    """An output split into its text (None when there is none) and its calls."""

    content: Optional[str]
    tool_calls: List[ToolCall] = field(default_factory=list)


def parse_tool_calls(text: str, *, tool_names: Optional[Collection[str]] = None, json_fallback: bool = True,
                     id_factory: Callable[[], str] = new_call_id) -> ParsedOutput:
    """Split a whole output into content and tool calls.

    ``tool_names``: the functions offered; a call naming another is left as
    content.  Content is the text outside the calls (and any block that is
    not a call), stripped of surrounding whitespace.
    """
    if TOOL_CALL_OPEN not in text:
        if json_fallback:
            found = json_calls(text, tool_names)
            if found:
                return ParsedOutput(None, [ToolCall(id_factory(), n, a) for n, a in found])
        return ParsedOutput(text.strip() or None)
    outside: List[str] = []
    calls: List[ToolCall] = []
    pos = 0
    while True:
        start = text.find(TOOL_CALL_OPEN, pos)
        if start < 0:
            outside.append(text[pos:])
            break
        outside.append(text[pos:start])
        body_start = start + len(TOOL_CALL_OPEN)
        end = text.find(TOOL_CALL_CLOSE, body_start)
        if end < 0:  # cut off: not a call
            outside.append(text[start:])
            break
        call = call_from_body(text[body_start:end], tool_names)
        if call is None:
            outside.append(text[start:end + len(TOOL_CALL_CLOSE)])
        else:
            calls.append(ToolCall(id_factory(), *call))
        pos = end + len(TOOL_CALL_CLOSE)
    return ParsedOutput("".join(outside).strip() or None, calls)


def call_from_body(body: str, tool_names: Optional[Collection[str]]) -> Optional[Tuple[str, str]]:
    """(name, arguments text) of one call object's text, or None if it is not one."""
    scanned = scan_object(body, _skip_ws(body, 0))
    if scanned is None or _skip_ws(body, scanned[1]) != len(body):
        return None
    return _call_from_members(body, scanned[0], tool_names)


def json_calls(text: str, tool_names: Optional[Collection[str]]) -> Optional[List[Tuple[str, str]]]:
    """The calls of an output that is, as a whole, one call object or a list of
    them, bare or in one fenced ```` ```json ```` block."""
    fenced = _JSON_FENCE.fullmatch(text)
    if fenced is not None:
        text = fenced.group(1)
    i = _skip_ws(text, 0)
    if i == len(text):
        return None
    if text[i] == "{":
        call = call_from_body(text, tool_names)
        return [call] if call else None
    if text[i] != "[":
        return None
    calls = []
    i = _skip_ws(text, i + 1)
    while i < len(text) and text[i] != "]":
        scanned = scan_object(text, i)
        if scanned is None:
            return None
        call = _call_from_members(text, scanned[0], tool_names)
        if call is None:
            return None
        calls.append(call)
        i = _skip_ws(text, scanned[1])
        if i < len(text) and text[i] == ",":
            i = _skip_ws(text, i + 1)
        elif i < len(text) and text[i] != "]":
            return None
    if i == len(text) or _skip_ws(text, i + 1) != len(text) or not calls:
        return None
    return calls


Member = Tuple[str, Any, int, int]  # key, value, start and end of the value's text


def scan_object(text: str, i: int) -> Optional[Tuple[List[Member], int]]:
    """The members of the JSON object starting at ``text[i]`` with their
    text spans, and the index after it; None if it is not a whole object."""
    if i >= len(text) or text[i] != "{":
        return None
    members: List[Member] = []
    i = _skip_ws(text, i + 1)
    if i < len(text) and text[i] == "}":
        return members, i + 1
    while True:
        try:
            key, i = _decoder.raw_decode(text, i)
            i = _skip_ws(text, i)
            if not isinstance(key, str) or i >= len(text) or text[i] != ":":
                return None
            start = _skip_ws(text, i + 1)
            value, end = _decoder.raw_decode(text, start)
        except (json.JSONDecodeError, IndexError, RecursionError):  # nested past the parser's depth: no call
            return None
        members.append((key, value, start, end))
        i = _skip_ws(text, end)
        if i < len(text) and text[i] == ",":
            i = _skip_ws(text, i + 1)
        elif i < len(text) and text[i] == "}":
            return members, i + 1
        else:
            return None


def _call_from_members(text: str, members: List[Member],
                       tool_names: Optional[Collection[str]]) -> Optional[Tuple[str, str]]:
    found = {key: (value, start, end) for key, value, start, end in members}
    name = found.get("name", (None,))[0]
    if not isinstance(name, str) or not name or (tool_names is not None and name not in tool_names):
        return None
    key = next((k for k in ARGUMENT_KEYS if k in found), None)
    if key is None:
        return name, "{}"
    value, start, end = found[key]
    if isinstance(value, dict):
        return name, text[start:end]
    if isinstance(value, str):  # arguments sent as JSON text
        try:
            inner = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            return None
        return (name, value) if isinstance(inner, dict) else None
    return None


def _skip_ws(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in " \t\n\r":
        i += 1
    return i
