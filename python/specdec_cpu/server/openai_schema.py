"""The OpenAI request bodies the server accepts, and what they become.

Pydantic models validate every field (a bad value is a 400 that names the
field) and are what ``/openapi.json`` documents, constraints included.
Fields are strict JSON types (``"0.5"`` is not a number), read as JSON
Schema reads them: a number with no fractional part (``4.0``) is an integer.
Every sampling
field takes ``null`` for its default, as llama-server and vLLM do; the
fields the server knows but does not honour, and the harmless ones it
ignores, come from :mod:`.unsupported`; any other field is refused.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Dict, List, Literal, Optional, Tuple, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.functional_validators import BeforeValidator
from typing_extensions import Annotated

from ..chat.reasoning import ReasoningFormat
from ..core.logprobs import MAX_TOP_LOGPROBS
from ..core.request_args import GAMMA_LIMIT
from ..params import BIAS_LIMIT, COUNT_LIMIT, PENALTY_LIMIT, REPEAT_PENALTY_LIMIT, SamplingParams
from . import unsupported
from .errors import RequestError

__all__ = ["ChatCompletionRequest", "CompletionRequest", "InfillRequest", "RequestError", "MAX_STOP", "MAX_CHOICES",
           "chat_messages", "JsonInt", "integral"]

MAX_STOP = 16  # Continue and other code assistants send long stop lists (OpenAI: 4)
MAX_CHOICES = 16  # n; the decoder may allow fewer (a few per sequence it decodes at once)
MAX_PROMPTS = 256  # prompts of one completions request (each with its n choices: all must fit the queue)
MAX_COMPLETION_LOGPROBS = 5  # the legacy completions' logprobs (OpenAI's limit)
MAX_TOKEN_ID = 2**31 - 1  # the live schema narrows it to the model's vocabulary (openapi.py)
TOKEN_IDS_SCHEMA: Dict[str, Any] = {
    "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": MAX_TOKEN_ID}, "minItems": 1}

_STRICT = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


def integral(value: Any) -> Any:
    """``4.0`` as ``4``: JSON does not tell the two apart, JSON Schema's
    ``integer`` admits both, and clients that build bodies from floats send
    the former; anything else passes unchanged, for the strict check after."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: An integer field as JSON Schema defines one (``4`` or ``4.0``; not ``"4"``, ``4.5`` or ``true``).  Its
#: bounds go before it, ``Annotated[int, Field(ge=0), AS_INT]``: after it, pydantic leaves them out of
#: the JSON schema it documents (it still checks them).
AS_INT = BeforeValidator(integral)
JsonInt = Annotated[int, AS_INT]


# ---------------------------------------------------------------------------
# values validated by hand (clear messages), documented by their own schema
# ---------------------------------------------------------------------------


def _stop(value: Any) -> Optional[List[str]]:
    if value is None:
        return None
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ValueError("must be a string or a list of strings")
    if len(stops) > MAX_STOP:
        raise ValueError(f"at most {MAX_STOP} stop sequences, got {len(stops)}")
    if any(not s for s in stops):
        raise ValueError("stop sequences must not be empty")
    return stops


Stop = Annotated[Any, BeforeValidator(_stop), WithJsonSchema({
    "anyOf": [{"type": "string", "minLength": 1},
              {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": MAX_STOP},
              {"type": "null"}],
    "description": f"Up to {MAX_STOP} strings; the output ends before the first one it produces"})]


def _gamma(value: Any) -> Union[str, int, None]:
    value = integral(value)
    if value is None or value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= GAMMA_LIMIT:
        raise ValueError(f"must be 'auto' or an int in [0, {GAMMA_LIMIT}], got {value!r}")
    return value


Gamma = Annotated[Any, BeforeValidator(_gamma), WithJsonSchema({
    "anyOf": [{"const": "auto"}, {"type": "integer", "minimum": 0, "maximum": GAMMA_LIMIT}, {"type": "null"}],
    "description": "Draft tokens per step: 'auto' (the planner chooses), or a fixed number (0: plain decoding)"})]


def prompt_list(value: Any, *, limit: int, noun: str) -> List[Union[str, List[int]]]:
    """A text, token ids, or a list of up to ``limit`` of one kind: texts or token-id lists, as OpenAI takes."""
    if isinstance(value, list) and value and all(isinstance(x, (str, list)) for x in value):
        if len(value) > limit:
            raise ValueError(f"at most {limit} {noun}s per request, got {len(value)}")
        if len({isinstance(x, str) for x in value}) > 1:
            raise ValueError(f"a list of {noun}s must hold only texts or only token-id lists, not both")
        return [_one_prompt(x, f"{noun} {i}: ") for i, x in enumerate(value)]
    return [_one_prompt(value, "")]


def prompt_list_schema(limit: int, description: str) -> Dict[str, Any]:
    """The JSON Schema :func:`prompt_list` enforces."""
    return {"anyOf": [{"type": "string", "minLength": 1},
                      {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": limit},
                      TOKEN_IDS_SCHEMA,
                      {"type": "array", "items": TOKEN_IDS_SCHEMA, "minItems": 1, "maxItems": limit}],
            "description": description}


def _one_prompt(value: Any, where: str) -> Union[str, List[int]]:
    if isinstance(value, str):
        if not value:
            raise ValueError(f"{where}must not be empty")
        return value
    if isinstance(value, list):
        if not value:
            raise ValueError(f"{where}must not be empty")
        value = [integral(x) for x in value]
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
            raise ValueError(f"{where}must be a string or a list of token ids (integers)")
        if any(x < 0 for x in value):
            raise ValueError(f"{where}token ids must not be negative")
        if any(x > MAX_TOKEN_ID for x in value):
            raise ValueError(f"{where}token ids must be at most {MAX_TOKEN_ID}")
        return value
    raise ValueError(f"{where}must be a string, token ids, or a list of either")


def _json_bool(value: Any) -> Any:
    """A bool, as JSON Schema's boolean (not 0 or 0.0)."""
    if not isinstance(value, bool):
        raise ValueError("Input should be a valid boolean")
    return value


#: Only ``false``: JSON's false is not 0, which a ``Literal[False]`` alone takes (Python's ``==``).
JsonFalse = Annotated[Literal[False], BeforeValidator(_json_bool)]


Prompt = Annotated[Any, BeforeValidator(partial(prompt_list, limit=MAX_PROMPTS, noun="prompt")), WithJsonSchema(
    prompt_list_schema(MAX_PROMPTS, "Text, token ids, or a list of either (several prompts: choice i*n + j is "
                                    "prompt i's choice j)"))]


def _n_predict(value: Any) -> Optional[int]:
    value = integral(value)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not (value == -1 or value >= 1):
        raise ValueError(f"must be -1 (no limit but the context) or an int >= 1, got {value!r}")
    return value


NPredict = Annotated[Any, BeforeValidator(_n_predict), WithJsonSchema({
    "anyOf": [{"const": -1}, {"type": "integer", "minimum": 1}, {"type": "null"}],
    "description": "llama-server's name for max_tokens; -1: up to the context"})]


def _logit_bias(value: Any) -> Optional[Dict[int, float]]:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("must be an object mapping token ids (as strings) to numbers")
    out: Dict[int, float] = {}
    for key, bias in value.items():
        text = str(key)
        if not text.isascii() or not text.isdigit():
            raise ValueError(f"key {text!r} is not a token id (a non-negative integer as a string)")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)):
            raise ValueError(f"logit_bias[{text!r}] must be a number, got {bias!r}")
        if not -BIAS_LIMIT <= bias <= BIAS_LIMIT:
            raise ValueError(f"logit_bias[{text!r}] must be in [-100, 100], got {bias!r}")
        out[int(text)] = float(bias)
    return out


LogitBias = Annotated[Any, BeforeValidator(_logit_bias), WithJsonSchema({
    "anyOf": [{"type": "object", "propertyNames": {"pattern": "^[0-9]+$"},
               "additionalProperties": {"type": "number", "minimum": -BIAS_LIMIT, "maximum": BIAS_LIMIT}},
              {"type": "null"}],
    "description": "Token id (a string) -> bias in [-100, 100] added to its logit (-100 practically bans it, "
                   "100 practically forces it)"})]

TokenId = Annotated[int, Field(ge=0, le=MAX_TOKEN_ID), AS_INT]


def _content(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise ValueError("must be a string, a list of text parts or null")
    for j, part in enumerate(value):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ValueError(f"part {j}: only text content parts are supported, got type {kind!r}")
    return value


Content = Annotated[Any, BeforeValidator(_content), WithJsonSchema({
    "anyOf": [{"type": "string"},
              {"type": "array", "items": {"type": "object", "required": ["type", "text"], "properties": {
                  "type": {"const": "text"}, "text": {"type": "string"}}}},
              {"type": "null"}]})]


# ---------------------------------------------------------------------------
# structured output and tools (checked in depth by constraints/ and chat/)
# ---------------------------------------------------------------------------


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``: the schema the output must match."""

    model_config = _STRICT

    name: Optional[str] = Field(default=None, max_length=64)
    description: Optional[str] = None
    schema_: Optional[Dict[str, Any]] = Field(default=None, alias="schema",
                                              description="A JSON schema (default: any object)")
    strict: Optional[bool] = Field(default=None, description="Either way the output matches the schema exactly")


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format`` (and llama-server's ``schema`` beside ``json_object``)."""

    # type json_schema needs json_schema, and each schema field goes with its type: stated in the document too
    model_config = ConfigDict(**_STRICT, json_schema_extra={"allOf": [
        {"if": {"properties": {"type": {"const": "json_schema"}}, "required": ["type"]},
         "then": {"required": ["json_schema"], "properties": {"json_schema": {"type": "object"}}},
         "else": {"properties": {"json_schema": {"type": "null"}}}},
        {"if": {"properties": {"type": {"const": "json_object"}}, "required": ["type"]},
         "else": {"properties": {"schema": {"type": "null"}}}}]})

    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None
    schema_: Optional[Dict[str, Any]] = Field(default=None, alias="schema",
                                              description="llama-server: a JSON schema for type json_object")

    @model_validator(mode="after")
    def _fits_the_type(self) -> "ResponseFormat":
        """A schema the type would not read is refused, not dropped."""
        if self.json_schema is not None and self.type != "json_schema":
            raise ValueError(f"json_schema is read only with type 'json_schema', not {self.type!r} "
                             "(llama-server's way: 'schema' beside type 'json_object')")
        if self.schema_ is not None and self.type != "json_object":
            raise ValueError(f"schema is read only beside type 'json_object' (llama-server's way), not "
                             f"{self.type!r}; with type 'json_schema' it goes in json_schema.schema")
        return self

    def as_dict(self) -> Dict[str, Any]:
        """As ``constraints.from_response_format`` reads it."""
        out: Dict[str, Any] = {"type": self.type}
        if self.json_schema is not None:
            out["json_schema"] = self.json_schema.model_dump(by_alias=True, exclude_none=True)
        if self.type == "json_object" and self.schema_ is not None:
            out = {"type": "json_schema", "json_schema": {"schema": self.schema_}}
        return out


MAX_CHOICE_OPTIONS = 256  # structured_outputs.choice / guided_choice

#: A JSON schema, as an object or as its JSON text (vLLM takes both).
SchemaValue = Union[Dict[str, Any], str]
ChoiceList = Annotated[List[str], Field(min_length=1, max_length=MAX_CHOICE_OPTIONS)]


def _given(name: str) -> Dict[str, Any]:
    value = {"const": True} if name == "json_object" else {"not": {"type": "null"}}
    return {"required": [name], "properties": {name: value}}


class _StructuredOutputsBase(BaseModel):
    """vLLM's ``structured_outputs``: one of ``json``, ``regex``, ``choice``,
    ``grammar`` or ``json_object`` shapes the output."""

    # exactly one kind given (not null; json_object true): stated in the document too
    model_config = ConfigDict(**_STRICT, json_schema_extra={"oneOf": [
        _given(name) for name in ("json", "regex", "choice", "grammar", "json_object")]})

    json_: Optional[SchemaValue] = Field(default=None, alias="json", description="A JSON schema the output matches")
    regex: Optional[str] = Field(default=None, min_length=1, description="A regular expression (Rust syntax) the "
                                                                          "output matches as a whole")
    choice: Optional[ChoiceList] = Field(default=None, description="The output is exactly one of these texts")
    grammar: Optional[str] = Field(default=None, min_length=1, description="A grammar: GBNF (with '::=' rules) or "
                                                                            "Lark")
    json_object: Optional[bool] = Field(default=None, description="true: the output is one JSON object")
    disable_any_whitespace: Optional[bool] = Field(default=None, description=(
        "JSON layout: null or true, the separators ', ' and ': ' and no other whitespace (the server's default, "
        "whose punctuation is forced, so drafted free); false, any JSON whitespace between tokens (vLLM's default)"))
    disable_fallback: Optional[bool] = Field(default=None, description="Ignored: there is no other backend")

    @model_validator(mode="after")
    def _one_kind(self) -> "_StructuredOutputsBase":
        given = self.given()
        if len(given) != 1:
            raise ValueError(f"give exactly one of json, regex, choice, grammar, json_object; got "
                             f"{', '.join(given) or 'none'}")
        return self

    def given(self) -> Dict[str, Any]:
        """The constraint fields set, by name, with their values (json_object only when true)."""
        values = {"json": self.json_, "regex": self.regex, "choice": self.choice, "grammar": self.grammar,
                  "json_object": self.json_object or None}
        return {name: value for name, value in values.items() if value is not None}


if TYPE_CHECKING:  # the model adds only the refused fields (never read by name)
    StructuredOutputs = _StructuredOutputsBase
else:
    StructuredOutputs = create_model(
        "StructuredOutputs", __base__=_StructuredOutputsBase, __doc__=_StructuredOutputsBase.__doc__,
        __validators__=unsupported.refusing_validators(unsupported.REFUSED_IN_STRUCTURED_OUTPUTS),
        **unsupported.refused_fields(unsupported.REFUSED_IN_STRUCTURED_OUTPUTS))
    StructuredOutputs.__module__ = __name__


def _json_type(value: Any) -> Optional[str]:
    return "str" if isinstance(value, str) else "list" if isinstance(value, list) else \
        "dict" if isinstance(value, dict) or isinstance(value, BaseModel) else None


_JSON_TYPES = {"str": "a string", "list": "a list", "dict": "an object"}


def by_json_type(**branches: Any) -> Any:
    """A union whose branch is chosen by the value's JSON type (``str``, ``list`` or ``dict`` keywords), so an
    error names the field inside the branch the value took, not every branch's first complaint."""
    tagged = [Annotated[kind, Tag(name)] for name, kind in branches.items()]
    expected = " or ".join(_JSON_TYPES[name] for name in branches)
    return Annotated[Union[tuple(tagged)], Discriminator(_json_type, custom_error_type="invalid_json_type",
                                                         custom_error_message=f"must be {expected}")]


ToolParameters = Dict[str, Any]


class FunctionDefinition(BaseModel):
    model_config = _STRICT

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: Optional[str] = None
    parameters: Optional[ToolParameters] = Field(default=None, description="A JSON schema of an object")
    strict: Optional[bool] = None


class Tool(BaseModel):
    model_config = _STRICT

    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = _STRICT

    name: str


class NamedToolChoice(BaseModel):
    model_config = _STRICT

    type: Literal["function"]
    function: NamedFunction


#: OpenAI's deprecated ``function_call``: a named function is ``{"name": ...}``.
if TYPE_CHECKING:
    FunctionCallChoice = Union[Literal["none", "auto"], NamedFunction]
else:
    FunctionCallChoice = by_json_type(str=Literal["none", "auto"], dict=NamedFunction)


class FunctionCallIn(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    name: str = Field(min_length=1)
    arguments: Union[str, Dict[str, Any]] = "{}"


class ToolCallIn(BaseModel):
    """A tool call of an earlier assistant turn."""

    model_config = ConfigDict(extra="allow", strict=True)

    id: Optional[str] = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessage(BaseModel):
    """One message.  Fields beyond these are passed to the chat template as
    they are (some templates read e.g. ``reasoning_content``)."""

    # only an assistant's message makes a call (chat.template_messages checks it): stated in the document too
    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra={"allOf": [
        {"if": {"properties": {"role": {"not": {"const": "assistant"}}}},
         "then": {"properties": {"function_call": {"type": "null"}}}}]})

    role: Literal["system", "developer", "user", "assistant", "tool", "function"] = Field(
        description="'function': a result of the deprecated function_call, read as a tool result")
    content: Content = None
    name: Optional[str] = None
    tool_calls: Optional[List[ToolCallIn]] = None
    tool_call_id: Optional[str] = None
    function_call: Optional[FunctionCallIn] = Field(default=None, description=(
        "Deprecated by OpenAI for tool_calls: an earlier assistant turn's one call"))

    def for_template(self) -> Dict[str, Any]:
        """The message as ``chat.template_messages`` takes it."""
        return self.model_dump(exclude_none=True)


class InfillChunk(BaseModel):
    """One file of ``/infill``'s ``input_extra``."""

    model_config = _STRICT

    filename: str = ""
    text: str


class StreamOptions(BaseModel):
    model_config = _STRICT

    include_usage: Optional[bool] = None
    include_obfuscation: Optional[bool] = Field(default=None, description="ignored: no obfuscation is added")


# ---------------------------------------------------------------------------
# the requests
# ---------------------------------------------------------------------------


class _Common(BaseModel):
    """Fields both endpoints take (every one may be null: its default)."""

    model_config = _STRICT

    model: Optional[str] = Field(default=None, description="The served model's id (GET /v1/models)")
    max_tokens: Optional[Annotated[int, Field(ge=1), AS_INT]] = Field(
        default=None, description="Capped at what the context leaves")
    n_predict: NPredict = None
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0, description="Default 1; 0 is greedy")
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0, description="Default 1 (off)")
    top_k: Optional[Annotated[int, Field(ge=-1, le=COUNT_LIMIT), AS_INT]] = Field(
        default=None, description="0 or -1: off (default)")
    min_p: Optional[float] = Field(default=None, ge=0.0, lt=1.0, description="Default 0 (off)")
    # No upper bound: a seed is taken modulo 2**64 (a bound near 2**63 or 2**64 is no exact float, so clients
    # and schema tools that compare numbers as floats disagree with it).
    seed: Optional[Annotated[int, Field(ge=-1), AS_INT]] = Field(
        default=None, description=("-1 or null: a random seed; any other is taken modulo 2**64. A seed repeats an "
                                   "answer at a fixed gamma, with the same cached prompt prefix; with gamma 'auto' "
                                   "the draft length chosen each step varies, and the draws with it"))
    stop: Stop = None
    stream: Optional[bool] = None
    stream_options: Optional[StreamOptions] = None
    gamma: Gamma = None
    ignore_eos: Optional[bool] = Field(default=None, description="Never end at end-of-generation tokens")
    response_format: Optional[ResponseFormat] = None
    grammar: Optional[str] = Field(default=None, min_length=1, description="A llama.cpp GBNF grammar")
    json_schema: Optional[Dict[str, Any]] = Field(default=None, description="llama-server: a JSON schema")
    structured_outputs: Optional[StructuredOutputs] = None
    guided_json: Optional[SchemaValue] = Field(default=None, description="vLLM's older name of "
                                                                         "structured_outputs.json")
    guided_regex: Optional[str] = Field(default=None, min_length=1, description="vLLM's older name of "
                                                                                "structured_outputs.regex")
    guided_choice: Optional[ChoiceList] = Field(default=None, description="vLLM's older name of "
                                                                          "structured_outputs.choice")
    guided_grammar: Optional[str] = Field(default=None, min_length=1, description="vLLM's older name of "
                                                                                  "structured_outputs.grammar")
    n: Optional[Annotated[int, Field(ge=1, le=MAX_CHOICES), AS_INT]] = Field(default=None, description=(
        f"Choices to generate (default 1, at most {MAX_CHOICES}, or fewer if the server decodes few sequences "
        "at once); they share the prompt's cache"))
    best_of: Optional[Annotated[int, Field(ge=1), AS_INT]] = Field(
        default=None, description="Only equal to n (or 1): no choice is dropped")
    presence_penalty: Optional[float] = Field(default=None, ge=-PENALTY_LIMIT, le=PENALTY_LIMIT, description=(
        "Subtracted from the logit of every token the output already holds (default 0)"))
    frequency_penalty: Optional[float] = Field(default=None, ge=-PENALTY_LIMIT, le=PENALTY_LIMIT, description=(
        "Subtracted from a token's logit per occurrence in the output so far (default 0)"))
    repeat_penalty: Optional[float] = Field(default=None, ge=1 / REPEAT_PENALTY_LIMIT, le=REPEAT_PENALTY_LIMIT,
                                            description=(
        "llama-server's: a token among the last repeat_last_n (prompt included) has a positive logit divided "
        "by it, a negative one multiplied (default 1: off)"))
    repetition_penalty: Optional[float] = Field(default=None, ge=1 / REPEAT_PENALTY_LIMIT, le=REPEAT_PENALTY_LIMIT,
                                                description="vLLM's name for repeat_penalty")
    repeat_last_n: Optional[Annotated[int, Field(ge=-1, le=COUNT_LIMIT), AS_INT]] = Field(default=None, description=(
        "The window of repeat_penalty (default 64; 0: off, -1: the whole sequence)"))
    logit_bias: LogitBias = None
    min_tokens: Optional[Annotated[int, Field(ge=0, le=COUNT_LIMIT), AS_INT]] = Field(default=None, description=(
        "End-of-generation tokens and stop_token_ids are banned until the output has this many tokens"))
    stop_token_ids: Optional[List[TokenId]] = Field(default=None, description=(
        "Token ids that end the output as the end-of-generation token does"))
    n_probs: Optional[Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS), AS_INT]] = Field(default=None, description=(
        "llama-server's: report log-probabilities with this many alternatives per token"))
    logprob_mode: Optional[Literal["model", "sampling"]] = Field(default=None, description=(
        "Extension: which distribution logprobs report. 'model' (default, as OpenAI and vLLM): the model's "
        "own, at temperature 1, before penalties and truncation; 'sampling': the one each token was drawn "
        "from (penalties, biases, temperature, top-k/top-p/min-p applied; -9999 outside its support)"))

    return_tokens_as_token_ids: Optional[bool] = Field(default=None, description=(
        "vLLM's: logprobs name tokens as 'token_id:ID' (a token may be part of a character)"))

    def params(self) -> SamplingParams:
        """The sampling parameters, nulls and the lenient spellings resolved."""
        repeat = [(n, v) for n, v in (("repeat_penalty", self.repeat_penalty),
                                      ("repetition_penalty", self.repetition_penalty)) if v is not None]
        if len({v for _, v in repeat}) > 1:
            raise RequestError(400, "conflicting repeat_penalty and repetition_penalty: give one",
                               param="repetition_penalty")
        try:
            return self._params(repeat)
        except (TypeError, ValueError) as exc:  # bounds the schema leaves to SamplingParams (token ids, say)
            name = str(exc).split(" ", 1)[0]
            raise RequestError(400, str(exc), param=name if name in type(self).model_fields else None) from None

    def _params(self, repeat: List[Any]) -> SamplingParams:
        return SamplingParams(temperature=1.0 if self.temperature is None else self.temperature,
                              top_k=0 if self.top_k in (None, -1) else self.top_k,
                              top_p=1.0 if self.top_p is None else self.top_p,
                              min_p=0.0 if self.min_p is None else self.min_p,
                              seed=None if self.seed in (None, -1) else self.seed % 2**64,
                              ignore_eos=bool(self.ignore_eos),
                              presence_penalty=self.presence_penalty or 0.0,
                              frequency_penalty=self.frequency_penalty or 0.0,
                              repeat_penalty=repeat[0][1] if repeat else 1.0,
                              repeat_last_n=64 if self.repeat_last_n is None else self.repeat_last_n,
                              logit_bias=self.logit_bias or None,
                              min_tokens=self.min_tokens or 0,
                              stop_token_ids=tuple(self.stop_token_ids or ()))

    @property
    def choices(self) -> int:
        """``n`` (``best_of`` may only repeat it)."""
        n = 1 if self.n is None else self.n
        if self.best_of is not None and self.best_of != n:
            raise RequestError(400, f"best_of={self.best_of} is not supported: only best_of equal to n ({n}); "
                                    "every choice generated is returned", param="best_of",
                               code="unsupported_parameter")
        return n

    def top_logprobs_count(self) -> Optional[int]:
        """Alternatives per token for the decoder's ``logprobs`` (None: no log-probabilities)."""
        return self.n_probs or None

    @property
    def mode(self) -> str:
        return self.logprob_mode or "model"

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def streamed(self) -> bool:
        return bool(self.stream)

    def token_limit(self, default: Optional[int]) -> Optional[int]:
        """``max_tokens`` (or its other names); None: up to the context."""
        names = [(n, getattr(self, n)) for n in ("max_completion_tokens", "max_tokens", "n_predict")
                 if getattr(self, n, None) is not None]
        if not names:
            return default
        if len({v for _, v in names}) > 1:
            given = ", ".join(f"{n}={v}" for n, v in names)
            raise RequestError(400, f"conflicting output limits ({given}): give one", param=names[-1][0])
        value = names[0][1]
        return None if value == -1 else value


class _CompletionBase(_Common):
    """``POST /v1/completions``: ``prompt`` holds one prompt or several (text or token ids)."""

    prompt: Prompt
    max_tokens: Optional[Annotated[int, Field(ge=0), AS_INT]] = Field(
        default=None, description="Default 16, capped at what the context leaves; 0 (with echo and logprobs): "
                                  "score the prompt, generate nothing")
    echo: Optional[bool] = Field(default=None, description=(
        "Prepend the prompt's text to the output; with logprobs, the prompt's tokens are scored too (the model's "
        "own log-probabilities, the first token's null), and the prompt is computed again, not taken from the "
        "cache"))
    suffix: Optional[str] = Field(default=None, description=(
        "Fill in the middle: the text after the completion (the prompt is the text before it); needs a model "
        "with fill-in-the-middle tokens"))
    logprobs: Optional[Annotated[int, Field(ge=0, le=MAX_COMPLETION_LOGPROBS), AS_INT]] = Field(
        default=None, description=(
        "Report each token's log-probability and this many alternatives (the legacy shape: tokens, "
        "token_logprobs, top_logprobs, text_offset); see logprob_mode"))

    def top_logprobs_count(self) -> Optional[int]:
        if self.logprobs is not None and self.n_probs is not None and self.logprobs != self.n_probs:
            raise RequestError(400, f"conflicting logprobs={self.logprobs} and n_probs={self.n_probs}: give one",
                               param="n_probs")
        return self.logprobs if self.logprobs is not None else self.n_probs or None

    def prompt_logprobs_count(self) -> Optional[int]:
        """Alternatives per prompt token: ``echo`` with ``logprobs`` scores the prompt as well (OpenAI's legacy
        answer covers every echoed token, the first with nulls)."""
        return self.top_logprobs_count() if self.echo else None


class _ChatBase(_Common):
    """``POST /v1/chat/completions``."""

    messages: List[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[Annotated[int, Field(ge=1), AS_INT]] = Field(default=None)
    tools: Optional[List[Tool]] = None
    tool_choice: Optional[Union[Literal["none", "auto", "required"], NamedToolChoice]] = None
    parallel_tool_calls: Optional[bool] = Field(default=None, description="Default true")
    functions: Optional[List[FunctionDefinition]] = Field(default=None, description=(
        "Deprecated by OpenAI for tools, and answered in its shape: one call at most, as message.function_call "
        "with finish_reason 'function_call'"))
    function_call: Optional[FunctionCallChoice] = Field(default=None, description=(
        "Deprecated by OpenAI for tool_choice: 'none', 'auto' (the default with functions) or {\"name\": ...}"))
    chat_template_kwargs: Optional[Dict[str, Any]] = Field(
        default=None, description="Extra variables of the chat template (e.g. enable_thinking)")
    reasoning_format: Optional[ReasoningFormat] = Field(default=None, description=(
        "A reasoning model's <think> block: 'auto' (or llama-server's 'deepseek') answers it apart, as "
        "message.reasoning_content; 'none' leaves it in the content.  Default: the server's --reasoning-format"))
    logprobs: Optional[bool] = Field(default=None, description=(
        "Report each output token's log-probability (choices[].logprobs.content); see logprob_mode"))
    top_logprobs: Optional[Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS), AS_INT]] = Field(default=None, description=(
        "With logprobs: this many most likely alternatives per token"))

    def top_logprobs_count(self) -> Optional[int]:
        if self.top_logprobs and not self.logprobs:
            raise RequestError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if self.top_logprobs is not None and self.n_probs is not None and self.top_logprobs != self.n_probs:
            raise RequestError(400, f"conflicting top_logprobs={self.top_logprobs} and n_probs={self.n_probs}: "
                                    "give one", param="n_probs")
        if self.logprobs:
            return self.top_logprobs or self.n_probs or 0
        return self.n_probs or None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _reserved(cls, v: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
        clash = sorted(set(v or ()) & {"messages", "tools", "add_generation_prompt"})
        if clash:
            raise ValueError(f"may not set {', '.join(clash)} (the request's own fields do)")
        return v


class _InfillStreamOptions(StreamOptions):
    include_usage: Optional[JsonFalse] = None


class _InfillBase(_Common):
    """``POST /infill`` (llama-server's): fill in the middle between ``input_prefix`` and ``input_suffix``."""

    input_prefix: str = Field(default="", description="The text before the middle")
    input_suffix: str = Field(default="", description="The text after the middle")
    input_extra: Optional[List[InfillChunk]] = Field(default=None, description=(
        "Other files for context, before the prefix"))
    prompt: Optional[str] = Field(default=None, description="Text the middle starts with (after the FIM middle "
                                                            "token)")
    n: Optional[Annotated[int, Field(ge=1, le=1), AS_INT]] = Field(default=None, description=(
        "One completion per request (1)"))
    # OpenAI's fields this llama-server answer has no place for: refused when asked, not ignored.
    return_tokens_as_token_ids: Optional[JsonFalse] = Field(
        default=None, description="Not for /infill: its completion_probabilities carry each token's id")
    stream_options: Optional[_InfillStreamOptions] = Field(default=None, description=(
        "Not for /infill: its last event carries the counts (tokens_predicted, tokens_evaluated, timings)"))

    def top_logprobs_count(self) -> Optional[int]:
        return self.n_probs or None


def _request_model(name: str, base: type, endpoint: str, doc: str) -> type:
    model = create_model(name, __base__=base, __doc__=doc, __validators__=unsupported.model_validators(endpoint),
                         **unsupported.model_fields(endpoint))
    model.__module__ = __name__
    return model


if TYPE_CHECKING:  # the models add only the refused and ignored fields (never read by name) to these
    CompletionRequest = _CompletionBase
    ChatCompletionRequest = _ChatBase
    InfillRequest = _InfillBase
else:
    CompletionRequest = _request_model("CompletionRequest", _CompletionBase, unsupported.COMPLETIONS,
                                       _CompletionBase.__doc__ or "")
    ChatCompletionRequest = _request_model("ChatCompletionRequest", _ChatBase, unsupported.CHAT,
                                           _ChatBase.__doc__ or "")
    InfillRequest = _request_model("InfillRequest", _InfillBase, unsupported.COMPLETIONS, _InfillBase.__doc__ or "")


def shared_fields(*names: str) -> Dict[str, Tuple[Any, Any]]:
    """Fields both completion endpoints take, as ``create_model`` definitions, for another request model that
    takes them alike (the Responses API's sampling fields)."""
    return {name: (_Common.model_fields[name].annotation, _Common.model_fields[name]) for name in names}


def chat_messages(messages: List[ChatMessage]) -> List[Dict[str, Any]]:
    """The messages as the chat template takes them."""
    return [m.for_template() for m in messages]
