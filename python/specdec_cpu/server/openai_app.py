"""The OpenAI-compatible HTTP API over one BatchedDecoder (FastAPI).

Endpoints: ``GET /health`` (200 ready, 503 loading; open without the key),
``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``
(JSON or server-sent events with ``stream: true``; ``n`` choices decoded
together from one prompt, log-probabilities, penalties and biases, and
fill-in-the-middle with ``suffix``), ``POST /v1/responses`` (OpenAI's
Responses API, answered by the chat path; a stored response read back,
listed by input item or deleted under ``/v1/responses/{id}``),
``POST /infill`` (llama-server's fill-in-the-middle), ``POST /tokenize``
and ``POST /detokenize`` (llama-server's), ``GET /metrics`` (Prometheus).
Every error has OpenAI's shape ``{"error": {"message", "type", "param",
"code"}}`` and the status that says whose fault it is: 4xx for the
client's, 5xx only for the server's.  Everything a request asks is checked
(its fields, its grammar compiled, its chat prompt rendered, its prompt
tokenized) before it is queued.

A streaming client that disconnects ends its request at the decoder's next
step (the response's task is cancelled; the stream's ``aclose`` returns at
once).  The decoder is loaded in a background thread after the server starts
listening, so a load balancer sees ``/health`` at 503 until it is ready.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import (
    Annotated,
    Any,
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Dict,
    List,
    Literal,
    Optional,
    Sequence,
    Union,
)

from fastapi import Depends, FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from fastapi.sse import EventSourceResponse, format_sse_event
from pydantic import ValidationError

from ..chat.reasoning import REASONING_FORMATS
from ..core.request_args import check_unicode
from ..core.stats import Generation
from ..decoding.batched import BatchedDecoder
from ..decoding.request import AsyncRequestStream
from ..errors import (
    ChatTemplateError,
    ChatTemplateRefusal,
    ConstraintError,
    ContextOverflowError,
    DecoderClosedError,
    InfillUnsupportedError,
    InvalidGrammarError,
    InvalidLogitsError,
    InvalidPromptError,
    QueueFullError,
    SpecDecError,
)
from . import openapi as docs
from .embeddings_api import add_embedding_routes, embedder_of, embedding_meta, embedding_model_name
from .errors import BodyLimit, RequestError, error_responses, install_error_handlers, validation_request_error
from .openai_schema import ChatCompletionRequest, CompletionRequest, InfillRequest, chat_messages
from .prometheus import CONTENT_TYPE, metrics_response
from .response_store import ResponseStore, page_of_items
from .responses import (
    LogprobFormatter,
    Reply,
    StreamShaper,
    finish_reason,
    message_of,
    new_request_id,
    system_fingerprint,
    usage,
)
from .responses_api import Includable, ResponseBuilder, ResponsesRequest, renamed
from .structured import (
    OutputSpec,
    compile_constraint,
    output_spec,
    settle_reasoning,
    settle_tools,
    with_banned_call,
)
from .tokens_api import add_token_routes, detokenize

__all__ = ["ServerOptions", "ServerState", "create_app"]

log = logging.getLogger("specdec_cpu.server")

#: What the generation routes may answer besides 200.
GENERATION_ERRORS = error_responses(400, 401, 404, 413, 429, 500, 503, 504)


@dataclass(frozen=True)
class ServerOptions:
    """How the server behaves (see ``specdec-cpu serve --help``)."""

    model_name: str
    api_key: Optional[str] = None
    max_body_bytes: int = 1 << 20
    request_timeout: Optional[float] = 600.0
    log_prompts: bool = False
    retry_after: int = 1  # seconds a 429 tells the client to wait
    cors_origins: Sequence[str] = ()  # browser origins allowed (CORS); none: CORS off
    stored_responses: int = 256  # responses kept for previous_response_id (Responses API); 0: none
    reasoning_format: str = "auto"  # a reasoning model's <think> block: "auto" answers it apart, "none" in content

    def __post_init__(self) -> None:
        if self.reasoning_format not in REASONING_FORMATS:
            raise ValueError(f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}, "
                             f"got {self.reasoning_format!r}")
        if isinstance(self.stored_responses, bool) or not isinstance(self.stored_responses, int) \
                or self.stored_responses < 0:
            raise ValueError(f"stored_responses must be an int >= 0, got {self.stored_responses!r}")


class ServerState:
    """The decoder behind the app, and whether it is loaded yet."""

    def __init__(self, load: Callable[[], BatchedDecoder], on_load_error: Optional[Callable[[str], None]] = None):
        self._load = load
        self._on_load_error = on_load_error
        self.decoder: Optional[BatchedDecoder] = None
        self.error: Optional[str] = None
        self.started = time.time()
        self.fingerprint = ""
        self._thread: Optional[threading.Thread] = None

    def start_loading(self) -> None:
        self._thread = threading.Thread(target=self._run_load, name="specdec-load", daemon=True)
        self._thread.start()

    def _run_load(self) -> None:
        try:
            dec = self._load()
            self.fingerprint = system_fingerprint(dec)
            self.decoder = dec
            log.info("model loaded: ready")
        except BaseException as exc:  # reported by /health and the process's exit
            self.error = f"{type(exc).__name__}: {exc}"
            log.error("loading the model failed: %s", self.error)
            if self._on_load_error is not None:
                self._on_load_error(self.error)

    def problem(self) -> Optional[str]:
        """None when serving, else what is wrong ("loading", the load error, ...)."""
        if self.error is not None:
            return self.error
        dec = self.decoder
        if dec is None:
            return "loading"
        if dec.closed:
            return "closed"
        if not dec.healthy:
            return "the decoder's scheduler has stopped"
        return None

    def close(self, timeout: Optional[float] = 5.0) -> None:
        if self._thread is not None:
            self._thread.join()
        if self.decoder is not None:
            self.decoder.close(drain=True, timeout=timeout)


def create_app(load: Union[BatchedDecoder, Callable[[], BatchedDecoder]], options: ServerOptions,
               on_load_error: Optional[Callable[[str], None]] = None,
               metrics_labels: Optional[dict] = None,
               readiness: Optional[Callable[[], Awaitable[Optional[str]]]] = None) -> FastAPI:
    """The FastAPI application serving ``load`` (a decoder, or a function
    loading one in the background).  ``metrics_labels`` are added to every
    ``/metrics`` sample (a Ray replica's id); ``readiness`` is a further
    test of ``/health`` (Ray: every replica running), returning what is
    not ready or None."""
    loader = (lambda: load) if isinstance(load, BatchedDecoder) else load
    state = ServerState(loader, on_load_error)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.start_loading()
        yield
        # The HTTP server has stopped accepting requests and waited for those in flight.
        state.close()

    app = FastAPI(title="specdec-cpu", summary="Exact speculative decoding on CPUs: OpenAI-compatible API",
                  version=_version(), lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(BodyLimit, max_bytes=options.max_body_bytes)
    if options.cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        # Outermost: a preflight is answered before the key is asked for.
        app.add_middleware(CORSMiddleware, allow_origins=list(options.cors_origins),
                           allow_methods=["GET", "POST", "DELETE"], allow_headers=["Authorization", "Content-Type"],
                           expose_headers=["Retry-After", "x-specdec-replica"], max_age=600)
    app.state.specdec = state

    def authorized(request: Request) -> None:
        if options.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or key.strip() != options.api_key:
            raise RequestError(401, "Incorrect API key provided: pass it as 'Authorization: Bearer KEY'",
                               code="invalid_api_key")

    install_error_handlers(app, authorized)

    def live_bounds() -> Optional[docs.LiveBounds]:
        dec = state.decoder
        if dec is None:
            return None
        embedder = embedder_of(dec)
        embedding = {} if embedder is None else {"embedding_vocab": embedder.n_vocab,
                                                 "embedding_dimensions": embedder.dimensions}
        return docs.LiveBounds(n_vocab=dec.n_vocab, max_choices=dec.max_choices, max_requests=dec.max_requests,
                               **embedding)

    docs.install_openapi(app, live_bounds, api_key=options.api_key is not None)

    def ready_decoder() -> BatchedDecoder:
        if state.decoder is not None and state.decoder.healthy:
            return state.decoder
        if state.decoder is not None:
            what = "the decoder stopped" if not state.decoder.closed else "the server is shutting down"
        else:
            what = "the model failed to load" if state.error else "the model is still loading"
        raise RequestError(503, f"{what}; retry later", type="server_error", code="model_not_ready",
                           headers={"Retry-After": "5"})

    @app.get("/health", response_model=docs.Health, summary="Ready to serve (open without the key)",
             responses={503: {"model": docs.Health, "description": "Loading, failed, or not every replica ready"}})
    async def health() -> JSONResponse:
        problem = state.problem()
        if problem is None and readiness is not None:
            others = await readiness()
            if others is not None:
                return JSONResponse({"status": "loading", "replicas": others}, status_code=503)
        if problem is None:
            return JSONResponse({"status": "ok"})
        if problem == "loading":
            return JSONResponse({"status": "loading"}, status_code=503)
        return JSONResponse({"status": "error", "error": problem}, status_code=503)

    @app.get("/v1/models", dependencies=[Depends(authorized)], response_model=docs.ModelList,
             responses=error_responses(401), summary="The served model, its context size and draft")
    def models() -> dict:
        return {"object": "list", "data": [model_card(), *embedding_card()]}

    @app.get("/v1/models/{model:path}", dependencies=[Depends(authorized)], response_model=docs.ModelCard,
             responses=error_responses(401, 404), summary="The served model, by its name (OpenAI's retrieve)")
    def model(model: str) -> dict:
        own = embedding_card()
        if own and model == own[0]["id"]:
            return own[0]
        _check_model(model, options)
        return model_card()

    def model_card() -> dict:
        card: dict = {"id": options.model_name, "object": "model", "created": int(state.started),
                      "owned_by": "specdec-cpu"}
        dec = state.decoder
        if dec is not None:
            card["max_model_len"] = dec.n_ctx
            card["meta"] = {"n_ctx": dec.n_ctx, "n_vocab": dec.n_vocab,
                            "target": os.path.basename(dec.target_path or ""),
                            "draft": os.path.basename(dec.draft_path) if dec.draft_path else None,
                            "ngram": bool(dec.ngram), "max_sequences": dec.max_sequences,
                            "chat_template": _template_name(dec.chat_template)}
            if embedding_model_name(dec) is None:
                card["embedding"] = embedding_meta(dec)
        return card

    def embedding_card() -> List[dict]:
        """A separate --embedding-model's card (else the served model's card says it embeds)."""
        dec = state.decoder
        name = embedding_model_name(dec) if dec is not None else None
        if dec is None or name is None:
            return []
        return [{"id": name, "object": "model", "created": int(state.started), "owned_by": "specdec-cpu",
                 "embedding": embedding_meta(dec)}]

    @app.get("/metrics", dependencies=[Depends(authorized)], response_class=Response,
             summary="Prometheus metrics (text format)",
             responses={200: {"content": {CONTENT_TYPE.split(";")[0]: {"schema": {"type": "string"}}},
                              "description": "Prometheus' text exposition format"}, **error_responses(401)})
    def metrics() -> Response:
        return metrics_response(state.decoder, metrics_labels)

    @app.post("/v1/completions", dependencies=[Depends(authorized)], summary="A completion of a prompt",
              responses={**docs.JSON_OR_STREAM(docs.Completion, [docs.CompletionChunk]), **GENERATION_ERRORS})
    async def completions(body: CompletionRequest, request: Request) -> Response:
        dec = ready_decoder()
        _check_model(body.model, options)
        spec = output_spec(body, chat=False)
        prompts = list(body.prompt)
        echoes: List[Optional[str]] = [None] * len(prompts)
        if body.echo:
            echoes = [p if isinstance(p, str) else detokenize(dec.tokenizer, p, dec.n_vocab, "prompt")
                      for p in prompts]
        if body.suffix:  # fill in the middle: the prompt is the text before it
            if not all(isinstance(p, str) for p in prompts):
                raise RequestError(400, "suffix needs a text prompt (the text before the middle), not token ids",
                                   param="suffix")
            if body.prompt_logprobs_count() is not None:
                raise RequestError(400, "echo with logprobs scores the prompt's tokens, and with suffix the prompt "
                                        "becomes fill-in-the-middle tokens around the suffix: ask for one of them",
                                   param="suffix")
            prompts = [_infill_ids(dec, p, body.suffix, (), names=("prompt", "suffix")) for p in prompts]
        limit = body.token_limit(16)
        if limit == 0 and body.prompt_logprobs_count() is None:
            raise RequestError(400, "max_tokens=0 asks for no completion: only with echo and logprobs (scoring the "
                                    "prompt)", param="max_tokens")
        return await _generate(dec, body, prompts, limit, "prompt", spec, request, options, state, chat=False,
                               echoes=echoes)

    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)], summary="The next turn of a chat",
              responses={**docs.JSON_OR_STREAM(docs.ChatCompletion, [docs.ChatCompletionChunk]),
                         **GENERATION_ERRORS})
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        dec = ready_decoder()
        _check_model(body.model, options)
        spec = output_spec(body, chat=True)
        text = _chat_prompt(dec, body, spec)
        settle_reasoning(dec, spec, text, body.reasoning_format or options.reasoning_format)
        return await _generate(dec, body, [text], body.token_limit(None), "messages", spec, request, options,
                               state, chat=True)

    store = ResponseStore(options.stored_responses)
    app.state.response_store = store

    @app.post("/v1/responses", dependencies=[Depends(authorized)],
              summary="A response (OpenAI's Responses API), stored for previous_response_id unless store is false",
              responses={**docs.JSON_OR_STREAM(docs.ResponseObject, [docs.ResponseEvent], done=False),
                         **GENERATION_ERRORS})
    async def responses(body: ResponsesRequest, request: Request) -> Response:
        dec = ready_decoder()
        _check_model(body.model, options)
        previous = store.previous(body.previous_response_id) if body.previous_response_id else None
        body.check_item_ids(previous.item_ids if previous is not None else ())
        keep = store if body.store is not False and store.capacity > 0 else None
        if body.background:
            if keep is None:
                why = "store is false" if body.store is False else "this server stores none (--stored-responses 0)"
                raise RequestError(400, f"a background response is stored, to be polled: {why}",
                                   param="background")
        try:
            try:
                chat = ChatCompletionRequest.model_validate(body.as_chat(previous.context if previous else ()))
            except ValidationError as exc:
                raise validation_request_error(exc.errors()) from None
            spec = output_spec(chat, chat=True)
            text = _chat_prompt(dec, chat, spec)
            settle_reasoning(dec, spec, text, body.reasoning_format or options.reasoning_format)
            builder = ResponseBuilder(body, options.model_name, store=keep, previous=previous,
                                      thinking=spec.thinking_tokens())
            try:
                return await _generate(dec, chat, [text], chat.token_limit(None), "input", spec, request, options,
                                       state, chat=True, builder=builder,
                                       background=_launcher(store, builder) if body.background else None)
            except BaseException:
                builder.end()  # refused before it ran, or its client left: nothing to find running
                raise
        except RequestError as exc:
            raise renamed(exc, body) from None

    @app.get("/v1/responses/{response_id}", dependencies=[Depends(authorized)],
             responses={**docs.JSON_OR_STREAM(docs.ResponseObject, [docs.ResponseEvent], done=False),
                        **error_responses(400, 401, 404)},
             summary="A stored response (OpenAI's retrieve); a background one's events again with stream=true")
    async def stored_response(response_id: str,
                              include: Annotated[Optional[List[Includable]], Query(description="Ignored")] = None,
                              stream: Annotated[Optional[bool], Query(description=(
                                  "A background response's events (those sent so far, then the rest as they "
                                  "come), as its own request streamed them"))] = None,
                              starting_after: Annotated[Optional[int], Query(ge=0, description=(
                                  "With stream: only the events after this sequence number"))] = None
                              ) -> Response:
        # async: on the event loop, the one thread that writes running responses
        running = store.running(response_id)
        if not stream:
            return JSONResponse(running.builder.response() if running is not None
                                else store.stored(response_id).response)
        if running is not None and running.builder.log is not None:
            return EventSourceResponse(_typed_sse(running.builder.follow(starting_after)), headers=_SSE_HEADERS)
        events = store.stored(response_id).events if running is None else ()
        if not events:
            raise RequestError(400, "only a background response's events are kept, to be streamed again",
                               param="stream", code="unsupported_parameter")
        first = 0 if starting_after is None else starting_after + 1
        return EventSourceResponse(_typed_sse(_replayed(events[first:])), headers=_SSE_HEADERS)

    @app.post("/v1/responses/{response_id}/cancel", dependencies=[Depends(authorized)],
              response_model=docs.ResponseObject, responses=error_responses(400, 401, 404),
              summary="Cancel a background response (OpenAI's cancel)")
    async def cancel_response(response_id: str) -> JSONResponse:
        running = store.running(response_id)
        if running is None:
            stored = store.stored(response_id)  # the 404
            if not stored.response.get("background"):
                raise RequestError(400, "only a background response can be cancelled", param="response_id")
            return JSONResponse(stored.response)  # it has ended: as it ended
        if running.task is None:
            raise RequestError(400, "only a background response can be cancelled (this one ends when its "
                                    "request does)", param="response_id")
        running.builder.cancel()
        running.task.cancel()
        await asyncio.wait({running.task})  # its requests are closed: the decoder drops them at its next step
        return JSONResponse(running.builder.response())

    @app.delete("/v1/responses/{response_id}", dependencies=[Depends(authorized)],
                response_model=docs.ResponseDeleted, responses=error_responses(400, 401, 404),
                summary="Forget a stored response (a background one still running is cancelled first)")
    async def delete_response(response_id: str) -> dict:
        running = store.running(response_id)
        if running is not None and running.task is None:
            raise RequestError(400, "the response is still being written: delete it once it has ended",
                               param="response_id")
        if running is not None and running.task is not None:  # a background response: stopped, never stored
            running.builder.cancel(keep=False)
            running.task.cancel()
        elif store.pop(response_id) is None:
            store.stored(response_id)  # the 404
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    @app.get("/v1/responses/{response_id}/input_items", dependencies=[Depends(authorized)],
             response_model=docs.InputItemList, responses=error_responses(400, 401, 404),
             summary="A stored response's input items, a page at a time")
    def input_items(response_id: str, limit: Annotated[int, Query(ge=1, le=100)] = 20,
                    order: Literal["asc", "desc"] = "desc", after: Optional[str] = None,
                    include: Annotated[Optional[List[Includable]], Query(description="Ignored")] = None) -> dict:
        return page_of_items(store.stored(response_id).input_items, limit=limit, order=order, after=after)

    @app.post("/infill", dependencies=[Depends(authorized)],
              summary="Fill in the middle between input_prefix and input_suffix (llama-server's)",
              responses={**docs.JSON_OR_STREAM(docs.InfillResult, [docs.InfillPartial, docs.InfillResult], done=False),
                         **GENERATION_ERRORS})
    async def infill(body: InfillRequest, request: Request) -> Response:
        dec = ready_decoder()
        _check_model(body.model, options)
        spec = output_spec(body, chat=False)
        extra = [chunk.model_dump() for chunk in body.input_extra or ()]
        ids = _infill_ids(dec, body.input_prefix, body.input_suffix, extra, names=("input_prefix", "input_suffix"))
        if body.prompt:  # llama-server: the middle's start, after the middle token
            _unicode(body.prompt, "prompt")
            ids += dec.tokenizer.tokenize(body.prompt, add_special=False, parse_special=False)
        if spec.grammar is not None:
            await run_in_threadpool(compile_constraint, dec, spec)
        _ = body.choices  # a best_of other than n (1) is refused, not ignored
        top = body.top_logprobs_count()
        (stream,), _ = _submit(dec, ids, body, body.token_limit(None), "input_prefix", options, spec, 1, top)
        infill_reply = InfillReply(dec, options.model_name, stream, ids, body.stop or (), top)
        if body.streamed:
            return EventSourceResponse(_infill_events(infill_reply, options, spec),
                                       headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        await _finish([stream], request, options, spec)
        _log(new_request_id(False), stream, 200, options, ids)
        return JSONResponse(infill_reply.final())

    add_token_routes(app, ready_decoder, authorized)
    add_embedding_routes(app, ready_decoder, authorized, options.model_name, options.request_timeout)
    return app


# ---------------------------------------------------------------------------
# one request
# ---------------------------------------------------------------------------


def _check_model(name: Optional[str], options: ServerOptions) -> None:
    if name is not None and name != options.model_name:
        raise RequestError(404, f"The model '{name}' does not exist; this server serves '{options.model_name}'",
                           param="model", code="model_not_found")


def _chat_prompt(dec: BatchedDecoder, body: ChatCompletionRequest, spec: OutputSpec) -> str:
    """The rendered chat prompt (400 for messages the template cannot take)."""
    settle_tools(dec, spec)  # whether tools the request may not call are in the prompt
    messages = chat_messages(body.messages)
    try:
        return dec.chat_prompt(messages, tools=spec.tools, chat_template_kwargs=body.chat_template_kwargs)
    except ChatTemplateRefusal as exc:
        raise RequestError(400, str(exc), param="messages", code="chat_template_refused") from None
    except ChatTemplateError as exc:
        if body.chat_template_kwargs and _renders(dec, messages, spec):  # the client's variables broke it
            raise RequestError(400, f"the chat template fails with these chat_template_kwargs: {exc}",
                               param="chat_template_kwargs", code="chat_template_failed") from None
        raise RequestError(500, str(exc), type="server_error", code="chat_template_failed") from None
    except (InvalidPromptError, ValueError) as exc:
        param = "tools" if spec.tools and "tools" in str(exc) else "messages"
        raise RequestError(400, str(exc), param=param) from None


def _renders(dec: BatchedDecoder, messages: Any, spec: OutputSpec) -> bool:
    """Whether the chat template renders ``messages`` without extra variables."""
    try:
        dec.chat_prompt(messages, tools=spec.tools)
    except (ChatTemplateError, ValueError):
        return False
    return True


def _infill_ids(dec: BatchedDecoder, prefix: str, suffix: str, extra: Any, *,
                names: "tuple[str, str]") -> "list[int]":
    """The fill-in-the-middle prompt (400 for a model without FIM tokens, or
    text UTF-8 cannot hold); ``names``: the request's fields of the prefix
    and the suffix."""
    for text, name in zip((prefix, suffix), names):
        _unicode(text, name)
    try:
        return dec.infill_prompt(prefix, suffix, extra)
    except InfillUnsupportedError as exc:
        raise RequestError(400, str(exc), param=names[1], code="infill_unsupported") from None
    except ValueError as exc:  # a bad input_extra entry
        raise RequestError(400, str(exc), param="input_extra") from None


def _unicode(text: str, param: str) -> None:
    try:
        check_unicode(text, param)
    except InvalidPromptError as exc:
        raise RequestError(400, str(exc), param=param) from None


async def _generate(dec: BatchedDecoder, body: Any, prompts: List[Any], max_tokens: Optional[int], param: str,
                    spec: OutputSpec, request: Request, options: ServerOptions, state: ServerState, *,
                    chat: bool, echoes: Optional[List[Optional[str]]] = None,
                    builder: Optional[ResponseBuilder] = None,
                    background: Optional[Callable[[AsyncGenerator[Any, None]], None]] = None) -> Response:
    """Answer ``body``: ``n`` choices of each prompt, choice ``i * n + j`` being prompt i's choice j
    (``builder``: answered as a response of the Responses API; ``background``: given its events, to be
    run by nobody's request, and the response is answered as it stands)."""
    if spec.grammar is not None or spec.calls is not None:  # compiled once per grammar (cached), off the event loop
        await run_in_threadpool(compile_constraint, dec, spec)
    reply = Reply(new_request_id(chat), int(time.time()), options.model_name, state.fingerprint, chat)
    top = body.top_logprobs_count()
    prompt_top = None if chat else body.prompt_logprobs_count()
    n = body.choices
    if len(prompts) > 1 and len(prompts) * n > dec.max_requests:
        raise RequestError(400, f"{len(prompts)} prompts × n={n} choices exceed the {dec.max_requests} requests "
                                "this server can run and queue at once", param="prompt")
    streams: "list[AsyncRequestStream]" = []
    prompt_tokens = 0
    try:  # all of the prompts are queued, or none
        for prompt in prompts:
            queued, _ = _submit(dec, prompt, body, max_tokens, param, options, spec, n, top, prompt_top)
            streams += queued
            prompt_tokens += queued[0].prompt_tokens
    except BaseException:
        for stream in streams:
            await stream.aclose()
        raise
    texts = [prompts[i // n] for i in range(len(streams))]  # each choice's prompt, for the log
    echo_of = [(echoes or [None] * len(prompts))[i // n] for i in range(len(streams))]
    if body.streamed:
        source = LogprobSource(dec.tokenizer, top, bool(body.return_tokens_as_token_ids))
        chunks = _chunks(streams, body, reply, spec, options, texts, echo_of, prompt_tokens, n, source,
                         dec.tokenizer)
        if builder is not None and background is not None:  # runs on its own; a stream follows it
            background(builder.events(chunks))
            if not builder.body.stream:
                return JSONResponse(builder.response())
            return EventSourceResponse(_typed_sse(builder.follow()), headers=_SSE_HEADERS)
        events = _typed_sse(builder.events(chunks)) if builder is not None else _sse(chunks)
        return EventSourceResponse(events, headers=_SSE_HEADERS)
    gens = await _finish(streams, request, options, spec)
    for stream, text in zip(streams, texts):
        _log(reply.id, stream, 200, options, text)
    choices = []
    for index, (gen, echo) in enumerate(zip(gens, echo_of)):
        logprobs = None
        if top is not None:
            fmt = LogprobFormatter(dec.tokenizer, top, as_ids=bool(body.return_tokens_as_token_ids))
            if chat:
                logprobs = fmt.chat(gen.logprobs or [])
            elif prompt_top is not None:  # scoring: the echoed prompt's tokens first, the end token last
                logprobs = fmt.legacy([*(gen.prompt_logprobs or []), *(gen.logprobs or []), *_end_entry(gen)],
                                      first=streams[index].prompt_ids[0], echo=echo or "")
            else:
                logprobs = fmt.legacy(gen.logprobs or [])
        if chat:
            message = message_of(gen.text, spec)
            choices.append({"index": index, "message": message, "logprobs": logprobs,
                            "finish_reason": finish_reason(gen.finish_reason,
                                                           spec.calls_key if spec.calls_key in message else None)})
        else:
            choices.append({"index": index, "text": (echo or "") + gen.text, "logprobs": logprobs,
                            "finish_reason": finish_reason(gen.finish_reason)})
    whole = reply.whole(choices, usage(prompt_tokens, gens, n, _reasoning_tokens(dec.tokenizer, spec, gens)))
    return JSONResponse(builder.whole(whole) if builder is not None else whole)


def _launcher(store: ResponseStore, builder: ResponseBuilder) -> Callable[[AsyncGenerator[Any, None]], None]:
    """What runs a background response's events: a task of the event loop, kept by ``store`` while the
    response runs (its end, a failure or a cancel ends it)."""

    def launch(events: AsyncGenerator[Any, None]) -> None:
        async def drain() -> None:
            try:
                async for _ in events:
                    pass
            except Exception as exc:  # a fault of ours: the response fails (stored, for its poller), as a 500 would
                log.exception("background response %s failed", builder.id)
                builder.fail({"code": "server_error", "message": f"internal error: {type(exc).__name__}: {exc}"})

        store.run_in_background(builder.id, asyncio.get_running_loop().create_task(drain()))

    return launch


def _reasoning_tokens(tokenizer: Any, spec: OutputSpec, gens: Sequence[Generation]) -> Optional[int]:
    """The thinking's tokens over the choices, when a reasoning model's thinking is answered apart."""
    if not spec.reasoning:
        return None
    total = 0
    for gen in gens:
        thinking = spec.thinking_tokens()
        assert thinking is not None
        for token in gen.tokens:
            if not thinking.feed(tokenizer.token_bytes(token)):
                break  # the answer has begun: nothing after it is thinking
        total += thinking.count
    return total


def _end_entry(gen: Generation) -> list:
    """The entry of the end token that stopped ``gen``, if one did: a scoring client (lm-evaluation-harness)
    counts one entry per generated token, the end token included, as OpenAI and vLLM give them."""
    return [gen.end_logprob] if gen.end_logprob is not None else []


async def _finish(streams: "list[AsyncRequestStream]", request: Request, options: ServerOptions,
                  spec: OutputSpec) -> "list[Generation]":
    """The generations of ``streams``, whole (a 5xx if one failed or timed out)."""
    try:
        await _wait_or_disconnect(streams, request)
    finally:
        for stream in streams:
            await stream.aclose()
    gens = []
    for stream in streams:
        if stream.error is not None:
            raise _server_error(stream.error, spec)
        gen = stream.result
        assert gen is not None
        if gen.finish_reason == "timeout":
            raise _timeout(options)
        gens.append(gen)
    return gens


def _submit(dec: BatchedDecoder, prompt: Any, body: Any, max_tokens: Optional[int], param: str,
            options: ServerOptions, spec: OutputSpec, n: int = 1, top: Optional[int] = None,
            prompt_top: Optional[int] = None) -> "tuple[list[AsyncRequestStream], int]":
    """Tokenize, cap ``max_tokens`` at the context, queue the request's ``n`` choices
    (``top``, ``prompt_top``: alternatives per output and per prompt token)."""
    params = with_banned_call(body.params(), spec)
    try:
        ids = dec.tokenize(prompt)
    except InvalidPromptError as exc:
        raise RequestError(400, str(exc), param=param) from None
    except ContextOverflowError as exc:
        raise RequestError(400, f"{exc}", param=param, code="context_length_exceeded") from None
    room = dec.n_ctx - len(ids)
    if room < 1 and max_tokens != 0:  # max_tokens 0: the prompt is scored, nothing generated
        raise RequestError(400, f"the prompt is {len(ids)} tokens and fills the context of {dec.n_ctx}: "
                                "no room for a completion", param=param, code="context_length_exceeded")
    if max_tokens is not None and params.min_tokens > max_tokens:
        raise RequestError(400, f"min_tokens={params.min_tokens} exceeds the output limit of {max_tokens}",
                           param="min_tokens")
    if n > dec.max_choices:
        raise RequestError(400, f"n={n} exceeds this server's limit of {dec.max_choices} choices "
                                f"({dec.max_sequences} sequences decoded at once, up to 4 choices each, and "
                                "no more than can run and wait at once)", param="n")
    limit = room if max_tokens is None else min(max_tokens, room)  # capped at the context
    kwargs = dict(max_tokens=limit, params=params, stop=body.stop or (), gamma=body.gamma,
                  timeout=options.request_timeout, grammar=spec.grammar, logprobs=top, logprob_mode=body.mode,
                  prompt_logprobs=prompt_top)
    try:
        streams = [dec.astream(ids, **kwargs)] if n == 1 else dec.astream_choices(ids, n, **kwargs)
    except QueueFullError as exc:
        raise RequestError(429, f"the server is busy: {exc}", type="rate_limit_error",
                           code="rate_limit_exceeded", headers={"Retry-After": str(options.retry_after)}) from None
    except DecoderClosedError as exc:
        raise RequestError(503, f"the server is shutting down: {exc}", type="server_error") from None
    except InvalidGrammarError as exc:  # compiled above: only if the cache lost it meanwhile
        raise RequestError(400, str(exc), param=spec.param, code="invalid_grammar") from None
    except ValueError as exc:  # a parameter the decoder refuses (a token id outside the vocabulary, a γ)
        named = next((f for f in ("logit_bias", "stop_token_ids", "gamma") if str(exc).startswith(f)), None)
        raise RequestError(400, str(exc), param=named) from None
    return streams, limit


async def _wait_or_disconnect(streams: "list[AsyncRequestStream]", request: Request) -> None:
    """Wait for the whole generations; stop them if the client goes away."""
    import anyio

    async with anyio.create_task_group() as tg:
        async def watch() -> None:
            while True:
                if await request.is_disconnected():
                    for stream in streams:
                        await stream.aclose()
                    return
                await anyio.sleep(0.1)

        tg.start_soon(watch)
        for stream in streams:
            await stream.wait()
        tg.cancel_scope.cancel()


class LogprobSource:
    """Where a stream's log-probabilities come from, chunk by chunk: the
    entries each choice has emitted since its last chunk."""

    def __init__(self, tokenizer: Any, top: Optional[int], as_ids: bool = False) -> None:
        self.tokenizer, self.top, self.as_ids = tokenizer, top, as_ids
        self._sent: Dict[int, int] = {}
        self._formatters: Dict[int, LogprobFormatter] = {}

    def prompt(self, index: int, stream: AsyncRequestStream, echo: str) -> Any:
        """The legacy log-probabilities of choice ``index``'s echoed prompt
        (``echo``), before any of its output's (the first token's are null);
        None if the request ended before all were in (a timeout, an error)."""
        result = stream.result
        entries = (result.prompt_logprobs if result is not None else stream.prompt_logprobs()) or []
        if len(entries) < len(stream.prompt_ids) - 1:
            return None
        fmt = self._formatters.setdefault(index, LogprobFormatter(self.tokenizer, self.top or 0, 0, self.as_ids))
        return fmt.legacy(entries, first=stream.prompt_ids[0], echo=echo)

    def take(self, index: int, stream: AsyncRequestStream, shape: str, *, offset: int = 0,
             final: bool = False, end: bool = False) -> Any:
        """The log-probabilities of choice ``index`` not sent yet, in ``shape``
        (``LogprobFormatter``'s method: chat, legacy or llama); None: none
        asked for, or none new (and not ``final``).  ``end``: the last chunk
        also carries the end token's entry (scoring)."""
        if self.top is None:
            return None
        fmt = self._formatters.setdefault(index, LogprobFormatter(self.tokenizer, self.top, offset,
                                                                          self.as_ids))
        start = self._sent.get(index, 0)
        result = stream.result
        entries = (result.logprobs or [])[start:] if final and result is not None else stream.logprobs_since(start)
        if final and end and result is not None:  # scoring: the end token's entry too
            entries = [*entries, *_end_entry(result)]
        if not entries and not final:
            return None
        self._sent[index] = start + len(entries)
        return getattr(fmt, shape)(entries)


async def _merged(streams: "list[AsyncRequestStream]") -> AsyncIterator["tuple[int, Optional[str]]"]:
    """``(choice, text)`` as the choices' pieces arrive (all of a step's pieces
    joined), ``(choice, None)`` when one ends; a choice's error is raised."""
    if len(streams) == 1:
        only = streams[0]
        async for piece in only:
            yield 0, piece + only.read_ready()  # one event for all of a step's tokens
        yield 0, None
        return
    queue: "asyncio.Queue[tuple[int, Optional[str], Optional[BaseException]]]" = asyncio.Queue()

    async def pump(index: int, stream: AsyncRequestStream) -> None:
        try:
            async for piece in stream:
                await queue.put((index, piece + stream.read_ready(), None))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # raised to the reader, as a single stream's error is
            await queue.put((index, None, exc))
            return
        await queue.put((index, None, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(streams)
        while running:
            index, text, error = await queue.get()
            if error is not None:
                raise error
            if text is None:
                running -= 1
            yield index, text
    finally:
        for task in tasks:
            task.cancel()


async def _chunks(streams: "list[AsyncRequestStream]", body: Any, reply: Reply, spec: OutputSpec,
                  options: ServerOptions, prompts: List[Any], echoes: List[Optional[str]], prompt_tokens: int,
                  n: int, logprobs: LogprobSource, tokenizer: Any) -> AsyncGenerator[Dict[str, Any], None]:
    """The chunks of a streamed answer, as JSON objects; a last error body if
    it failed after it started.  ``prompts`` and ``echoes`` are each choice's
    prompt and echoed text, ``n`` the choices of each prompt.

    If the client disconnects, the response task is cancelled here and the
    ``finally`` ends the requests at the decoder's next step."""
    with_usage = body.include_usage
    shapers = [StreamShaper(spec) if reply.chat else None for _ in streams]

    def chunk(index: int, delta_or_text: Any, reason: Optional[str] = None, final: bool = False) -> Dict[str, Any]:
        lp = logprobs.take(index, streams[index], "chat" if reply.chat else "legacy", offset=len(echoes[index] or ""),
                           final=final, end=index in scoring)
        return reply.chunk(delta_or_text, reason, with_usage=with_usage, index=index, logprobs=lp)

    def echo(index: int) -> Dict[str, Any]:
        lp = logprobs.prompt(index, streams[index], echoes[index] or "") if index in scored else None
        return reply.chunk(echoes[index], with_usage=with_usage, index=index, logprobs=lp)

    # An echo with logprobs waits for the prompt to be in: its chunk carries the prompt's log-probabilities.
    scoring = {i for i in range(len(streams)) if echoes[i] and logprobs.top is not None}
    scored = set(scoring)  # whose echo is yet to be sent
    try:
        for index in range(len(streams)):
            if reply.chat:
                yield reply.chunk({"role": "assistant", "content": ""}, with_usage=with_usage, index=index)
            elif echoes[index] and index not in scored:
                yield echo(index)
        async for index, piece in _merged(streams):
            if index in scored:
                yield echo(index)
                scored.discard(index)
            shaper = shapers[index]
            if piece is not None:
                if shaper is None:
                    yield chunk(index, piece)
                    continue
                for delta in shaper.feed(piece):
                    yield chunk(index, delta)
                continue
            gen = streams[index].result
            assert gen is not None
            if gen.finish_reason == "timeout":
                yield _timeout(options).body()
                return
            calls = None
            if shaper is not None:
                for delta in shaper.finish():
                    yield chunk(index, delta)
                calls = shaper.called
            yield chunk(index, {} if reply.chat else "", finish_reason(gen.finish_reason, calls), final=True)
        gens = [s.result for s in streams if s.result is not None]
        if with_usage:
            yield reply.usage_chunk(usage(prompt_tokens, gens, n, _reasoning_tokens(tokenizer, spec, gens)))
        for stream, prompt in zip(streams, prompts):
            _log(reply.id, stream, 200, options, prompt)
    except SpecDecError as exc:  # this request failed after its answer started
        yield _server_error(exc, spec).body()
    finally:
        for stream, prompt in zip(streams, prompts):
            await stream.aclose()
            if stream.result is not None and stream.result.finish_reason == "cancelled":
                _log(reply.id, stream, 499, options, prompt)


_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def _sse(chunks: AsyncGenerator[Dict[str, Any], None]) -> AsyncIterator[bytes]:
    """``chunks`` as server-sent events, then ``[DONE]`` unless the last was an error."""
    failed = False
    try:
        async for data in chunks:
            failed = "error" in data
            yield _event(data)
    finally:  # closed early (the client left): its requests end now, not when it is collected
        await chunks.aclose()
    if not failed:
        yield format_sse_event(data_str="[DONE]")


async def _typed_sse(events: AsyncGenerator["tuple[str, Dict[str, Any]]", None]) -> AsyncIterator[bytes]:
    """Typed events (the Responses API's: ``event:`` names the type; no ``[DONE]``)."""
    try:
        async for kind, data in events:
            yield _event(data, kind)
    finally:  # closed early (the client left): its requests end now, as in _sse
        await events.aclose()


async def _replayed(events: Sequence[Dict[str, Any]]) -> AsyncGenerator["tuple[str, Dict[str, Any]]", None]:
    """Stored events, as (type, data)."""
    for event in events:
        yield event["type"], event


def _event(data: Any, kind: Optional[str] = None) -> bytes:
    return format_sse_event(data_str=json.dumps(data, ensure_ascii=False), event=kind)


class InfillReply:
    """llama-server's ``/completion`` shape of an ``/infill`` answer."""

    def __init__(self, dec: BatchedDecoder, model: str, stream: AsyncRequestStream, prompt: "list[int]",
                 stop: Sequence[str], top: Optional[int]) -> None:
        self.tokenizer, self.model, self.stream, self.prompt, self.stop = dec.tokenizer, model, stream, prompt, stop
        self.logprobs = LogprobSource(dec.tokenizer, top)

    def partial(self, piece: str) -> Dict[str, Any]:
        out: Dict[str, Any] = {"index": 0, "content": piece, "tokens": [], "stop": False, "id_slot": -1,
                               "tokens_predicted": self.stream.tokens_emitted,
                               "tokens_evaluated": self.stream.prompt_tokens}
        probs = self.logprobs.take(0, self.stream, "llama")
        if probs is not None:
            out["completion_probabilities"] = probs
        return out

    def _text(self, ids: Sequence[int]) -> str:
        return b"".join(self.tokenizer.token_bytes(t) for t in ids).decode("utf-8", "replace")

    def final(self, streamed: bool = False) -> Dict[str, Any]:
        gen = self.stream.result
        assert gen is not None
        s = gen.stats
        stop_type, word = "limit", ""
        if gen.finish_reason == "stop":
            rest = self._text(gen.tokens)[len(gen.text):]  # a stop string cut off, if any
            word = next((w for w in self.stop if w in rest), "")
            stop_type = "word" if word else "eos"
        out: Dict[str, Any] = {
            "index": 0, "content": "" if streamed else gen.text, "tokens": [], "id_slot": -1, "stop": True,
            "model": self.model, "tokens_predicted": len(gen.tokens), "tokens_evaluated": s.prompt_tokens,
            "prompt": self._text(self.prompt), "has_new_line": "\n" in gen.text, "truncated": False,
            "stop_type": stop_type, "stopping_word": word, "tokens_cached": s.prompt_cached,
            "timings": {"prompt_n": s.prompt_tokens - s.prompt_cached, "prompt_ms": round(s.prompt_seconds * 1e3, 3),
                        "predicted_n": len(gen.tokens), "predicted_ms": round(s.decode_seconds * 1e3, 3),
                        "predicted_per_second": round(s.tokens_per_second, 3),
                        "draft_n": s.drafted, "draft_n_accepted": s.accepted}}
        probs = self.logprobs.take(0, self.stream, "llama", final=True)  # streamed: those no partial result took
        if probs is not None and (probs or not streamed):
            out["completion_probabilities"] = probs
        return out


async def _infill_events(reply: InfillReply, options: ServerOptions, spec: OutputSpec) -> AsyncIterator[bytes]:
    """``/infill``'s server-sent events: llama-server's partial results, then
    the final one (``stop: true``); no ``[DONE]``, as llama-server."""
    stream = reply.stream
    try:
        async for piece in stream:
            yield _event(reply.partial(piece + stream.read_ready()))
        gen = stream.result
        assert gen is not None
        if gen.finish_reason == "timeout":
            yield _event(_timeout(options).body())
            return
        yield _event(reply.final(streamed=True))
        _log(new_request_id(False), stream, 200, options, reply.prompt)
    except SpecDecError as exc:
        yield _event(_server_error(exc, spec).body())
    finally:
        await stream.aclose()


def _timeout(options: ServerOptions) -> RequestError:
    return RequestError(504, f"the request took longer than the server's limit of {options.request_timeout} s",
                        type="timeout_error", code="timeout")


def _server_error(exc: BaseException, spec: OutputSpec) -> RequestError:
    if isinstance(exc, DecoderClosedError):
        return RequestError(503, f"the server is shutting down: {exc}", type="server_error")
    if isinstance(exc, InvalidLogitsError):
        return RequestError(500, f"the model produced invalid logits: {exc}", type="server_error")
    if isinstance(exc, ConstraintError):  # the request's grammar went past a limit of the matcher
        return RequestError(400, f"the output's grammar cannot be followed: {exc}", code="invalid_grammar",
                            param=spec.grammar_param)
    return RequestError(500, f"generation failed: {exc}", type="server_error")


def _log(rid: str, stream: AsyncRequestStream, status: int, options: ServerOptions, prompt_text: Any) -> None:
    gen = stream.result
    if gen is None:
        return
    s = gen.stats
    line = (f"request {rid} status={status} outcome={gen.finish_reason} "
            f"prompt={s.prompt_tokens} (cached {s.prompt_cached}) tokens={s.tokens} "
            f"{s.tokens_per_second:.1f} tok/s acceptance={s.acceptance:.2f} queue={s.queue_seconds:.2f}s "
            f"total={s.total_seconds:.2f}s")
    if options.log_prompts:
        line += f" prompt={prompt_text!r} output={gen.text!r}"
    log.info(line)


def _template_name(spec: Optional[str]) -> Optional[str]:
    if spec is None:
        return None
    return "inline chat template" if "{{" in spec or "{%" in spec else os.path.basename(spec)


def _version() -> str:
    from .. import __version__

    return __version__
