"""Checking a request's ``tools`` and ``tool_choice`` (OpenAI's shapes), and
their deprecated forerunners ``functions`` and ``function_call``.

Every error is an InvalidToolsError whose message and ``param`` name the
bad field (``tools[1].function.name``, ``functions[1].name``), for an HTTP
400 before anything is queued.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..errors import InvalidToolsError

__all__ = ["FunctionSpec", "ToolChoice", "validate_tools", "resolve_tool_choice", "resolve_function_call",
           "NAME_PATTERN"]

#: OpenAI's rule for function names (it also keeps names free of JSON escapes).
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")

#: What an omitted ``parameters`` means: a function without arguments.
NO_PARAMETERS: Dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class FunctionSpec:
    """One offered function."""

    name: str
    description: Optional[str]
    parameters: Mapping[str, Any]
    strict: bool = False


@dataclass(frozen=True)
class ToolChoice:
    """``mode`` is "none", "auto", "required" or "function" (then ``name``)."""

    mode: str
    name: Optional[str] = None

    @property
    def forces_call(self) -> bool:
        """The output must be tool calls (a grammar applies)."""
        return self.mode in ("required", "function")


def validate_tools(tools: Optional[Sequence[Any]], *, field: str = "tools") -> List[FunctionSpec]:
    """The functions of ``tools`` (None or [] gives []), each checked:
    ``type`` "function", a ``function.name`` matching ``NAME_PATTERN`` and
    unique, an optional string ``description``, ``parameters`` a JSON
    schema of an object (llguidance must be able to compile it).

    ``field="functions"``: OpenAI's deprecated list of the function objects
    themselves (``functions[i].name``), checked alike."""
    if tools is None:
        return []
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise InvalidToolsError(f"{field} must be a list", param=field)
    out: List[FunctionSpec] = []
    seen: Dict[str, int] = {}
    for i, tool in enumerate(tools):
        where = f"{field}[{i}]"
        if not isinstance(tool, Mapping):
            raise InvalidToolsError(f"{where} must be an object", param=where)
        fn: Any = tool
        if field != "functions":
            if tool.get("type", "function") != "function":
                raise InvalidToolsError(f"{where}.type must be 'function', got {tool.get('type')!r}",
                                        param=f"{where}.type")
            fn = tool.get("function")
            if not isinstance(fn, Mapping):
                raise InvalidToolsError(f"{where}.function must be an object", param=f"{where}.function")
            where = f"{where}.function"
        name = fn.get("name")
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise InvalidToolsError(f"{where}.name must be 1-64 letters, digits, '_' or '-', got {name!r}",
                                    param=f"{where}.name")
        if name in seen:
            raise InvalidToolsError(f"{where}.name {name!r} repeats {field}[{seen[name]}]",
                                    param=f"{where}.name")
        seen[name] = i
        description = fn.get("description")
        if description is not None and not isinstance(description, str):
            raise InvalidToolsError(f"{where}.description must be a string",
                                    param=f"{where}.description")
        params = _parameters(fn.get("parameters"), f"{where}.parameters")
        out.append(FunctionSpec(name, description, params, bool(fn.get("strict", False))))
    return out


def _parameters(params: Any, where: str) -> Mapping[str, Any]:
    if params is None:
        return NO_PARAMETERS
    if not isinstance(params, Mapping):
        raise InvalidToolsError(f"{where} must be a JSON schema object, got {type(params).__name__}", param=where)
    if params.get("type", "object") != "object":
        raise InvalidToolsError(f"{where} must describe an object (type 'object'), got type {params.get('type')!r}",
                                param=where)
    from llguidance import LLMatcher

    try:
        problem = LLMatcher.validate_grammar(LLMatcher.grammar_from_json_schema(dict(params)))
    except ValueError as exc:
        problem = str(exc)
    if problem:
        raise InvalidToolsError(f"{where} is not a usable JSON schema: {problem.strip()}", param=where)
    return params


def resolve_tool_choice(tool_choice: Any, functions: Sequence[FunctionSpec]) -> ToolChoice:
    """OpenAI's ``tool_choice``: None (then "auto" with tools, else
    "none"), "none", "auto", "required", or ``{"type": "function",
    "function": {"name": ...}}`` naming an offered function."""
    if tool_choice is None:
        return ToolChoice("auto" if functions else "none")
    if isinstance(tool_choice, str):
        if tool_choice not in ("none", "auto", "required"):
            raise InvalidToolsError(f"tool_choice must be 'none', 'auto', 'required' or a function, "
                                    f"got {tool_choice!r}", param="tool_choice")
        if tool_choice == "required" and not functions:
            raise InvalidToolsError("tool_choice 'required' needs tools", param="tool_choice")
        return ToolChoice(tool_choice)
    if not isinstance(tool_choice, Mapping) or tool_choice.get("type") != "function":
        raise InvalidToolsError('tool_choice must be a string or {"type": "function", "function": {"name": ...}}',
                                param="tool_choice")
    fn = tool_choice.get("function")
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str):
        raise InvalidToolsError("tool_choice.function.name must be a string", param="tool_choice.function.name")
    names = [f.name for f in functions]
    if name not in names:
        offered = ", ".join(names) if names else "none"
        raise InvalidToolsError(f"tool_choice names function {name!r}, which is not in tools (offered: {offered})",
                                param="tool_choice.function.name")
    return ToolChoice("function", name)


def resolve_function_call(function_call: Any, functions: Sequence[FunctionSpec]) -> ToolChoice:
    """OpenAI's deprecated ``function_call``: None (then "auto" with
    functions, else "none"), "none", "auto", or ``{"name": ...}`` naming an
    offered function."""
    if function_call is None or function_call in ("none", "auto"):
        return resolve_tool_choice(function_call, functions)
    name = function_call.get("name") if isinstance(function_call, Mapping) else None
    if not isinstance(name, str):
        raise InvalidToolsError(f"function_call must be 'none', 'auto' or {{\"name\": ...}}, got {function_call!r}",
                                param="function_call")
    names = [f.name for f in functions]
    if name not in names:
        offered = ", ".join(names) if names else "none"
        raise InvalidToolsError(f"function_call names function {name!r}, which is not in functions "
                                f"(offered: {offered})", param="function_call.name")
    return ToolChoice("function", name)
