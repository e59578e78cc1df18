"""``/openapi.json``: the contract as the server keeps it.

The response models below document the bodies the routes answer with (the
routes return them as plain JSON; the tests check the two agree).  The
document is the one FastAPI derives from the routes, then:

* the models of streamed events are added to its components (FastAPI
  documents only what routes return as JSON);
* FastAPI's 422 entries are dropped (a bad body is a 400 here, in OpenAI's
  error shape, which every route documents with its other statuses);
* once the model is loaded, token ids are bounded by its vocabulary, and
  ``n`` by the sequences the server decodes at once;
* with an API key, the bearer scheme is declared on the routes that need it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Literal, Optional, Union

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

from .errors import ErrorResponse

__all__ = ["install_openapi", "JSON_OR_STREAM", "LiveBounds"]

#: the routes anyone may call without the key
OPEN_PATHS = ("/health",)


class Health(BaseModel):
    status: Literal["ok", "loading", "error"]
    error: Optional[str] = None
    replicas: Optional[str] = Field(default=None, description="Ray Serve: why not every replica is ready")


class ModelMeta(BaseModel):
    n_ctx: int = Field(description="The most tokens one request may hold (prompt and output)")
    n_vocab: int
    target: str
    draft: Optional[str] = Field(description="The draft model's file name (null: none)")
    ngram: bool = Field(description="Whether prompt lookup drafts too")
    max_sequences: int
    chat_template: Optional[str] = Field(description="The --chat-template override (null: the model's own)")


class EmbeddingMeta(BaseModel):
    dimensions: int = Field(description="Values per vector")
    max_tokens: int = Field(description="The most tokens one input may have")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: Optional[int] = Field(default=None, description="vLLM's name of meta.n_ctx")
    meta: Optional[ModelMeta] = Field(default=None, description="Absent while the model loads")
    embedding: Optional[EmbeddingMeta] = Field(default=None, description=(
        "The model that answers /v1/embeddings under this name (the --embedding-model has a card of its own)"))


class ModelList(BaseModel):
    object: Literal["list"]
    data: List[ModelCard]


class Speculation(BaseModel):
    """Speculation statistics of the request (llama-server reports them as ``timings``)."""

    drafted: int
    accepted: int
    acceptance: float = Field(description="accepted / drafted")
    mean_alpha: float = Field(description="Mean exact acceptance probability Σ min(p, q) of the verified rows")
    forced: int = Field(description="Tokens a grammar forced (drafted for free)")
    steps: int
    tokens_per_step: float
    prompt_ms: float
    predicted_ms: float
    predicted_per_second: float


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: Optional[PromptTokensDetails] = None
    completion_tokens_details: Optional[Dict[str, int]] = Field(default=None, description=(
        "reasoning_tokens: a reasoning model's thinking, when it is answered apart"))
    speculation: Optional[Speculation] = None


class FunctionCallOut(BaseModel):
    name: str
    arguments: str = Field(description="A JSON object's text")


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"]
    function: FunctionCallOut


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: Optional[str]
    tool_calls: Optional[List[ToolCallOut]] = None
    function_call: Optional[FunctionCallOut] = Field(default=None, description="The call, when asked with functions")
    reasoning_content: Optional[str] = Field(default=None, description="A reasoning model's thinking, when it had any")


FinishReason = Literal["stop", "length", "tool_calls", "function_call"]


class TopLogprob(BaseModel):
    token: str
    logprob: float = Field(description="<= 0; -9999 for a token the sampling distribution excludes")
    bytes: List[int] = Field(description="The token's UTF-8 bytes (a token may hold part of a character)")


class TokenLogprobOut(TopLogprob):
    top_logprobs: List[TopLogprob] = Field(description="The most likely tokens at this position (top_logprobs)")


class ChatLogprobs(BaseModel):
    content: List[TokenLogprobOut]


class CompletionLogprobs(BaseModel):
    """The legacy completions' shape."""

    tokens: List[str]
    token_logprobs: List[Optional[float]] = Field(description="null for the first token of an echoed prompt")
    top_logprobs: Optional[List[Optional[Dict[str, float]]]] = Field(
        description="Alternatives per token (logprobs > 0); null for the first token of an echoed prompt")
    text_offset: List[int] = Field(description="Where each token's text starts in the choice's text")


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: Optional[ChatLogprobs] = Field(default=None, description="With logprobs: true")


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: str
    choices: List[ChatChoice]
    usage: Usage


class CompletionChoice(BaseModel):
    index: int
    text: str
    finish_reason: FinishReason
    logprobs: Optional[CompletionLogprobs] = Field(default=None, description="With logprobs set")


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str
    choices: List[CompletionChoice]
    usage: Usage


class InfillTimings(BaseModel):
    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    predicted_per_second: float
    draft_n: int = Field(description="Tokens drafted (speculation)")
    draft_n_accepted: int


class InfillResult(BaseModel):
    """llama-server's ``/completion`` shape (streamed: the same fields, ``stop`` false until the last event)."""

    index: int
    content: str = Field(description="The middle")
    tokens: List[int]
    id_slot: int
    stop: bool
    model: str
    tokens_predicted: int
    tokens_evaluated: int
    prompt: str
    has_new_line: bool
    truncated: bool
    stop_type: Literal["eos", "word", "limit", "none"]
    stopping_word: str
    tokens_cached: int
    timings: InfillTimings
    completion_probabilities: Optional[List[Dict[str, Any]]] = Field(default=None, description="With n_probs")


class ResponseOutputText(BaseModel):
    type: Literal["output_text"]
    text: str
    annotations: List[Any]
    logprobs: List[Any]


class ResponseMessageItem(BaseModel):
    id: str
    type: Literal["message"]
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"]
    content: List[ResponseOutputText]


class ResponseCallItem(BaseModel):
    id: str
    type: Literal["function_call"]
    status: Literal["in_progress", "completed", "incomplete"]
    call_id: str
    name: str
    arguments: str = Field(description="A JSON object's text")


class ResponseReasoningText(BaseModel):
    type: Literal["reasoning_text"]
    text: str


class ResponseReasoningItem(BaseModel):
    """A reasoning model's thinking (its <think> block), before the answer's items."""

    id: str
    type: Literal["reasoning"]
    status: Literal["in_progress", "completed", "incomplete"]
    summary: List[Any]
    content: List[ResponseReasoningText]


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: Dict[str, int]
    output_tokens: int
    output_tokens_details: Dict[str, int]
    total_tokens: int
    speculation: Optional[Speculation] = None


class ResponseObject(BaseModel):
    """``POST /v1/responses``'s answer (the request's settings echoed, as OpenAI's)."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed", "cancelled"]
    background: bool
    error: Optional[Dict[str, str]] = Field(description="Why it failed ({code, message}), when it did")
    incomplete_details: Optional[Dict[str, str]]
    instructions: Optional[str]
    max_output_tokens: Optional[int]
    model: str
    output: List[Union[ResponseReasoningItem, ResponseMessageItem, ResponseCallItem]]
    parallel_tool_calls: bool
    previous_response_id: Optional[str]
    reasoning: None
    store: bool
    temperature: float
    text: Dict[str, Any]
    tool_choice: Union[str, Dict[str, Any]]
    tools: List[Dict[str, Any]]
    top_p: float
    top_logprobs: Optional[int]
    truncation: Literal["disabled"]
    usage: Optional[ResponseUsage]
    metadata: Dict[str, Any]
    user: Optional[str]


class ResponseDeleted(BaseModel):
    id: str
    object: Literal["response.deleted"]
    deleted: Literal[True]


class InputItemList(BaseModel):
    """A page of a stored response's input items (messages with their text as parts, function calls,
    function call outputs), each with an id."""

    object: Literal["list"]
    data: List[Dict[str, Any]]
    first_id: Optional[str]
    last_id: Optional[str]
    has_more: bool


class ResponseEvent(BaseModel):
    """One event of a streamed response: ``response.created``, ``response.output_item.added``,
    ``response.output_text.delta``, ... ``response.completed`` (or ``response.incomplete``, or
    ``response.failed``), as OpenAI's."""

    model_config = ConfigDict(extra="allow")

    type: str
    sequence_number: int


class ToolCallFunctionDelta(BaseModel):
    name: Optional[str] = None
    arguments: Optional[str] = Field(default=None, description="The next piece of the arguments' JSON text")


class ToolCallDelta(BaseModel):
    index: int
    id: Optional[str] = None
    type: Optional[Literal["function"]] = None
    function: Optional[ToolCallFunctionDelta] = None


class ChatDelta(BaseModel):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None
    tool_calls: Optional[List[ToolCallDelta]] = None
    function_call: Optional[ToolCallFunctionDelta] = Field(default=None, description="When asked with functions")
    reasoning_content: Optional[str] = Field(default=None, description="A piece of a reasoning model's thinking")


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    finish_reason: Optional[FinishReason]
    logprobs: Optional[ChatLogprobs] = None


class ChatCompletionChunk(BaseModel):
    """One event of a chat stream (with ``include_usage``: a last one with no choices, and ``usage``)."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    system_fingerprint: str
    choices: List[ChatChunkChoice]
    usage: Optional[Usage] = None


class CompletionChunkChoice(BaseModel):
    index: int
    text: str
    finish_reason: Optional[FinishReason]
    logprobs: Optional[CompletionLogprobs] = None


class CompletionChunk(BaseModel):
    """One event of a completions stream (with ``include_usage``: a last one with no choices, and ``usage``)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str
    choices: List[CompletionChunkChoice]
    usage: Optional[Usage] = None


class InfillPartial(BaseModel):
    """A streamed ``/infill`` event before the last (``stop`` false): the next piece of the middle."""

    index: int
    content: str
    tokens: List[int]
    stop: Literal[False]
    id_slot: int
    tokens_predicted: int
    tokens_evaluated: int
    completion_probabilities: Optional[List[Dict[str, Any]]] = Field(default=None, description="With n_probs")


#: Models that only streamed events use: added to the document's components.
_EVENT_MODELS: List[type] = [ChatCompletionChunk, CompletionChunk, InfillPartial, ErrorResponse]


def _ref(model: type) -> Dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def JSON_OR_STREAM(model: type, events: List[type], done: bool = True) -> Dict[int | str, Dict[str, Any]]:
    """A 200 that is ``model`` as JSON or, with ``stream: true``, server-sent
    events whose data are one of ``events`` as JSON (an error body if the
    generation fails mid-stream) and, if ``done``, a last ``[DONE]``.  The
    schema describes one event, as OpenAPI 3.1 reads an event stream's."""
    data: Dict[str, Any] = {"type": "string", "contentMediaType": "application/json",
                            "contentSchema": {"anyOf": [_ref(m) for m in [*events, ErrorResponse]]}}
    if done:
        data = {"anyOf": [{"const": "[DONE]"}, data]}
    last = ", then `[DONE]`" if done else ""
    event = {"type": "object", "required": ["data"], "properties": {"data": data},
             "description": f"One server-sent event: a JSON chunk per decoder step{last}"}
    return {200: {"model": model, "description": "The completion (JSON), or its stream with `stream: true`",
                  "content": {"text/event-stream": {"schema": event}}}}


@dataclass(frozen=True)
class LiveBounds:
    """The loaded model's limits, which the document states once it is loaded."""

    n_vocab: int
    max_choices: int  # the most ``n`` a request may ask for
    max_requests: int  # the most requests (prompts × n of one request) that can run and wait at once
    embedding_vocab: Optional[int] = None  # the embedding model's vocabulary (None: no embeddings)
    embedding_dimensions: Optional[int] = None  # its vectors' size, the most ``dimensions`` a request may ask for


def install_openapi(app: FastAPI, live_bounds: Callable[[], Optional[LiveBounds]], api_key: bool) -> None:
    """Serve the document described above from ``app.openapi``."""
    base: Dict[str, Any] = {}
    live: Dict[str, Any] = {}

    def openapi() -> Dict[str, Any]:
        if not base:
            base.update(_cleaned(get_openapi(title=app.title, version=app.version, summary=app.summary,
                                             description=app.description, routes=app.routes), api_key))
        bounds = live_bounds()
        if bounds is None:
            return base
        if not live:  # the model's bounds, once it is loaded
            live.update(_with_bounds(copy.deepcopy(base), bounds))
        return live

    app.openapi = openapi


def _cleaned(doc: Dict[str, Any], api_key: bool) -> Dict[str, Any]:
    for path, methods in doc.get("paths", {}).items():
        for op in methods.values():
            op.get("responses", {}).pop("422", None)
            if api_key and path not in OPEN_PATHS:
                op["security"] = [{"bearer": []}]
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    _, events = models_json_schema([(m, "serialization") for m in _EVENT_MODELS],
                                   ref_template="#/components/schemas/{model}")
    for name, schema in events.get("$defs", {}).items():
        schemas.setdefault(name, schema)
    if api_key:
        doc.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
            "type": "http", "scheme": "bearer", "description": "--api-key"}
    return doc


def _with_bounds(doc: Dict[str, Any], bounds: LiveBounds) -> Dict[str, Any]:
    """Every token id's ``maximum`` (MAX_TOKEN_ID in the models) becomes
    ``n_vocab - 1`` (the embedding model's, in an embeddings request),
    ``n``'s (MAX_CHOICES) the server's own limit of choices, the prompts'
    count (MAX_PROMPTS) the requests it can run and queue, and an embeddings
    request's ``dimensions`` at most the vectors' size."""
    from .openai_schema import MAX_CHOICES, MAX_PROMPTS, MAX_TOKEN_ID

    def walk(node: Any, n_vocab: int) -> None:
        if isinstance(node, dict):
            if node.get("type") == "integer" and node.get("maximum") == MAX_TOKEN_ID:
                node["maximum"] = n_vocab - 1
            for value in node.values():
                walk(value, n_vocab)
        elif isinstance(node, list):
            for value in node:
                walk(value, n_vocab)

    embedding = doc.get("components", {}).get("schemas", {}).get("EmbeddingRequest")
    if embedding is not None and bounds.embedding_vocab is not None:
        walk(embedding, bounds.embedding_vocab)
        for choice in embedding.get("properties", {}).get("dimensions", {}).get("anyOf", []):
            if choice.get("type") == "integer":
                choice["maximum"] = bounds.embedding_dimensions
    walk(doc, bounds.n_vocab)
    for schema in doc.get("components", {}).get("schemas", {}).values():
        for choice in schema.get("properties", {}).get("n", {}).get("anyOf", []):
            if choice.get("maximum") == MAX_CHOICES:
                choice["maximum"] = min(MAX_CHOICES, bounds.max_choices)
        for choice in schema.get("properties", {}).get("prompt", {}).get("anyOf", []):
            if choice.get("maxItems") == MAX_PROMPTS:
                choice["maxItems"] = min(MAX_PROMPTS, bounds.max_requests)
    return doc
