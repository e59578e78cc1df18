"""What a request asks of its output's shape: a grammar, tools, a tool choice.

:func:`output_spec` reads ``response_format``, llama.cpp's ``grammar`` and
``json_schema``, vLLM's ``structured_outputs`` (and its older ``guided_*``
fields) and, on chat, ``tools``, ``tool_choice`` and
``parallel_tool_calls`` (or the deprecated ``functions`` and
``function_call``: tools answered in the old shape, one call at most);
every error is a 400 naming the field.
:func:`settle_tools` decides whether tools a request may not call are in
its prompt, :func:`settle_reasoning` whether its thinking is answered
apart; :func:`compile_constraint` compiles the grammar (cached per grammar)
before the request is queued, so an invalid schema or grammar is refused
without reaching the decoder.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from ..chat import (
    FunctionSpec,
    ToolChoice,
    calls_after_open,
    resolve_function_call,
    resolve_tool_choice,
    tool_call_grammar,
    validate_tools,
)
from ..chat.reasoning import ThinkingTokens, has_thinking_tags, opens_thinking
from ..chat.tools import TOOL_CALL_OPEN
from ..constraints import Grammar, JsonLayout, Triggered, from_response_format
from ..errors import InvalidGrammarError, InvalidToolsError
from ..params import SamplingParams
from .errors import RequestError

__all__ = ["OutputSpec", "output_spec", "settle_tools", "settle_reasoning", "with_banned_call",
           "compile_constraint"]


@dataclass
class OutputSpec:
    """The grammar a request's output must match (None: free text), the
    field it came from, and the tools whose calls are parsed out of it."""

    grammar: Optional[Union[Grammar, Triggered]] = None
    param: Optional[str] = None
    #: "auto" with tools: what follows a call's opening tag (Triggered by it once the tag's token is known)
    calls: Optional[Grammar] = None
    functions: List[FunctionSpec] = field(default_factory=list)
    choice: ToolChoice = field(default_factory=lambda: ToolChoice("none"))
    parallel: bool = True
    tools: Optional[List[dict]] = None  # as the chat template gets them (None: no tools offered)
    #: tool_choice "none" with the tools in the prompt: the call's opening tag (one token), banned
    banned_call: Optional[int] = None
    #: a reasoning model's thinking told apart (chat.reasoning): "start" (a block at the output's start),
    #: "inside" (the prompt opened it), None (not read)
    reasoning: Optional[str] = None
    #: the tools came as the deprecated ``functions``: a call is answered as ``function_call``
    legacy: bool = False

    @property
    def calls_key(self) -> str:
        """The field, and finish reason, of the calls in an answer."""
        return "function_call" if self.legacy else "tool_calls"

    @property
    def parses_calls(self) -> bool:
        """Whether the output is read for tool calls."""
        return self.choice.mode != "none" and bool(self.functions)

    @property
    def thinking_ends(self) -> Tuple[str, ...]:
        """Tags that end a reasoning model's thinking besides ``</think>``: a call's opening tag when calls
        are read (the engine holds a call to its schema wherever it opens)."""
        return (TOOL_CALL_OPEN,) if self.parses_calls else ()

    def thinking_tokens(self) -> Optional[ThinkingTokens]:
        """A fresh reader of which output tokens are thinking, when the thinking is answered apart."""
        return ThinkingTokens(inside=self.reasoning == "inside", ends=self.thinking_ends) if self.reasoning else None

    @property
    def tool_names(self) -> List[str]:
        return [f.name for f in self.functions]

    @property
    def grammar_param(self) -> Optional[str]:
        """The field an error of the grammar names: a ``response_format``'s schema by its own path."""
        grammar = self.grammar.grammar if isinstance(self.grammar, Triggered) else self.grammar
        if self.param == "response_format" and grammar is not None and grammar.kind == "json_schema":
            return "response_format.json_schema.schema"
        return self.param


#: vLLM's kinds of constraint with a value, by their names in ``structured_outputs`` (``guided_<kind>`` before).
_VLLM_KINDS: Dict[str, Callable[[Any], Grammar]] = {
    "json": Grammar.json_schema, "regex": Grammar.regex, "choice": Grammar.choice, "grammar": Grammar.gbnf_or_lark}
#: The top-level fields that take a grammar, each as a grammar: llama-server's, then vLLM's older spellings.
_GRAMMAR_FIELDS: Tuple[Tuple[str, Callable[[Any], Grammar]], ...] = (
    ("json_schema", Grammar.json_schema), ("grammar", Grammar.gbnf),
    *((f"guided_{kind}", make) for kind, make in _VLLM_KINDS.items()))


def output_spec(body: Any, *, chat: bool) -> OutputSpec:
    """The output specification of a request body (400 for a bad one)."""
    grammars: List[Tuple[str, Grammar]] = []
    param = "response_format"
    try:
        if body.response_format is not None:
            g = from_response_format(body.response_format.as_dict())
            if g is not None:
                grammars.append((param, g))
        if body.structured_outputs is not None:
            param, g = _structured_outputs(body.structured_outputs)
            grammars.append((param, g))
        for param, make in _GRAMMAR_FIELDS:
            value = getattr(body, param)
            if value is not None:
                grammars.append((param, make(value)))
    except InvalidGrammarError as exc:
        raise RequestError(400, str(exc), param=exc.param or param, code="invalid_grammar") from None
    if len(grammars) > 1:
        raise RequestError(400, f"{grammars[0][0]} and {grammars[1][0]} both constrain the output: give one",
                           param=grammars[1][0])
    spec = OutputSpec(grammar=grammars[0][1], param=grammars[0][0]) if grammars else OutputSpec()
    if not chat:
        return spec
    try:
        if body.functions is not None or body.function_call is not None:
            raw_tools = _legacy_functions(body, spec)
        else:
            raw_tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools is not None else None
            raw_choice = body.tool_choice.model_dump() if hasattr(body.tool_choice, "model_dump") else body.tool_choice
            spec.functions = validate_tools(raw_tools)
            spec.choice = resolve_tool_choice(raw_choice, spec.functions)
            spec.parallel = body.parallel_tool_calls is not False
    except InvalidToolsError as exc:
        raise RequestError(400, str(exc), param=exc.param, code="invalid_tools") from None
    spec.tools = raw_tools or None
    forced = tool_call_grammar(spec.functions, spec.choice, parallel_tool_calls=spec.parallel)
    if forced is not None:
        # The call is this turn's answer; a response_format shapes a later, textual one.
        spec.grammar, spec.param = forced, "tools"
    elif spec.choice.mode == "auto" and spec.functions and spec.grammar is None:
        spec.calls = calls_after_open(spec.functions, parallel_tool_calls=spec.parallel)
    return spec


def _legacy_functions(body: Any, spec: OutputSpec) -> Optional[List[dict]]:
    """``functions`` and ``function_call`` into ``spec``: OpenAI's tools
    before there were tools, one call per answer; returns them as tools
    (InvalidToolsError for a bad one, or for a mix with the newer fields)."""
    newer = [name for name in ("tools", "tool_choice") if getattr(body, name) is not None]
    if newer or body.parallel_tool_calls:
        older = "functions" if body.functions is not None else "function_call"
        raise InvalidToolsError(f"{older} (deprecated) does not mix with {newer[0] if newer else 'parallel_tool_calls'}"
                                ": give tools and tool_choice, or functions and function_call (one call per answer)",
                                param=older)
    raw = [f.model_dump(exclude_none=True) for f in body.functions] if body.functions is not None else None
    call = body.function_call.model_dump() if hasattr(body.function_call, "model_dump") else body.function_call
    spec.functions = validate_tools(raw, field="functions")
    spec.choice = resolve_function_call(call, spec.functions)
    spec.legacy, spec.parallel = True, False
    return [{"type": "function", "function": f} for f in raw] if raw is not None else None


def _structured_outputs(so: Any) -> Tuple[str, Grammar]:
    """vLLM's ``structured_outputs`` as (the field it came from, its grammar)."""
    (kind, value), = so.given().items()
    layout: JsonLayout = "flexible" if so.disable_any_whitespace is False else "spaced"
    param = f"structured_outputs.{kind}"
    try:
        if kind == "json_object":
            return param, Grammar.json_object(layout=layout)
        if kind == "json":
            return param, Grammar.json_schema(value, layout=layout)
        return param, _VLLM_KINDS[kind](value)
    except InvalidGrammarError as exc:
        raise InvalidGrammarError(str(exc), param=param) from None


def settle_tools(dec: Any, spec: OutputSpec) -> None:
    """With ``tool_choice`` "none" the tools stay in the prompt, as OpenAI's (and llama-server's and
    vLLM's): the model knows them, and an agent's last, answering turn shares the cached prompt of the
    turns that called them.  The call's opening tag is then banned (:func:`with_banned_call`), so the
    answer is text; when the tokenizer splits the tag, nothing could stop a call, and the tools are left
    out of the prompt instead."""
    if spec.choice.mode != "none" or not spec.tools:
        return
    tag = dec.tokenizer.tokenize(TOOL_CALL_OPEN, add_special=False, parse_special=True)
    if len(tag) == 1:
        spec.banned_call = tag[0]
    else:
        spec.tools = None


def settle_reasoning(dec: Any, spec: OutputSpec, prompt: str, reasoning_format: str) -> None:
    """Whether the chat output's thinking is answered apart (``reasoning_format`` "auto", llama-server's
    "deepseek"; only for a model whose vocabulary has the tags), from the rendered ``prompt``: a template
    that opens the block leaves the output inside it, unless a grammar shapes the whole output (a JSON
    schema, a forced call), which leaves the model no thinking to do."""
    if reasoning_format == "none" or not has_thinking_tags(dec.tokenizer):
        return
    if not opens_thinking(prompt):
        spec.reasoning = "start"
    elif spec.grammar is None:  # free text, or calls parsed (or triggered) within it
        spec.reasoning = "inside"


def with_banned_call(params: SamplingParams, spec: OutputSpec) -> SamplingParams:
    """``params`` with the call's opening tag banned when ``spec`` asks it: OpenAI's ban, a logit bias of
    -100 (over any bias the request gave that token), in the target's and the draft's rows alike, so
    decoding stays exact for the distribution so changed."""
    if spec.banned_call is None:
        return params
    return replace(params, logit_bias={**dict(params.bias_pairs), spec.banned_call: -100.0})


def compile_constraint(dec: Any, spec: OutputSpec) -> None:
    """Compile ``spec``'s grammar for ``dec``'s vocabulary (cached: the
    request compiles nothing again); 400 naming the field if it is invalid.
    Blocking (up to tens of milliseconds for a large schema): run it off the
    event loop."""
    if spec.calls is not None:
        # "auto": a call the model opens is held to its tools' schemas, when the opening tag is one token
        # (llama.cpp's lazy grammar); a tag the tokenizer splits leaves calls free, parsed afterwards.
        tag = dec.tokenizer.tokenize(TOOL_CALL_OPEN, add_special=False, parse_special=True)
        if len(tag) == 1:
            spec.grammar, spec.param = Triggered(spec.calls, tag[0]), "tools"
    if spec.grammar is None:
        return
    grammar = spec.grammar.grammar if isinstance(spec.grammar, Triggered) else spec.grammar
    try:
        dec.grammar_state(grammar)
    except InvalidGrammarError as exc:
        raise RequestError(400, str(exc), param=spec.grammar_param, code="invalid_grammar") from None
