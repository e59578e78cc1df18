"""OpenAI's Responses API (``POST /v1/responses``), answered by the chat path.

A request is read as the chat completion it amounts to
(:meth:`ResponsesRequest.as_chat`): ``instructions`` a system message,
``input`` the messages (a ``function_call`` item an assistant's tool call, a
``function_call_output`` item that tool's result), the flat ``tools`` chat's
nested ones, ``text.format`` a ``response_format``, ``max_output_tokens``
``max_completion_tokens``.  So the grammar, the tool calls and the exactness
are the chat completion's.  :class:`ResponseBuilder` turns the chat answer
back into a response: whole, or as the stream of typed events
(``response.created`` ... ``response.completed``) the SDK's helpers assemble.

A response is kept (``store``, default true; :mod:`.response_store`) so a
later request can continue it by ``previous_response_id``: the earlier
conversation, its answer included, goes before the new input (its
``instructions`` do not: each request gives its own).  OpenAI's
``conversation`` objects are refused; the whole input can be sent instead,
an output's items as they are.
"""

from __future__ import annotations

import asyncio
import copy
import re
import secrets
import time
from typing import (
    TYPE_CHECKING,
    Any,
    AsyncGenerator,
    Collection,
    Dict,
    List,
    Literal,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter, create_model, field_validator
from typing_extensions import Annotated

from ..chat.reasoning import ReasoningFormat, ThinkingTokens
from ..core.logprobs import MAX_TOP_LOGPROBS
from . import unsupported
from .errors import RequestError
from .openai_schema import AS_INT, FunctionDefinition, JsonSchemaFormat, NamedFunction, by_json_type, shared_fields
from .response_store import ResponseStore, StoredResponse

__all__ = ["ResponsesRequest", "ResponseBuilder", "renamed", "responses_names"]

_STRICT = ConfigDict(extra="forbid", strict=True)


def _by_type_field(prefix: str, branches: Dict[str, Any], error: str, default: Optional[str] = None) -> Any:
    """A union whose branch is its ``type`` field's value (``default`` when it has none), so an error names the
    field inside that branch; any other type is ``error``.  The tags are spelt as branches (``item[message]``),
    which an error's location leaves out (errors.validation_request_error)."""

    def tag(value: Any) -> Optional[str]:
        kind = (value.get("type") if isinstance(value, dict) else getattr(value, "type", None)) or default
        return f"{prefix}[{kind}]" if isinstance(kind, str) and kind in branches else None

    tagged = tuple(Annotated[model, Tag(f"{prefix}[{kind}]")] for kind, model in branches.items())
    return Annotated[Union[tagged], Discriminator(tag, custom_error_type=f"invalid_{prefix}",
                                                   custom_error_message=error)]


# ---------------------------------------------------------------------------
# the request
# ---------------------------------------------------------------------------


class TextPart(BaseModel):
    """A text part of a message: ``input_text``, or ``output_text`` of an earlier answer sent back."""

    model_config = _STRICT

    type: Literal["input_text", "output_text"]
    text: str
    annotations: Optional[List[Any]] = Field(default=None, description="Of an output_text sent back; ignored")
    logprobs: Optional[List[Any]] = Field(default=None, description="Of an output_text sent back; ignored")
    parsed: Optional[Any] = Field(default=None, description="Of an output the SDK parsed, sent back; ignored")


if TYPE_CHECKING:  # what the tagged unions hold
    Text = Union[str, List[TextPart]]
else:
    Text = by_json_type(str=str, list=List[TextPart])


class _Item(BaseModel):
    """What an earlier output item sent back as input carries besides its content (ignored)."""

    model_config = _STRICT

    id: Optional[str] = None
    status: Optional[Literal["in_progress", "completed", "incomplete"]] = None


class MessageItem(_Item):
    """A message (its ``type`` may be left out)."""

    type: Optional[Literal["message"]] = None
    role: Literal["user", "assistant", "system", "developer"]
    content: Text
    phase: Optional[Literal["commentary", "final_answer"]] = Field(default=None, description="Ignored")


class FunctionCallItem(_Item):
    """A call the model made earlier (the SDK's other fields of a call sent back, null here, are ignored)."""

    model_config = ConfigDict(**_STRICT, populate_by_name=True)

    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    parsed_arguments: Optional[Any] = Field(default=None, description="Of a call the SDK parsed; ignored")
    async_: Optional[Any] = Field(default=None, alias="async", description="Ignored")
    caller: Optional[Any] = Field(default=None, description="Ignored")
    namespace: Optional[Any] = Field(default=None, description="Ignored")


class FunctionCallOutputItem(_Item):
    """The result of a call, for the model to read."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: Text


class ReasoningText(BaseModel):
    model_config = _STRICT

    type: Literal["reasoning_text"]
    text: str


class SummaryText(BaseModel):
    model_config = _STRICT

    type: Literal["summary_text"]
    text: str


class ReasoningItem(_Item):
    """A reasoning model's thinking from an earlier answer, sent back: the chat template gets it (its
    content, else its summary) as the ``reasoning_content`` of the assistant's turn it starts."""

    type: Literal["reasoning"]
    summary: List[SummaryText] = Field(default_factory=list)
    content: Optional[List[ReasoningText]] = None
    encrypted_content: None = Field(default=None, description="Only null: this server encrypts nothing")

    @field_validator("encrypted_content", mode="before")
    @classmethod
    def _plain(cls, value: Any) -> None:
        if value is not None:
            raise ValueError("this server makes no encrypted reasoning and cannot read another's: send the "
                             "reasoning item's content, or leave the item out")
        return value

    @property
    def text(self) -> str:
        return "".join(part.text for part in self.content or self.summary)


if TYPE_CHECKING:
    InputItem = Union[MessageItem, FunctionCallItem, FunctionCallOutputItem, ReasoningItem]
else:
    InputItem = _by_type_field(
        "item", {"message": MessageItem, "function_call": FunctionCallItem,
                 "function_call_output": FunctionCallOutputItem, "reasoning": ReasoningItem},
        "an input item is a message, a function_call, a function_call_output or a reasoning item (item "
        "references are not taken: continue a response by previous_response_id)", default="message")


class FunctionTool(FunctionDefinition):
    type: Literal["function"]


#: A tool: a function (OpenAI's hosted tools, web search and the like, are not this server's).
if TYPE_CHECKING:
    Tool = FunctionTool
else:
    Tool = _by_type_field("tool", {"function": FunctionTool}, (
        "a tool is {\"type\": \"function\", \"name\", \"parameters\", ...}: OpenAI's hosted tools (web search, "
        "file search, ...) are not this server's"))


class FunctionChoice(NamedFunction):
    type: Literal["function"]


class TextFormatText(BaseModel):
    model_config = _STRICT

    type: Literal["text"]


class TextFormatJsonObject(BaseModel):
    model_config = _STRICT

    type: Literal["json_object"]


class TextFormatJsonSchema(JsonSchemaFormat):
    type: Literal["json_schema"]
    name: str = Field(max_length=64)
    schema_: Dict[str, Any] = Field(alias="schema", description="A JSON schema the output matches")


if TYPE_CHECKING:
    TextFormat = Union[TextFormatText, TextFormatJsonObject, TextFormatJsonSchema]
else:
    TextFormat = _by_type_field(
        "format", {"text": TextFormatText, "json_object": TextFormatJsonObject, "json_schema": TextFormatJsonSchema},
        "format.type is one of text, json_object, json_schema")


class TextConfig(BaseModel):
    model_config = _STRICT

    format: Optional[TextFormat] = None


if TYPE_CHECKING:
    Input = Union[str, List[InputItem]]
    ToolChoice = Union[Literal["none", "auto", "required"], FunctionChoice]
else:
    Input = by_json_type(str=str, list=Annotated[List[InputItem], Field(min_length=1)])
    ToolChoice = by_json_type(str=Literal["none", "auto", "required"], dict=FunctionChoice)

#: An answer's output items read back as input items.
_OUTPUT_ITEMS: TypeAdapter = TypeAdapter(List[InputItem])
#: Fields of OpenAI's that the server does not honour (a 400 unless at their neutral value).
REFUSED: Tuple[unsupported.Refused, ...] = (
    unsupported.Refused("conversation", instead="continue a response by previous_response_id, or send the whole "
                                                "input"),
    unsupported.Refused("prompt", instead="send the input itself"),
    unsupported.Refused("reasoning"),
    unsupported.Refused("max_tool_calls"),
    unsupported.Refused("truncation", ("disabled",), instead="an input longer than the context is a 400"),
)
#: What ``include`` may ask for: the output's log-probabilities, or data of items this server never makes.
Includable = Literal["message.output_text.logprobs", "reasoning.encrypted_content", "message.input_image.image_url",
                     "web_search_call.action.sources", "code_interpreter_call.outputs",
                     "computer_call_output.output.image_url", "file_search_call.results"]
LOGPROBS = "message.output_text.logprobs"
#: The fields of unsupported.IGNORED a Responses request may carry: they cannot change the output.
IGNORED_FIELDS = ("metadata", "user", "safety_identifier", "prompt_cache_key", "service_tier")
#: Fields taken as on chat (the bounds, defaults and checks written once, in openai_schema).
SHARED_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "gamma", "ignore_eos", "logit_bias")


class _ResponsesBase(BaseModel):
    """``POST /v1/responses``."""

    model_config = _STRICT

    model: Optional[str] = Field(default=None, description="The served model's id (GET /v1/models)")
    input: Input = Field(description=(
        "The user's text, or the items of the conversation so far (messages, function calls and their outputs)"))
    instructions: Optional[str] = Field(default=None, description=(
        "A system message before the input (a previous response's are not carried over)"))
    previous_response_id: Optional[str] = Field(default=None, min_length=1, description=(
        "A stored response this one continues: its conversation and answer come before the input"))
    store: Optional[bool] = Field(default=None, description=(
        "Default true: keep the response in this server's memory (up to --stored-responses of them, the least "
        "recently used dropped first) for previous_response_id and GET /v1/responses/{id}"))
    tools: Optional[List[Tool]] = None
    tool_choice: Optional[ToolChoice] = None
    parallel_tool_calls: Optional[bool] = Field(default=None, description="Default true")
    text: Optional[TextConfig] = None
    max_output_tokens: Optional[Annotated[int, Field(ge=1), AS_INT]] = Field(
        default=None, description="Capped at what the context leaves")
    stream: Optional[bool] = None
    background: Optional[bool] = Field(default=None, description=(
        "Answer at once (status in_progress) and go on generating; poll GET /v1/responses/{id}, or cancel it "
        "with POST /v1/responses/{id}/cancel (needs store; not with stream)"))
    include: Optional[List[Includable]] = Field(default=None, description=(
        f"{LOGPROBS!r}: each output token's log-probability (output_text.logprobs; see top_logprobs); the "
        "others concern items this server does not make, and change nothing"))
    top_logprobs: Optional[Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS), AS_INT]] = Field(default=None, description=(
        f"Alternatives per token: with include {LOGPROBS!r}, or alone (more than 0), the log-probabilities"))
    reasoning_format: Optional[ReasoningFormat] = Field(default=None, description=(
        "This server's: a reasoning model's thinking as a reasoning item ('auto', 'deepseek') or in the "
        "message ('none'); default: the server's --reasoning-format"))

    def check_item_ids(self, previous: Collection[str] = ()) -> None:
        """A 400 for an input item whose id another input item has, or the conversation it continues (an
        earlier output sent back with previous_response_id as well), as OpenAI's."""
        seen = set(previous)
        for i, item in enumerate(self.input if isinstance(self.input, list) else ()):
            if item.id is None:
                continue
            if item.id in seen:
                where = ("the response it continues has it (with previous_response_id, send only the new items)"
                         if item.id in previous else "an earlier input item has it")
                raise RequestError(400, f"Duplicate item found with id '{item.id}': {where}", param=f"input[{i}].id")
            seen.add(item.id)

    @property
    def logprobs(self) -> bool:
        """Whether the output's log-probabilities are asked for."""
        return LOGPROBS in (self.include or ()) or bool(self.top_logprobs)

    def as_chat(self, history: Sequence[Dict[str, Any]] = ()) -> Dict[str, Any]:
        """The chat completion request this asks for (a ChatCompletionRequest's fields); ``history``: the chat
        messages of the response it continues."""
        fmt = self.text.format if self.text is not None else None
        chat: Dict[str, Any] = {
            "model": self.model, "messages": self.messages(history)[0],
            "tools": [{"type": "function", "function": t.model_dump(exclude_none=True, exclude={"type"})}
                      for t in self.tools] if self.tools is not None else None,
            "tool_choice": ({"type": "function", "function": {"name": self.tool_choice.name}}
                            if isinstance(self.tool_choice, FunctionChoice) else self.tool_choice),
            "parallel_tool_calls": self.parallel_tool_calls, "response_format": _response_format(fmt),
            # a background response runs as a stream nobody reads, so that GET shows it as it grows
            "max_completion_tokens": self.max_output_tokens, "stream": self.stream or self.background,
            "stream_options": {"include_usage": True} if self.stream or self.background else None,
            **self.model_dump(include=set(SHARED_FIELDS))}
        if self.logprobs:
            if self.tools and self.tool_choice != "none":
                raise RequestError(400, "log-probabilities with tools are not offered on /v1/responses (a response "
                                        "has none for its calls); /v1/chat/completions reports them",
                                   param="include" if LOGPROBS in (self.include or ()) else "top_logprobs")
            chat.update(logprobs=True, top_logprobs=self.top_logprobs)
        return {k: v for k, v in chat.items() if v is not None}

    def messages(self, history: Sequence[Dict[str, Any]] = ()) -> Tuple[List[Dict[str, Any]], List[str]]:
        """The chat messages (the instructions, ``history``, the input's), and the field each came from
        (``instructions``, ``previous_response_id``, ``input``, ``input[i]``)."""
        messages: List[Dict[str, Any]] = []
        origins: List[str] = []
        if self.instructions is not None:
            messages.append({"role": "system", "content": self.instructions})
            origins.append("instructions")
        messages += history
        origins += ["previous_response_id"] * len(history)
        if isinstance(self.input, str):
            return [*messages, {"role": "user", "content": self.input}], [*origins, "input"]
        own, indices = _chat_messages(self.input)
        return messages + own, origins + [f"input[{i}]" for i in indices]

    def input_messages(self) -> List[Dict[str, Any]]:
        """The input's chat messages alone."""
        return self.messages()[0][self.instructions is not None:]

    def input_items(self) -> List[Dict[str, Any]]:
        """The input as OpenAI lists a response's input items: each with an id, a message's text as parts."""
        if isinstance(self.input, str):
            return [_listed({"type": "message", "role": "user", "content": self.input})]
        return [_listed(item.model_dump(by_alias=True, exclude_none=True)) for item in self.input]


def _chat_messages(items: Sequence[Any]) -> Tuple[List[Dict[str, Any]], List[int]]:
    """Input items as chat messages, and the index of the item each came from: an assistant's text and the
    function calls right after it are one message, as one turn."""
    messages: List[Dict[str, Any]] = []
    indices: List[int] = []
    turn = False  # the last message is an assistant's turn that calls may join
    for i, item in enumerate(items):
        if isinstance(item, ReasoningItem):  # starts the assistant's turn that its text and calls join
            messages.append({"role": "assistant", "content": None, "reasoning_content": item.text})
            turn = True
        elif isinstance(item, MessageItem) and item.role == "assistant" and turn and messages[-1]["content"] is None \
                and "tool_calls" not in messages[-1]:
            messages[-1]["content"] = _text(item.content)
            continue
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            if turn:
                messages[-1].setdefault("tool_calls", []).append(call)
                continue
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            turn = True
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)})
            turn = False
        else:
            messages.append({"role": item.role, "content": _text(item.content)})
            turn = item.role == "assistant"
        indices.append(i)
    return messages, indices


def _listed(item: Dict[str, Any]) -> Dict[str, Any]:
    kind = item.setdefault("type", "message")
    item.setdefault("id", _new_id({"message": "msg", "function_call": "fc", "reasoning": "rs"}.get(kind, "fco")))
    if kind == "message":
        item.setdefault("status", "completed")
        if isinstance(item["content"], str):
            part = "output_text" if item["role"] == "assistant" else "input_text"
            item["content"] = [{"type": part, "text": item["content"]}]
    return item


def _text(content: Union[str, List[TextPart]]) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


def _response_format(fmt: Any) -> Optional[Dict[str, Any]]:
    if isinstance(fmt, TextFormatJsonObject):
        return {"type": "json_object"}
    if isinstance(fmt, TextFormatJsonSchema):
        return {"type": "json_schema", "json_schema": fmt.model_dump(by_alias=True, exclude_none=True,
                                                                     exclude={"type"})}
    return None


def _request_model() -> type:
    ignored = {name: (annotation, Field(default=None, description=what))
               for name, annotation, what in unsupported.IGNORED if name in IGNORED_FIELDS}
    model = create_model("ResponsesRequest", __base__=_ResponsesBase, __doc__=_ResponsesBase.__doc__,
                         __validators__=unsupported.refusing_validators(REFUSED),
                         **unsupported.refused_fields(REFUSED), **ignored, **shared_fields(*SHARED_FIELDS))
    model.__module__ = __name__
    return model


if TYPE_CHECKING:  # the model adds the refused, ignored and shared fields (read only through model_dump)
    ResponsesRequest = _ResponsesBase
else:
    ResponsesRequest = _request_model()

#: Chat's names of fields a Responses request names otherwise (a pattern, and its replacement).
_RENAMED = ((re.compile(r"response_format\.json_schema\.schema\b"), "text.format.schema"),
            (re.compile(r"response_format\.json_schema\b"), "text.format"),
            (re.compile(r"response_format\b"), "text.format"),
            (re.compile(r"max_completion_tokens\b"), "max_output_tokens"),
            (re.compile(r"tool_choice\.function\.name\b"), "tool_choice.name"),
            (re.compile(r"\b(tools\[\d+\])\.function\b"), r"\1"))


def responses_names(text: str) -> str:
    """``text`` (an error's field or message, from the chat path) in the Responses API's names:
    ``tools[0].function.parameters`` is ``tools[0].parameters``."""
    for pattern, ours in _RENAMED:
        text = pattern.sub(ours, text)
    return text


def renamed(exc: RequestError, body: Any) -> RequestError:
    """``exc``, raised by the chat path, in the Responses request's names (a message named by the item, or
    the ``instructions``, it came from)."""
    param = responses_names(exc.param) if exc.param is not None else None
    if param is not None and (param == "messages" or param.startswith("messages[")):
        origins = body.messages()[1]
        index, _, rest = param[len("messages["):].partition("]")
        param = origins[int(index)] + rest if index.isdigit() and int(index) < len(origins) else "input"
    return RequestError(exc.status, responses_names(exc.message), param=param, code=exc.code, type=exc.type,
                        headers=exc.headers)


# ---------------------------------------------------------------------------
# the answer
# ---------------------------------------------------------------------------


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


class ResponseBuilder:
    """A response built from chat deltas: ``text`` and ``call``/``arguments``
    open and fill output items, each step recorded as the event the stream
    sends; :meth:`response` is the response object, :meth:`whole` the
    answer to a chat completion, :meth:`events` a chat stream's events."""

    def __init__(self, body: Any, model: str, *, store: Optional[ResponseStore] = None,
                 previous: Optional[StoredResponse] = None, thinking: Optional[ThinkingTokens] = None) -> None:
        """``store``: where the response is kept when it ends (None: not kept), and found while it runs;
        ``previous``: the response it continues; ``thinking``: which tokens are a reasoning model's thinking,
        when it is answered apart (their log-probabilities are not the text's)."""
        self.body, self.model = body, model
        self.store, self.previous, self.thinking = store, previous, thinking
        self.id = _new_id("resp")
        self.created = int(time.time())
        self.output: List[Dict[str, Any]] = []
        self.status = "in_progress"
        self.error: Optional[Dict[str, Any]] = None
        self.usage: Optional[Dict[str, Any]] = None
        self._events: List[Dict[str, Any]] = []
        self._seq = 0
        self._open = False  # the last output item is still being written
        self._logprobs: List[Dict[str, Any]] = []  # entries not yet sent with a text
        # a background response keeps every event, for the clients that follow it (its own request's stream,
        # GET ?stream=true): each waits on ``_grew``, which is set and replaced at every new event
        self.log: Optional[List[Dict[str, Any]]] = [] if body.background else None
        self._grew = asyncio.Event()
        self._over = False  # no event will come any more
        if store is not None:
            store.start(self.id, self)

    # -- steps ---------------------------------------------------------------

    def text(self, piece: str, logprobs: Sequence[Dict[str, Any]] = ()) -> None:
        """``piece`` of the text, and the log-probability entries of its tokens (entries that come without
        text, as the end's, go with the next piece or, at the end, with the text's last event)."""
        self._logprobs += logprobs
        if not piece:
            return
        if not (self._open and self.output[-1]["type"] == "message"):
            self._close()
            self._add({"id": _new_id("msg"), "type": "message", "status": "in_progress", "role": "assistant",
                       "content": []})
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            self.output[-1]["content"].append(part)
            self._emit("response.content_part.added", item_id=self.output[-1]["id"],
                       output_index=len(self.output) - 1, content_index=0, part=part)
        item = self.output[-1]
        item["content"][0]["text"] += piece
        item["content"][0]["logprobs"] += self._logprobs
        self._emit("response.output_text.delta", item_id=item["id"], output_index=len(self.output) - 1,
                   content_index=0, delta=piece, logprobs=self._logprobs)
        self._logprobs = []

    def reasoning(self, piece: str) -> None:
        """``piece`` of a reasoning model's thinking (an output item of its own, before the answer's)."""
        if not piece:
            return
        if not (self._open and self.output[-1]["type"] == "reasoning"):
            self._close()
            self._add({"id": _new_id("rs"), "type": "reasoning", "status": "in_progress", "summary": [],
                       "content": [{"type": "reasoning_text", "text": ""}]})
        item = self.output[-1]
        item["content"][0]["text"] += piece
        self._emit("response.reasoning_text.delta", item_id=item["id"], output_index=len(self.output) - 1,
                   content_index=0, delta=piece)

    def call(self, call_id: str, name: str) -> None:
        self._close()
        self._add({"id": _new_id("fc"), "type": "function_call", "status": "in_progress", "call_id": call_id,
                   "name": name, "arguments": ""})

    def arguments(self, piece: str) -> None:
        if not piece:
            return
        item = self.output[-1]
        item["arguments"] += piece
        self._emit("response.function_call_arguments.delta", item_id=item["id"], output_index=len(self.output) - 1,
                   delta=piece)

    def finish(self, finish_reason: Optional[str], usage: Optional[Dict[str, Any]]) -> None:
        """The end: "length" leaves the response (and an item being written) incomplete."""
        self.status = "incomplete" if finish_reason == "length" else "completed"
        self._close(self.status)
        if usage is not None:
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            self.usage = {"input_tokens": usage["prompt_tokens"],
                          "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
                          "output_tokens": usage["completion_tokens"],
                          "output_tokens_details": {"reasoning_tokens": (usage.get("completion_tokens_details")
                                                                         or {}).get("reasoning_tokens", 0)},
                          "total_tokens": usage["total_tokens"]}
            if "speculation" in usage:
                self.usage["speculation"] = usage["speculation"]
        self._emit(f"response.{self.status}", response=self.response())
        self._keep()

    def fail(self, error: Dict[str, Any]) -> None:
        """Decoding failed after the answer started (``error``: an OpenAI error body's fields): what was
        written is left incomplete, and the response failed (its ``error`` says why)."""
        self._close("incomplete")
        self.status = "failed"
        self.error = {"code": error.get("code") or error.get("type") or "server_error",
                      "message": responses_names(error.get("message") or "")}
        self._emit("response.failed", response=self.response())
        self._keep()

    def cancel(self, *, keep: bool = True) -> None:
        """Cancelled while it ran (a background response; its task is cancelled too, so nothing more is
        written): what was written is left incomplete, and the response stored as it stands (``keep``) or
        just no longer found."""
        if self.status != "in_progress":
            return
        self._close("incomplete")
        self.status = "cancelled"
        if keep:
            self._keep()
        else:
            self.end()

    def end(self) -> None:
        """It will not grow any more (ended, or abandoned: its client left): no longer found as running."""
        self._over = True
        self._wake()
        if self.store is not None:
            self.store.end(self.id)

    async def follow(self, after: Optional[int] = None) -> AsyncGenerator[Tuple[str, Dict[str, Any]], None]:
        """A background response's events after sequence number ``after`` (None: all), as (type, data), as
        they come, until it ends."""
        assert self.log is not None, "only a background response keeps its events"
        next_ = 0 if after is None else after + 1
        while True:
            while next_ < len(self.log):
                event = self.log[next_]
                next_ += 1
                yield event["type"], event
            if self._over or self.status != "in_progress":
                return
            await self._grew.wait()  # no await since the check above: no event can be missed

    # -- views ----------------------------------------------------------------

    def response(self) -> Dict[str, Any]:
        """The response object as it stands."""
        body = self.body
        fmt = body.text.format if body.text is not None and body.text.format is not None else None
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": self.status,
            "background": bool(body.background), "error": self.error,
            "incomplete_details": {"reason": "max_output_tokens"} if self.status == "incomplete" else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens, "model": self.model,
            "output": self.output,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id, "reasoning": None, "store": self.store is not None,
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
            "tool_choice": (body.tool_choice.model_dump() if isinstance(body.tool_choice, BaseModel)
                            else body.tool_choice or "auto"),
            "tools": [t.model_dump(exclude_none=True) for t in body.tools or ()],
            "top_p": 1.0 if body.top_p is None else body.top_p, "top_logprobs": body.top_logprobs,
            "truncation": "disabled", "usage": self.usage,
            "metadata": getattr(body, "metadata", None) or {}, "user": getattr(body, "user", None)}

    def whole(self, completion: Dict[str, Any]) -> Dict[str, Any]:
        """The response of a whole chat completion (one choice)."""
        choice = completion["choices"][0]
        message = choice["message"]
        self.reasoning(message.get("reasoning_content") or "")
        self.text(message.get("content") or "", self._answers(choice))
        for call in message.get("tool_calls") or ():
            self.call(call["id"], call["function"]["name"])
            self.arguments(call["function"]["arguments"])
        self.finish(choice["finish_reason"], completion.get("usage"))
        return self.response()

    async def events(self, chunks: AsyncGenerator[Dict[str, Any], None]
                     ) -> AsyncGenerator[Tuple[str, Dict[str, Any]], None]:
        """The typed events of a chat stream's chunks (it must carry usage), as (type, data)."""
        self._emit("response.created", response=self.response())
        self._emit("response.in_progress", response=self.response())
        reason: Optional[str] = None
        try:
            async for chunk in chunks:
                if "error" in chunk:  # failed after it started
                    self.fail(chunk["error"])
                    break
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    self.reasoning(delta.get("reasoning_content") or "")
                    self.text(delta.get("content") or "", self._answers(choice))
                    for call in delta.get("tool_calls") or ():
                        if call.get("id"):
                            self.call(call["id"], call["function"]["name"])
                        self.arguments((call.get("function") or {}).get("arguments") or "")
                    reason = choice.get("finish_reason") or reason
                if chunk.get("usage") is not None:
                    self.finish(reason, chunk["usage"])
                for event in self._take():
                    yield event["type"], event
        finally:  # closed early (the client left, or cancelled): its requests end now
            await chunks.aclose()
            self.end()
        for event in self._take():
            yield event["type"], event

    # -- inside ---------------------------------------------------------------

    def _answers(self, choice: Dict[str, Any]) -> List[Dict[str, Any]]:
        """A chat choice's (or chunk's) log-probability entries of the text's tokens, the thinking's left out
        (entries come in token order, whole or spread over the chunks)."""
        entries = (choice.get("logprobs") or {}).get("content") or []
        thinking = self.thinking
        return entries if thinking is None else [e for e in entries if not thinking.feed(bytes(e["bytes"]))]

    def _keep(self) -> None:
        """Store the ended response: a continuation starts from the conversation with this answer at its end
        (the output read as the items a client would send back, so the two ways give the same prompt)."""
        if self.store is None:
            return
        answer = _chat_messages(_OUTPUT_ITEMS.validate_python(self.output))[0]
        before = self.previous or StoredResponse({}, [], [], frozenset())
        items = self.body.input_items()
        ids = before.item_ids | {item["id"] for item in (*items, *self.output)}
        self.store.put(StoredResponse(copy.deepcopy(self.response()), [*before.context, *self.body.input_messages(),
                                                                       *answer], items, ids, tuple(self.log or ())))
        self.end()

    def _add(self, item: Dict[str, Any]) -> None:
        self.output.append(item)
        self._open = True
        self._emit("response.output_item.added", output_index=len(self.output) - 1, item=item)

    def _close(self, status: str = "completed") -> None:
        if not self._open:
            return
        self._open = False
        item, index = self.output[-1], len(self.output) - 1
        item["status"] = status
        if item["type"] == "reasoning":
            self._emit("response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0,
                       text=item["content"][0]["text"])
        elif item["type"] == "message":
            part = item["content"][0]
            part["logprobs"] += self._logprobs
            self._logprobs = []
            self._emit("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                       text=part["text"], logprobs=part["logprobs"])
            self._emit("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                       part=part)
        else:
            self._emit("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                       name=item["name"], arguments=item["arguments"])
        self._emit("response.output_item.done", output_index=index, item=item)

    def _emit(self, kind: str, **fields: Any) -> None:
        # a copy: the items go on changing after the event that shows them
        event = {"type": kind, "sequence_number": self._seq, **copy.deepcopy(fields)}
        self._events.append(event)
        self._seq += 1
        if self.log is not None:
            self.log.append(event)
            self._wake()

    def _wake(self) -> None:
        self._grew.set()
        self._grew = asyncio.Event()

    def _take(self) -> List[Dict[str, Any]]:
        out, self._events = self._events, []
        return out
