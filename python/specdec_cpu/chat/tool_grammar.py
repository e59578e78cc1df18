"""The grammar that makes an output tool calls (``tool_choice`` "required"
or a named function), in Qwen2.5's / Hermes' format::

    <tool_call>
    {"name": "<one of the names>", "arguments": <that function's parameters>}
    </tool_call>

one call, or several separated by a newline when ``parallel_tool_calls``;
under "auto", the same from a call's opening tag on (``calls_after_open``),
the text before it free.
It is a Lark grammar for llguidance, each function's call object embedded
with ``%json`` (its name a ``const``, its arguments the function's
parameter schema), laid out as Qwen's template writes calls (``", "`` and
``": "``), so the tags, keys and the name once chosen are forced tokens.
The output ends (EOS allowed) only after a complete call.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Optional, Sequence

from ..constraints import Grammar
from ..constraints.grammar import json_options
from .tool_specs import FunctionSpec, ToolChoice
from .tools import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

__all__ = ["tool_call_grammar", "calls_after_open", "call_schema"]

_DEFS = ("$defs", "definitions")


def call_schema(function: FunctionSpec) -> Dict[str, Any]:
    """The JSON schema of one call object of ``function``.

    The parameters' ``$defs``/``definitions`` move to the call schema's
    root, so their ``#/$defs/...`` references still resolve.
    """
    params = dict(function.parameters)
    hoisted = {key: params.pop(key) for key in _DEFS if key in params}
    schema: Dict[str, Any] = {
        "x-guidance": json_options("spaced"),
        "type": "object",
        "properties": {"name": {"const": function.name}, "arguments": params},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
    schema.update(hoisted)
    return schema


def tool_call_grammar(functions: Sequence[FunctionSpec], choice: ToolChoice, *,
                      parallel_tool_calls: bool = True) -> Optional[Grammar]:
    """The grammar ``choice`` imposes on the whole output, or None when it
    imposes none ("none": the caller drops the tools; "auto": free text or
    calls, see ``calls_after_open``)."""
    if not choice.forces_call:
        return None
    chosen = [f for f in functions if choice.mode == "required" or f.name == choice.name]
    if not chosen:
        raise ValueError(f"tool choice {choice} selects none of the functions")
    return _calls(chosen, parallel_tool_calls, opened=False)


def calls_after_open(functions: Sequence[FunctionSpec], *, parallel_tool_calls: bool = True) -> Grammar:
    """What must follow the opening tag of a call the model chose to write
    (``tool_choice`` "auto"): the rest of that call, then more calls or the
    end.  Applied from the tag on (``constraints.Triggered``), it leaves the
    text before a call free and makes every call well formed."""
    if not functions:
        raise ValueError("no functions to call")
    return _calls(functions, parallel_tool_calls, opened=True)


def _calls(chosen: Sequence[FunctionSpec], parallel: bool, *, opened: bool) -> Grammar:
    rules = [f"fn_{i}: %json {json.dumps(call_schema(f), ensure_ascii=False)}" for i, f in enumerate(chosen)]
    open_tag = json.dumps(TOOL_CALL_OPEN + "\n")
    close_tag = json.dumps("\n" + TOOL_CALL_CLOSE)
    first = f'"\\n" body {close_tag}' if opened else "call"  # opened: the tag is out, its newline follows
    lines = [
        f'start: {first} ("\\n" call)*' if parallel else f"start: {first}",
        f"call: {open_tag} body {close_tag}",
        "body: " + " | ".join(f"fn_{i}" for i in range(len(chosen))),
        *rules,
    ]
    return Grammar.lark("\n".join(lines) + "\n")
