"""Chat prompts and tool calls.

* :class:`ChatTemplate` (template.py) -- a GGUF's own Jinja chat template
  rendered as transformers does (sandboxed), with tools, tool calls and
  tool results; a ``--chat-template`` file or text overrides it.
* :func:`template_messages` (messages.py) -- OpenAI messages checked and
  shaped for templates.
* :func:`parse_tool_calls` (tools.py) -- a whole output as content plus
  OpenAI ``tool_calls`` (Qwen2.5 / Hermes ``<tool_call>`` blocks, or bare
  JSON calls); :class:`ToolCallStreamParser` (tool_stream.py) -- the same
  while streaming, as OpenAI chunk deltas.
* :class:`ReasoningSplitter` (reasoning.py) -- a reasoning model's
  ``<think>`` block told apart from its answer, while streaming.
* :func:`validate_tools`, :func:`resolve_tool_choice` (tool_specs.py) --
  a request's ``tools`` and ``tool_choice`` checked (and
  :func:`resolve_function_call`, OpenAI's deprecated ``function_call``).
* :func:`tool_call_grammar` (tool_grammar.py) -- the constraint for
  ``tool_choice`` "required" or a named function; :func:`calls_after_open`
  the one for "auto", from a call's opening tag on.
"""

from __future__ import annotations

from .messages import template_messages
from .reasoning import ReasoningSplitter, opens_thinking
from .template import ChatTemplate, load_template_source
from .tool_grammar import call_schema, calls_after_open, tool_call_grammar
from .tool_specs import FunctionSpec, ToolChoice, resolve_function_call, resolve_tool_choice, validate_tools
from .tool_stream import ToolCallStreamParser
from .tools import ParsedOutput, ToolCall, new_call_id, parse_tool_calls

__all__ = [
    "ChatTemplate",
    "load_template_source",
    "template_messages",
    "ToolCall",
    "ParsedOutput",
    "parse_tool_calls",
    "new_call_id",
    "ToolCallStreamParser",
    "ReasoningSplitter",
    "opens_thinking",
    "FunctionSpec",
    "ToolChoice",
    "validate_tools",
    "resolve_tool_choice",
    "resolve_function_call",
    "tool_call_grammar",
    "calls_after_open",
    "call_schema",
]
