"""Tool calls parsed while the output streams, as OpenAI chunk deltas.

:class:`ToolCallStreamParser` is fed text pieces (any split, even inside a
tag) and returns the deltas to send:

* ``{"content": "..."}`` for text outside calls (whitespace around it held
  back, so the pieces add up to ``parse_tool_calls``'s stripped content);
* ``{"tool_calls": [{"index": i, "id": ..., "type": "function",
  "function": {"name": ..., "arguments": ""}}]}`` once a call's name is
  known, then ``{"tool_calls": [{"index": i, "function": {"arguments":
  "..."}}]}`` with each new piece of its arguments object.

A call whose arguments come before its name, or are not an object, is held
until its closing tag and sent whole; one that turns out not to be a call
is sent as content, as ``parse_tool_calls`` does.  For well-formed output
the deltas reassemble to ``parse_tool_calls``'s result.  A call whose
header was sent cannot be taken back: if it ends malformed or is cut off,
its arguments stay as sent (as OpenAI streams a call cut by ``max_tokens``).
A call cut off after its name and before its arguments is a call with
none; a call object cut off before its name was whole is dropped (call
markup, not text).
An output that starts with ``{``, ``[`` or ```` ```json ```` is held
when ``json_fallback`` (it may be a call written as bare or fenced JSON)
until its first JSON value is whole: then it is sent as content if that
value is not calls or other text follows it, else held to the end.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Collection, Dict, List, Optional

from .tools import (
    ARGUMENT_KEYS,
    JSON_FENCE_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    call_from_body,
    json_calls,
    new_call_id,
    parse_tool_calls,
)

__all__ = ["ToolCallStreamParser"]

_decoder = json.JSONDecoder()
Delta = Dict[str, Any]
FENCE = "```"


class ToolCallStreamParser:
    """An incremental state machine: content, inside a call, or holding all."""

    def __init__(self, *, tool_names: Optional[Collection[str]] = None, json_fallback: bool = True,
                 id_factory: Callable[[], str] = new_call_id) -> None:
        self._names = tool_names
        self._fallback = json_fallback
        self._new_id = id_factory
        self._state = "start"  # start | content | call | hold_all | done
        self._buf = ""  # content not yet sent, or the current call's body, or everything (hold_all)
        self._pending_ws = ""
        self._sent_content = False
        self._n_calls = 0
        self._out: List[Delta] = []
        # the current call
        self._header_sent = False
        self._held = False  # its name is not one offered: decided at its close
        self._args_pos = -1  # where its arguments object starts in _buf, once streaming
        self._args_sent = 0  # characters of it sent
        self._args_scan = _ObjectEnd()
        # an output held because it starts as JSON: where its first value starts and ends in _buf
        self._value_start = -1
        self._value_end = -1
        self._value_scan = _ObjectEnd()
        self._fenced = self._fence_closed = False
        self._pos = -1  # how far _may_be_calls has read

    @property
    def n_calls(self) -> int:
        """Tool calls started so far."""
        return self._n_calls

    def feed(self, text: str) -> List[Delta]:
        """The deltas ``text`` completes (possibly none)."""
        if self._state == "done":
            raise RuntimeError("feed() after finish()")
        self._buf += text
        self._run()
        return self._take()

    def finish(self) -> List[Delta]:
        """The deltas left at the end of the output (held text, a cut-off block)."""
        if self._state == "hold_all":
            parsed = parse_tool_calls(self._buf, tool_names=self._names, json_fallback=True, id_factory=self._new_id)
            if parsed.content:
                self._out.append({"content": parsed.content})
            for call in parsed.tool_calls:
                self._header(call.name, call.id)
                self._args(call.arguments)
        elif self._state == "call":
            if not self._header_sent:
                self._cut_call()
        else:
            self._content(self._buf, final=True)
        self._buf = ""
        self._state = "done"
        return self._take()

    def _cut_call(self) -> None:
        """A call cut off before its header was sent."""
        name = _cut_name(self._buf)
        offered = name is not None and (self._names is None or name in self._names)
        body = self._buf.lstrip()
        if name is not None and offered and not self._held:
            self._header(name, self._new_id())  # cut off after its name: a call, no arguments written yet
        elif self._held or name is not None or (body and not body.startswith("{")):
            self._content(TOOL_CALL_OPEN + self._buf, final=True)  # a function not offered, or no call: text
        # else a call object cut off before its name was whole: markup, and not yet a call: nothing

    # -- the machine -------------------------------------------------------

    def _run(self) -> None:
        while True:
            if self._state == "start":
                stripped = self._buf.lstrip()
                if not stripped or (self._fallback and JSON_FENCE_OPEN.startswith(stripped)):
                    return  # too little to tell yet
                json_like = stripped[0] in "{[" or stripped.startswith(JSON_FENCE_OPEN)
                self._state = "hold_all" if self._fallback and json_like else "content"
            elif self._state == "content":
                at = self._buf.find(TOOL_CALL_OPEN)
                if at < 0:
                    keep = _partial_tag(self._buf, TOOL_CALL_OPEN)
                    self._content(self._buf[:len(self._buf) - keep])
                    self._buf = self._buf[len(self._buf) - keep:]
                    return
                self._content(self._buf[:at])
                self._buf = self._buf[at + len(TOOL_CALL_OPEN):]
                self._start_call()
            elif self._state == "call":
                if not self._in_call():
                    return
            else:  # hold_all
                if self._may_be_calls():
                    return
                self._state = "content"  # a JSON value that is not calls, or text after one: send it

    def _may_be_calls(self) -> bool:
        """Whether the held output may still be calls written as JSON
        (``parse_tool_calls``'s fallback takes only an output that is one call
        object or a list of them, bare or in one ```` ```json ```` fence):
        False once its first JSON value is whole and is not calls, or other
        text follows it.  ``_pos`` keeps how far it has read: each character
        is read once."""
        text = self._buf
        if self._value_start < 0:
            if self._pos < 0:  # where the value may start: after the fence's line, if there is one
                i = len(text) - len(text.lstrip())  # as the start state saw it (the fence's regex takes any \s)
                self._fenced = text.startswith(JSON_FENCE_OPEN, i)
                if self._fenced:
                    line_end = text.find("\n", i)
                    if line_end < 0:
                        return True
                    if text[i + len(JSON_FENCE_OPEN):line_end].strip(" \t"):
                        return False  # "```jsonc" and the like: no fence the fallback reads
                    i = line_end + 1
                self._pos = i
            self._pos = _ws(text, self._pos)
            if self._pos == len(text):
                return True
            if text[self._pos] not in "{[":
                return False
            self._value_start = self._value_end = self._pos
        if not self._value_scan.done:
            self._value_end += self._value_scan.feed(text[self._value_end:])
            if not self._value_scan.done:
                return True
            if json_calls(text[self._value_start:self._value_end], self._names) is None:
                return False
            self._pos = self._value_end
        if not self._fence_closed:  # JSON whitespace, then the closing fence if there is one
            self._pos = _ws(text, self._pos)
            if not self._fenced or self._pos == len(text):
                return self._pos == len(text)
            if not text.startswith(FENCE, self._pos):
                return FENCE.startswith(text[self._pos:])  # a fence's first backticks, or other text
            self._fence_closed = True
            self._pos += len(FENCE)
        while self._pos < len(text) and text[self._pos].isspace():  # after the fence: any whitespace (\s)
            self._pos += 1
        return self._pos == len(text)

    def _start_call(self) -> None:
        self._state = "call"
        self._header_sent = False
        self._held = False
        self._args_pos = -1
        self._args_sent = 0
        self._args_scan = _ObjectEnd()

    def _in_call(self) -> bool:
        """Advance inside a call; True when it closed (state is content again)."""
        end = self._buf.find(TOOL_CALL_CLOSE)
        body = self._buf if end < 0 else self._buf[:end]
        if not self._header_sent and not self._held:
            found = _header(body)
            if found is not None:
                name, args_pos = found
                if self._names is None or name in self._names:
                    self._header(name, self._new_id())
                    self._args_pos = args_pos
                else:
                    self._held = True
        if self._args_pos >= 0 and not self._args_scan.done:
            fresh = body[self._args_pos + self._args_sent:]
            take = self._args_scan.feed(fresh)
            if take:
                self._args(fresh[:take])
                self._args_sent += take
        if end < 0:
            return False
        if not self._header_sent:
            call = call_from_body(body, self._names)
            if call is None:
                self._content(TOOL_CALL_OPEN + body + TOOL_CALL_CLOSE)
            else:
                self._header(call[0], self._new_id())
                self._args(call[1])
        self._buf = self._buf[end + len(TOOL_CALL_CLOSE):]
        self._state = "content"
        return True

    # -- output ------------------------------------------------------------

    def _content(self, text: str, final: bool = False) -> None:
        text = self._pending_ws + text
        if not self._sent_content:
            text = text.lstrip()
        body = text.rstrip()
        self._pending_ws = "" if final else text[len(body):]
        if body:
            self._out.append({"content": body})
            self._sent_content = True

    def _header(self, name: str, call_id: str) -> None:
        self._header_sent = True
        self._out.append({"tool_calls": [{"index": self._n_calls, "id": call_id, "type": "function",
                                          "function": {"name": name, "arguments": ""}}]})
        self._n_calls += 1

    def _args(self, text: str) -> None:
        if text:
            self._out.append({"tool_calls": [{"index": self._n_calls - 1, "function": {"arguments": text}}]})

    def _take(self) -> List[Delta]:
        out, self._out = _merge(self._out), []
        return out


def _cut_name(body: str) -> Optional[str]:
    """The name of a call cut off before its arguments: ``body`` opens an object whose first key is
    ``"name"`` with a whole string value; None otherwise."""
    i = _ws(body, 0)
    if i >= len(body) or body[i] != "{":
        return None
    try:
        key, i = _decoder.raw_decode(body, _ws(body, i + 1))
        i = _ws(body, i)
        if key != "name" or body[i:i + 1] != ":":
            return None
        name, _ = _decoder.raw_decode(body, _ws(body, i + 1))
    except (ValueError, IndexError):
        return None
    return name if isinstance(name, str) else None


def _header(body: str) -> Optional[tuple]:
    """(name, where the arguments object starts) once ``body`` has shown a
    ``"name"`` string and then an arguments key whose value opens with
    ``{``; None while that is not (yet) so."""
    i = _ws(body, 0)
    if i >= len(body) or body[i] != "{":
        return None
    i, name = i + 1, None
    while True:
        i = _ws(body, i)
        try:
            key, i = _decoder.raw_decode(body, i)
            i = _ws(body, i)
            if body[i] != ":":
                return None
            i = _ws(body, i + 1)
            if key in ARGUMENT_KEYS and body[i] == "{":
                return (name, i) if isinstance(name, str) and name else None
            value, i = _decoder.raw_decode(body, i)
            i = _ws(body, i)
            if body[i] != ",":
                return None
            i += 1
        except (json.JSONDecodeError, IndexError, RecursionError):  # incomplete (or not JSON: decided at the close)
            return None
        if key == "name":
            name = value


class _ObjectEnd:
    """Finds where a JSON object ends in text fed piece by piece."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.done = False

    def feed(self, text: str) -> int:
        """How many characters of ``text`` belong to the object."""
        for i, ch in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.done = True
                    return i + 1
        return len(text)


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that starts ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\n\r":
        i += 1
    return i


def _merge(deltas: List[Delta]) -> List[Delta]:
    """Adjacent content deltas, and adjacent argument pieces of one call, as one."""
    out: List[Delta] = []
    for d in deltas:
        prev = out[-1] if out else None
        if prev and "content" in d and "content" in prev:
            prev["content"] += d["content"]
        elif (prev and "tool_calls" in d and "tool_calls" in prev and "id" not in d["tool_calls"][0]
              and "id" not in prev["tool_calls"][0]  # the header keeps arguments ""
              and prev["tool_calls"][0]["index"] == d["tool_calls"][0]["index"]):
            prev["tool_calls"][0]["function"]["arguments"] += d["tool_calls"][0]["function"]["arguments"]
        else:
            out.append(d)
    return out
