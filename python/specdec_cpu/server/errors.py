"""Errors in OpenAI's shape, and the statuses the server answers with.

Every refusal is a :class:`RequestError`: the status says whose fault it is
(4xx the client's, 5xx only the server's) and the body is OpenAI's
``{"error": {"message", "type", "param", "code"}}``, ``param`` naming the
request field at fault.  :data:`STATUS_DESCRIPTIONS` is what ``/openapi.json``
says about each status (the routes list theirs with :func:`error_responses`).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

__all__ = ["RequestError", "ErrorResponse", "STATUS_DESCRIPTIONS", "error_responses", "install_error_handlers"]

log = logging.getLogger("specdec_cpu.server")


class RequestError(Exception):
    """A request the server refuses: ``status`` with OpenAI's error fields."""

    def __init__(self, status: int, message: str, *, param: Optional[str] = None,
                 code: Optional[str] = None, type: str = "invalid_request_error",
                 headers: Optional[dict] = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers or {}

    def body(self) -> dict:
        """The response body (a lone surrogate the client sent, in a message
        or a field's name, written as its escape: UTF-8 cannot hold it)."""
        return {"error": {"message": _utf8_safe(self.message), "type": self.type,
                          "param": None if self.param is None else _utf8_safe(self.param), "code": self.code}}


def _utf8_safe(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class ErrorDetail(BaseModel):
    """What went wrong: ``param`` names the request field at fault."""

    message: str
    type: str
    param: Optional[str]
    code: Optional[str]


class ErrorResponse(BaseModel):
    """OpenAI's error body."""

    error: ErrorDetail


STATUS_DESCRIPTIONS: Dict[int, str] = {
    400: "Invalid request: a field's value, malformed JSON, a field this server does not honour, a prompt "
         "longer than the context, a schema or grammar that does not compile, bad tools (`param` names the field)",
    401: "Missing or wrong API key (`Authorization: Bearer KEY`)",
    404: "Unknown model or path",
    405: "Method not allowed on this path",
    413: "Request body larger than the server's limit",
    429: "The server's queue is full; retry after `Retry-After` seconds",
    500: "A fault of the server (the model produced invalid logits, a bug), never a client's mistake",
    503: "The model is loading, failed, or the server is shutting down; retry later",
    504: "The request took longer than the server's time limit",
}


def error_responses(*statuses: int) -> Dict[int | str, Dict[str, Any]]:
    """The OpenAPI ``responses`` entries of ``statuses``, each with the error schema."""
    return {status: {"model": ErrorResponse, "description": STATUS_DESCRIPTIONS[status]} for status in statuses}


def install_error_handlers(app: FastAPI, authorize: Optional[Callable[[Request], None]] = None) -> None:
    """Every error the app raises answers in OpenAI's shape.  ``authorize``
    (raising a 401 RequestError) is asked before a body that does not parse
    is refused: a client without the key learns that first."""

    @app.exception_handler(RequestError)
    async def request_error(request: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        try:
            if authorize is not None:
                authorize(request)
        except RequestError as denied:
            return JSONResponse(denied.body(), status_code=denied.status)
        err = validation_request_error(exc.errors(), request.headers.get("content-type"))
        return JSONResponse(err.body(), status_code=err.status)

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


#: pydantic error types that are ours (raised by the request models with a
#: code of their own): the type becomes the error's ``code``.
OWN_CODES = ("unsupported_parameter", "unknown_parameter")


def validation_request_error(errors: list, content_type: Optional[str] = None) -> RequestError:
    """A 400 naming the first field pydantic refused, in plain words
    (``content_type``: the request's, named when it is not JSON's)."""
    first = errors[0] if errors else {}
    kind = first.get("type")
    # Union and tagged types add the branch's name to the location: not a field.
    loc = list(first.get("loc", ()))
    loc = [x for x in loc[loc[:1] in (["body"], ["query"], ["path"]):] if not (isinstance(x, str) and _is_branch(x))]
    if kind == "json_invalid":
        return RequestError(400, f"the request body is not valid JSON: {first.get('ctx', {}).get('error', '')}"
                            .rstrip(": "))
    if not loc and kind in ("missing", "model_attributes_type", "dict_type", "model_type"):
        if content_type is None or "json" not in content_type.lower():  # the body was not read as JSON at all
            return RequestError(400, "the request body must be a JSON object sent with 'Content-Type: "
                                     f"application/json' (got {content_type or 'no Content-Type'!r})")
        return RequestError(400, "the request body must be a JSON object")
    param = _path(loc) or None
    if kind == "extra_forbidden":
        return RequestError(400, f"{param}: unknown field; this server refuses fields it does not know rather "
                                 "than ignore them (docs/serving.md lists the fields it takes)",
                            param=param, code="unknown_parameter")
    text = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    own = kind in OWN_CODES  # messages that name the field themselves
    msg = f"{param}: {text}" if param and not own else text
    code = kind if own else None
    return RequestError(400, msg, param=param, code=code)


def _path(loc: list) -> str:
    """``["tools", 0, "function"]`` as ``tools[0].function`` (OpenAI's spelling)."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _is_branch(part: str) -> bool:
    # e.g. "str", "list[int]", "function-after[_check(), str]", "literal['auto']"
    return part in ("str", "int", "float", "bool", "dict", "list") or "[" in part


class BodyLimit:
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


class _TooLarge(Exception):
    pass
