"""OpenAI chat messages as chat templates expect them.

Templates index ``message.content`` as a string and read tool calls'
``arguments`` as an object (transformers' convention, which the GGUF
templates follow: Qwen2.5's writes ``tool_call.arguments | tojson``), while
OpenAI sends content as a string, a list of text parts or null, and
arguments as a JSON string.  :func:`template_messages` converts one into
the other and checks the structure, naming the bad field.

OpenAI's deprecated function messages become tool messages: an assistant's
``function_call`` a one-call ``tool_calls`` (its id made up: ``call_fn<i>``,
i the message's index), a
``function`` message the ``tool`` message answering it, so templates, which
know only tools, render both.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Sequence

from ..errors import InvalidPromptError

__all__ = ["template_messages", "ROLES"]

ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def template_messages(messages: Sequence[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """Checked copies of ``messages`` for a template: ``developer`` becomes
    ``system``, content a string, tool-call arguments objects (when they
    are a JSON object's text), and a ``tool`` message gets the ``name`` of
    the call it answers (several templates print it) when it has none;
    ``function_call`` and ``function`` messages as tool calls and results."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise InvalidPromptError("messages must be a non-empty list of message objects")
    out: List[Dict[str, Any]] = []
    call_names: Dict[str, str] = {}
    legacy_call = None  # the id made up for the assistant's function_call that function messages answer
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, Mapping):
            raise InvalidPromptError(f"{where} must be an object, got {type(msg).__name__}")
        role = msg.get("role")
        if role not in ROLES:
            raise InvalidPromptError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}")
        m = dict(msg)
        m["role"] = "system" if role == "developer" else role
        m["content"] = _content(msg.get("content"), f"{where}.content")
        if msg.get("function_call") is not None and role != "assistant":
            raise InvalidPromptError(f"{where}.function_call: only an assistant's message makes a call")
        if role != "function":  # a function message answers the call right before it
            legacy_call = None
        if role == "assistant" and msg.get("function_call") is not None:
            if msg.get("tool_calls"):
                raise InvalidPromptError(f"{where} has both tool_calls and function_call: give one")
            legacy_call = f"call_fn{i}"
            call = {"id": legacy_call, "type": "function", "function": msg["function_call"]}
            m["tool_calls"] = [_tool_call(call, where, call_names, fn_where=f"{where}.function_call")]
        elif role == "assistant" and msg.get("tool_calls"):
            m["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]", call_names)
                               for j, c in enumerate(_list(msg["tool_calls"], f"{where}.tool_calls"))]
        elif "tool_calls" in m:
            del m["tool_calls"]  # null or empty: templates test `message.tool_calls`
        m.pop("function_call", None)
        if role == "function":
            if not isinstance(msg.get("name"), str) or not msg["name"]:
                raise InvalidPromptError(f"{where}.name must name the function whose result this is")
            m["role"] = "tool"
            if legacy_call is not None:
                m.setdefault("tool_call_id", legacy_call)
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if call_id is not None and not isinstance(call_id, str):
                raise InvalidPromptError(f"{where}.tool_call_id must be a string")
            if not m.get("name") and call_id in call_names:
                m["name"] = call_names[call_id]
        out.append(m)
    return out


def _list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise InvalidPromptError(f"{where} must be a list, got {type(value).__name__}")
    return value


def _content(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidPromptError(f"{where}[{j}]: only text content parts are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidPromptError(f"{where} must be a string, a list of text parts or null, got {type(content).__name__}")


def _tool_call(call: Any, where: str, call_names: Dict[str, str], fn_where: str = "") -> Dict[str, Any]:
    """``call`` (at ``where``; its function at ``fn_where``, by default
    ``where.function``) as templates read it."""
    if not isinstance(call, Mapping):
        raise InvalidPromptError(f"{where} must be an object")
    fn_where = fn_where or f"{where}.function"
    fn = call.get("function")
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise InvalidPromptError(f"{fn_where}.name must be a non-empty string")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            parsed = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            parsed = None
        # Text that is not a JSON object stays text: the model wrote it so.
        args = parsed if isinstance(parsed, dict) else args
    elif not isinstance(args, Mapping):
        raise InvalidPromptError(f"{fn_where}.arguments must be a JSON string or an object")
    out = dict(call)
    out["type"] = call.get("type", "function")
    out["function"] = dict(fn, arguments=args)
    if isinstance(call.get("id"), str):
        call_names[call["id"]] = fn["name"]
    return out
