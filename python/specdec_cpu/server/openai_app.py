"""The OpenAI-compatible HTTP API over one BatchedDecoder (FastAPI).

Endpoints: ``GET /health`` (200 ready, 503 loading; open without the key),
``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``
(JSON or server-sent events with ``stream: true``), ``GET /metrics``
(Prometheus).  Every error has OpenAI's shape
``{"error": {"message", "type", "param", "code"}}`` and the status that
says whose fault it is: 4xx for the client's, 5xx only for the server's.

A streaming client that disconnects ends its request at the decoder's next
step (the response's task is cancelled; the stream's ``aclose`` returns at
once).  The decoder is loaded in a background thread after the server starts
listening, so a load balancer sees ``/health`` at 503 until it is ready.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Optional, Union

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.sse import EventSourceResponse, format_sse_event
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import (
    ContextOverflowError,
    DecoderClosedError,
    InvalidLogitsError,
    InvalidPromptError,
    QueueFullError,
    SpecDecError,
)
from ..decoding.batched import BatchedDecoder
from .openai_schema import ChatCompletionRequest, CompletionRequest, RequestError, chat_text
from .prometheus import metrics_response
from ..decoding.request import AsyncRequestStream

__all__ = ["ServerOptions", "ServerState", "create_app"]

log = logging.getLogger("specdec_cpu.server")


@dataclass(frozen=True)
class ServerOptions:
    """How the server behaves (see ``specdec-cpu serve --help``)."""

    model_name: str
    api_key: Optional[str] = None
    max_body_bytes: int = 1 << 20
    request_timeout: Optional[float] = 600.0
    log_prompts: bool = False
    retry_after: int = 1  # seconds a 429 tells the client to wait


class ServerState:
    """The decoder behind the app, and whether it is loaded yet."""

    def __init__(self, load: Callable[[], BatchedDecoder], on_load_error: Optional[Callable[[str], None]] = None):
        self._load = load
        self._on_load_error = on_load_error
        self.decoder: Optional[BatchedDecoder] = None
        self.error: Optional[str] = None
        self.started = time.time()
        self._thread: Optional[threading.Thread] = None

    def start_loading(self) -> None:
        self._thread = threading.Thread(target=self._run_load, name="specdec-load", daemon=True)
        self._thread.start()

    def _run_load(self) -> None:
        try:
            self.decoder = self._load()
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
               metrics_labels: Optional[dict] = None) -> FastAPI:
    """The FastAPI application serving ``load`` (a decoder, or a function
    loading one in the background).  ``metrics_labels`` are added to every
    ``/metrics`` sample (a Ray replica's id)."""
    loader = (lambda: load) if isinstance(load, BatchedDecoder) else load
    state = ServerState(loader, on_load_error)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.start_loading()
        yield
        # The HTTP server has stopped accepting requests and waited for those in flight.
        state.close()

    app = FastAPI(title="specdec-cpu", summary="Exact speculative decoding on CPUs: OpenAI-compatible API",
                  lifespan=lifespan)
    app.add_middleware(_BodyLimit, max_bytes=options.max_body_bytes)
    app.state.specdec = state
    _install_error_handlers(app)

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

    @app.get("/health")
    def health() -> JSONResponse:
        problem = state.problem()
        if problem is None:
            return JSONResponse({"status": "ok"})
        if problem == "loading":
            return JSONResponse({"status": "loading"}, status_code=503)
        return JSONResponse({"status": "error", "error": problem}, status_code=503)

    @app.get("/v1/models", dependencies=[Depends(authorized)])
    def models() -> dict:
        return {"object": "list", "data": [{"id": options.model_name, "object": "model",
                                            "created": int(state.started), "owned_by": "specdec-cpu"}]}

    @app.get("/metrics", dependencies=[Depends(authorized)])
    def metrics() -> Response:
        return metrics_response(state.decoder, metrics_labels)

    @app.post("/v1/completions", dependencies=[Depends(authorized)])
    async def completions(body: CompletionRequest, request: Request) -> Response:
        dec = ready_decoder()
        _check_model(body.model, options)
        prompt = body.prompt
        stream, limit = _submit(dec, prompt, body, body.max_tokens, "prompt", options)
        return await _respond(stream, body, "text_completion", limit, request, options, prompt)

    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)])
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        dec = ready_decoder()
        _check_model(body.model, options)
        try:
            text = dec.chat_prompt(chat_text(body.messages))
        except ValueError as exc:
            raise RequestError(400, str(exc), param="messages") from None
        stream, limit = _submit(dec, text, body, body.token_limit, "messages", options)
        return await _respond(stream, body, "chat.completion", limit, request, options, text)

    return app


# ---------------------------------------------------------------------------
# one request
# ---------------------------------------------------------------------------


def _check_model(name: Optional[str], options: ServerOptions) -> None:
    if name is not None and name != options.model_name:
        raise RequestError(404, f"The model '{name}' does not exist; this server serves '{options.model_name}'",
                           param="model", code="model_not_found")


def _submit(dec: BatchedDecoder, prompt, body, max_tokens: Optional[int], param: str,
            options: ServerOptions) -> tuple[AsyncRequestStream, int]:
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
                             gamma=body.gamma, timeout=options.request_timeout)
    except QueueFullError as exc:
        raise RequestError(429, f"the server is busy: {exc}", type="rate_limit_error",
                           code="rate_limit_exceeded", headers={"Retry-After": str(options.retry_after)}) from None
    except DecoderClosedError as exc:
        raise RequestError(503, f"the server is shutting down: {exc}", type="server_error") from None
    except ValueError as exc:  # a sampling parameter the decoder refuses
        raise RequestError(400, str(exc)) from None
    return stream, limit


async def _respond(stream: AsyncRequestStream, body, kind: str, limit: int, request: Request,
                   options: ServerOptions, prompt_text) -> Response:
    created = int(time.time())
    rid = ("chatcmpl-" if kind == "chat.completion" else "cmpl-") + str(stream.id)
    if body.stream:
        events = _events(stream, body, kind, rid, created, options, prompt_text)
        return EventSourceResponse(events, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        await _wait_or_disconnect(stream, request)
    finally:
        await stream.aclose()
    if stream.error is not None:
        raise _server_error(stream.error)
    gen = stream.result
    if gen.finish_reason == "timeout":
        raise RequestError(504, f"the request took longer than the server's limit of {options.request_timeout} s",
                           type="timeout_error", code="timeout")
    _log(stream, kind, 200, options, prompt_text)
    reason = _finish_reason(gen.finish_reason)
    usage = _usage(stream)
    if kind == "chat.completion":
        choice = {"index": 0, "message": {"role": "assistant", "content": gen.text}, "finish_reason": reason,
                  "logprobs": None}
    else:
        choice = {"index": 0, "text": gen.text, "finish_reason": reason, "logprobs": None}
    return JSONResponse({"id": rid, "object": kind, "created": created, "model": options.model_name,
                         "choices": [choice], "usage": usage})


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


async def _events(stream: AsyncRequestStream, body, kind: str, rid: str, created: int,
                  options: ServerOptions, prompt_text) -> AsyncIterator[bytes]:
    """The server-sent events of a streamed answer, ending in ``data: [DONE]``.

    If the client disconnects, the response task is cancelled here and the
    ``finally`` ends the request at the decoder's next step."""
    chat = kind == "chat.completion"
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(delta_or_text, reason=None) -> bytes:
        choice = ({"index": 0, "delta": delta_or_text, "finish_reason": reason, "logprobs": None} if chat
                  else {"index": 0, "text": delta_or_text, "finish_reason": reason, "logprobs": None})
        data = {"id": rid, "object": obj, "created": created, "model": options.model_name, "choices": [choice]}
        if body.include_usage:
            data["usage"] = None
        return format_sse_event(data_str=json.dumps(data))

    try:
        if chat:
            yield chunk({"role": "assistant", "content": ""})
        async for piece in stream:
            piece += stream.read_ready()  # one event for all of a step's tokens
            yield chunk({"content": piece} if chat else piece)
        gen = stream.result
        if gen.finish_reason == "timeout":
            err = RequestError(504, "the request took longer than the server's limit of "
                                    f"{options.request_timeout} s", type="timeout_error", code="timeout")
            yield format_sse_event(data_str=json.dumps(err.body()))
            return
        yield chunk({} if chat else "", _finish_reason(gen.finish_reason))
        if body.include_usage:
            data = {"id": rid, "object": obj, "created": created, "model": options.model_name, "choices": [],
                    "usage": _usage(stream)}
            yield format_sse_event(data_str=json.dumps(data))
        yield format_sse_event(data_str="[DONE]")
        _log(stream, kind, 200, options, prompt_text)
    except SpecDecError as exc:  # this request failed after its answer started
        err = _server_error(exc)
        yield format_sse_event(data_str=json.dumps(err.body()))
    finally:
        await stream.aclose()
        if stream.result is not None and stream.result.finish_reason == "cancelled":
            _log(stream, kind, 499, options, prompt_text)


def _finish_reason(reason: Optional[str]) -> str:
    # "stop": an end-of-generation token or a stop string; "length": max_tokens or the context.
    return "stop" if reason == "stop" else "length"


def _usage(stream: AsyncRequestStream) -> dict:
    n = len(stream.result.tokens) if stream.result is not None else 0
    return {"prompt_tokens": stream.prompt_tokens, "completion_tokens": n,
            "total_tokens": stream.prompt_tokens + n}


def _server_error(exc: BaseException) -> RequestError:
    if isinstance(exc, DecoderClosedError):
        return RequestError(503, f"the server is shutting down: {exc}", type="server_error")
    if isinstance(exc, InvalidLogitsError):
        return RequestError(500, f"the model produced invalid logits: {exc}", type="server_error")
    return RequestError(500, f"generation failed: {exc}", type="server_error")


def _log(stream: AsyncRequestStream, kind: str, status: int, options: ServerOptions, prompt_text) -> None:
    gen = stream.result
    if gen is None:
        return
    s = gen.stats
    line = (f"request {stream.id} {kind} status={status} outcome={gen.finish_reason} "
            f"prompt={s.prompt_tokens} (cached {s.prompt_cached}) tokens={s.tokens} "
            f"{s.tokens_per_second:.1f} tok/s acceptance={s.acceptance:.2f} queue={s.queue_seconds:.2f}s "
            f"total={s.total_seconds:.2f}s")
    if options.log_prompts:
        line += f" prompt={prompt_text!r} output={gen.text!r}"
    log.info(line)


# ---------------------------------------------------------------------------
# errors in OpenAI's shape
# ---------------------------------------------------------------------------


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestError)
    async def request_error(request: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        if first.get("type") == "json_invalid":
            msg, param = f"the request body is not valid JSON: {first.get('ctx', {}).get('error', '')}", None
        elif not loc and first.get("type") in ("missing", "model_attributes_type", "dict_type"):
            msg, param = "the request body must be a JSON object", None
        else:
            param = ".".join(loc) or None
            text = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
            msg = f"{param}: {text}" if param else text
        err = RequestError(400, msg.rstrip(": "), param=loc[0] if loc else param)
        return JSONResponse(err.body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return JSONResponse(RequestError(exc.status_code, message, type=kind, code=code).body(),
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error serving %s", request.url.path)
        return JSONResponse(RequestError(500, f"internal error: {type(exc).__name__}: {exc}",
                                         type="server_error").body(), status_code=500)


class _TooLarge(Exception):
    pass


class _BodyLimit:
    """413 in OpenAI's shape for a body over ``max_bytes``: refused from its
    Content-Length before it is read, or as soon as a chunked body crosses
    the limit (Starlette's own limiter answers in plain text)."""

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._refuse(scope, receive, send)
        seen = 0
        started = False

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        async def tracking_send(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if started:
                raise
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope, receive, send) -> None:
        err = RequestError(413, f"the request body is larger than the server's limit of {self.max_bytes} bytes",
                           code="request_too_large")
        await JSONResponse(err.body(), status_code=413)(scope, receive, send)
