"""The OpenAI-compatible HTTP API over one BatchedDecoder (FastAPI).

Endpoints: ``GET /health`` (200 ready, 503 loading; open without the key),
``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``
(JSON or server-sent events with ``stream: true``), ``POST /tokenize`` and
``POST /detokenize`` (llama-server's), ``GET /metrics`` (Prometheus).
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

import json
import logging
import os
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Sequence, Union

from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from fastapi.sse import EventSourceResponse, format_sse_event

from ..decoding.batched import BatchedDecoder
from ..decoding.request import AsyncRequestStream
from ..errors import (
    ChatTemplateError,
    ChatTemplateRefusal,
    ContextOverflowError,
    DecoderClosedError,
    InvalidGrammarError,
    InvalidLogitsError,
    InvalidPromptError,
    QueueFullError,
    SpecDecError,
)
from . import openapi as docs
from .errors import BodyLimit, RequestError, error_responses, install_error_handlers
from .openai_schema import ChatCompletionRequest, CompletionRequest, chat_messages
from .prometheus import CONTENT_TYPE, metrics_response
from .responses import Reply, StreamShaper, finish_reason, message_of, new_request_id, system_fingerprint, usage
from .structured import OutputSpec, compile_constraint, output_spec
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
        app.add_middleware(CORSMiddleware, allow_origins=list(options.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"],
                           expose_headers=["Retry-After", "x-specdec-replica"], max_age=600)
    app.state.specdec = state
    install_error_handlers(app)
    docs.install_openapi(app, lambda: state.decoder.tokenizer.n_vocab if state.decoder is not None else None,
                         api_key=options.api_key is not None)

    def authorized(request: Request) -> None:
        if options.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or key.strip() != options.api_key:
            raise RequestError(401, "Incorrect API key provided: pass it as 'Authorization: Bearer KEY'",
                               code="invalid_api_key")

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
        card: dict = {"id": options.model_name, "object": "model", "created": int(state.started),
                      "owned_by": "specdec-cpu"}
        dec = state.decoder
        if dec is not None:
            card["max_model_len"] = dec.n_ctx
            card["meta"] = {"n_ctx": dec.n_ctx, "n_vocab": dec.tokenizer.n_vocab,
                            "target": os.path.basename(dec.target_path or ""),
                            "draft": os.path.basename(dec.draft_path) if dec.draft_path else None,
                            "ngram": bool(dec.ngram), "max_sequences": dec.max_sequences,
                            "chat_template": _template_name(dec.chat_template)}
        return {"object": "list", "data": [card]}

    @app.get("/metrics", dependencies=[Depends(authorized)], response_class=Response,
             summary="Prometheus metrics (text format)",
             responses={200: {"content": {CONTENT_TYPE.split(";")[0]: {"schema": {"type": "string"}}},
                              "description": "Prometheus' text exposition format"}, **error_responses(401)})
    def metrics() -> Response:
        return metrics_response(state.decoder, metrics_labels)

    @app.post("/v1/completions", dependencies=[Depends(authorized)], summary="A completion of a prompt",
              responses={**docs.JSON_OR_STREAM(docs.Completion), **GENERATION_ERRORS})
    async def completions(body: CompletionRequest, request: Request) -> Response:
        dec = ready_decoder()
        _check_model(body.model, options)
        spec = output_spec(body, chat=False)
        echo = None
        if body.echo:
            prompt = body.prompt
            echo = prompt if isinstance(prompt, str) else detokenize(dec.tokenizer, prompt, dec.tokenizer.n_vocab,
                                                                     "prompt")
        return await _generate(dec, body, body.prompt, body.token_limit(16), "prompt", spec, request, options,
                               state, chat=False, echo=echo)

    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)], summary="The next turn of a chat",
              responses={**docs.JSON_OR_STREAM(docs.ChatCompletion), **GENERATION_ERRORS})
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        dec = ready_decoder()
        _check_model(body.model, options)
        spec = output_spec(body, chat=True)
        text = _chat_prompt(dec, body, spec)
        return await _generate(dec, body, text, body.token_limit(None), "messages", spec, request, options,
                               state, chat=True)

    add_token_routes(app, ready_decoder, authorized)
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
    try:
        return dec.chat_prompt(chat_messages(body.messages), tools=spec.tools,
                               chat_template_kwargs=body.chat_template_kwargs)
    except ChatTemplateRefusal as exc:
        raise RequestError(400, str(exc), param="messages", code="chat_template_refused") from None
    except ChatTemplateError as exc:  # the template's own fault
        raise RequestError(500, str(exc), type="server_error", code="chat_template_failed") from None
    except (InvalidPromptError, ValueError) as exc:
        param = "tools" if spec.tools and "tools" in str(exc) else "messages"
        raise RequestError(400, str(exc), param=param) from None


async def _generate(dec: BatchedDecoder, body: Any, prompt: Any, max_tokens: Optional[int], param: str,
                    spec: OutputSpec, request: Request, options: ServerOptions, state: ServerState, *,
                    chat: bool, echo: Optional[str] = None) -> Response:
    if spec.grammar is not None:  # compiled once per grammar (cached), off the event loop
        await run_in_threadpool(compile_constraint, dec, spec)
    reply = Reply(new_request_id(chat), int(time.time()), options.model_name, state.fingerprint, chat)
    stream, limit = _submit(dec, prompt, body, max_tokens, param, options, spec)
    if body.streamed:
        events = _events(stream, body, reply, spec, options, prompt, echo)
        return EventSourceResponse(events, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        await _wait_or_disconnect(stream, request)
    finally:
        await stream.aclose()
    if stream.error is not None:
        raise _server_error(stream.error)
    gen = stream.result
    if gen.finish_reason == "timeout":
        raise _timeout(options)
    _log(reply.id, stream, 200, options, prompt)
    if chat:
        message = message_of(gen.text, spec)
        choice = {"index": 0, "message": message, "logprobs": None,
                  "finish_reason": finish_reason(gen.finish_reason, "tool_calls" in message)}
    else:
        choice = {"index": 0, "text": (echo or "") + gen.text, "logprobs": None,
                  "finish_reason": finish_reason(gen.finish_reason)}
    return JSONResponse(reply.whole(choice, usage(stream.prompt_tokens, gen)))


def _submit(dec: BatchedDecoder, prompt: Any, body: Any, max_tokens: Optional[int], param: str,
            options: ServerOptions, spec: OutputSpec) -> "tuple[AsyncRequestStream, int]":
    """Tokenize, cap ``max_tokens`` at the context, queue the request."""
    try:
        ids = dec.tokenize(prompt)
    except InvalidPromptError as exc:
        raise RequestError(400, str(exc), param=param) from None
    except ContextOverflowError as exc:
        raise RequestError(400, f"{exc}", param=param, code="context_length_exceeded") from None
    room = dec.n_ctx - len(ids)
    if room < 1:
        raise RequestError(400, f"the prompt is {len(ids)} tokens and fills the context of {dec.n_ctx}: "
                                "no room for a completion", param=param, code="context_length_exceeded")
    limit = room if max_tokens is None else min(max_tokens, room)  # capped at the context
    try:
        stream = dec.astream(ids, max_tokens=limit, params=body.params(), stop=body.stop or (),
                             gamma=body.gamma, timeout=options.request_timeout, grammar=spec.grammar)
    except QueueFullError as exc:
        raise RequestError(429, f"the server is busy: {exc}", type="rate_limit_error",
                           code="rate_limit_exceeded", headers={"Retry-After": str(options.retry_after)}) from None
    except DecoderClosedError as exc:
        raise RequestError(503, f"the server is shutting down: {exc}", type="server_error") from None
    except InvalidGrammarError as exc:  # compiled above: only if the cache lost it meanwhile
        raise RequestError(400, str(exc), param=spec.param, code="invalid_grammar") from None
    except ValueError as exc:  # a sampling parameter the decoder refuses
        raise RequestError(400, str(exc)) from None
    return stream, limit


async def _wait_or_disconnect(stream: AsyncRequestStream, request: Request) -> None:
    """Wait for the whole generation; stop it if the client goes away."""
    import anyio

    async with anyio.create_task_group() as tg:
        async def watch() -> None:
            while True:
                if await request.is_disconnected():
                    await stream.aclose()
                    return
                await anyio.sleep(0.1)

        tg.start_soon(watch)
        await stream.wait()
        tg.cancel_scope.cancel()


async def _events(stream: AsyncRequestStream, body: Any, reply: Reply, spec: OutputSpec, options: ServerOptions,
                  prompt_text: Any, echo: Optional[str]) -> AsyncIterator[bytes]:
    """The server-sent events of a streamed answer, ending in ``data: [DONE]``.

    If the client disconnects, the response task is cancelled here and the
    ``finally`` ends the request at the decoder's next step."""
    with_usage = body.include_usage
    shaper = StreamShaper(spec) if reply.chat else None

    def event(data: Any) -> bytes:
        return format_sse_event(data_str=json.dumps(data, ensure_ascii=False))

    def chunk(delta_or_text: Any, reason: Optional[str] = None) -> bytes:
        return event(reply.chunk(delta_or_text, reason, with_usage=with_usage))

    try:
        if shaper is not None:
            yield chunk({"role": "assistant", "content": ""})
        elif echo:
            yield chunk(echo)
        async for piece in stream:
            piece += stream.read_ready()  # one event for all of a step's tokens
            if shaper is None:
                yield chunk(piece)
                continue
            for delta in shaper.feed(piece):
                yield chunk(delta)
        gen = stream.result
        if gen.finish_reason == "timeout":
            yield event(_timeout(options).body())
            return
        calls = False
        if shaper is not None:
            for delta in shaper.finish():
                yield chunk(delta)
            calls = shaper.tool_calls
        yield chunk({} if reply.chat else "", finish_reason(gen.finish_reason, calls))
        if with_usage:
            yield event(reply.usage_chunk(usage(stream.prompt_tokens, gen)))
        yield format_sse_event(data_str="[DONE]")
        _log(reply.id, stream, 200, options, prompt_text)
    except SpecDecError as exc:  # this request failed after its answer started
        yield event(_server_error(exc).body())
    finally:
        await stream.aclose()
        if stream.result is not None and stream.result.finish_reason == "cancelled":
            _log(reply.id, stream, 499, options, prompt_text)


def _timeout(options: ServerOptions) -> RequestError:
    return RequestError(504, f"the request took longer than the server's limit of {options.request_timeout} s",
                        type="timeout_error", code="timeout")


def _server_error(exc: BaseException) -> RequestError:
    if isinstance(exc, DecoderClosedError):
        return RequestError(503, f"the server is shutting down: {exc}", type="server_error")
    if isinstance(exc, InvalidLogitsError):
        return RequestError(500, f"the model produced invalid logits: {exc}", type="server_error")
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
