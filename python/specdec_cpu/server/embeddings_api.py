"""OpenAI's ``POST /v1/embeddings``: one vector per text (or token-id list).

The vectors come from the decoder's :class:`~specdec_cpu.decoding.embeddings.Embedder`:
the ``--embedding-model`` GGUF when one is given (listed by ``/v1/models``
under its file's name), else the served model's own hidden states,
mean-pooled (as llama-server's ``--embeddings``).  Every vector is
L2-normalised, as OpenAI's; ``dimensions`` keeps the first values and
normalises them again, as OpenAI's text-embedding-3 models do (useful with
a Matryoshka-trained model such as nomic-embed-text-v1.5).  ``encoding_format``
``base64`` sends the little-endian float32 bytes, which the ``openai``
package asks for by default.
"""

from __future__ import annotations

import base64
import os
import threading
import time
from functools import partial
from typing import Annotated, Any, Callable, List, Literal, Optional, Union

import anyio
import numpy as np
from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from ..errors import DecoderClosedError, GenerationCancelled, InvalidPromptError, SpecDecError, UnsupportedModelError
from .errors import RequestError, error_responses
from .openai_schema import AS_INT, prompt_list, prompt_list_schema

__all__ = ["add_embedding_routes", "embedder_of", "embedding_meta", "embedding_model_name", "MAX_EMBEDDING_INPUTS"]

MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit of inputs per request

_STRICT = ConfigDict(extra="forbid", strict=True)


Inputs = Annotated[Any, BeforeValidator(partial(prompt_list, limit=MAX_EMBEDDING_INPUTS, noun="input")),
                   WithJsonSchema(prompt_list_schema(MAX_EMBEDDING_INPUTS, (
                       f"A text, token ids, or a list of either (up to {MAX_EMBEDDING_INPUTS}): one vector each")))]


class EmbeddingRequest(BaseModel):
    model_config = _STRICT

    input: Inputs
    model: Optional[str] = Field(default=None, description=(
        "The served model's name, or the --embedding-model's (as /v1/models lists it)"))
    encoding_format: Optional[Literal["float", "base64"]] = Field(default=None, description=(
        "float (default): a list of numbers; base64: the little-endian float32 bytes"))
    dimensions: Optional[Annotated[int, Field(ge=1), AS_INT]] = Field(default=None, description=(
        "Keep the first N values, normalised again (for Matryoshka-trained models); at most the model's size"))
    user: Optional[str] = None


class Embedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: Union[List[float], str]


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"]
    data: List[Embedding]
    model: str
    usage: EmbeddingUsage


def embedder_of(dec: Any) -> Optional[Any]:
    """The decoder's Embedder, or None for a decoder not loaded from GGUF files."""
    try:
        return dec.embeddings
    except UnsupportedModelError:
        return None


def embedding_model_name(dec: Any) -> Optional[str]:
    """The name ``/v1/models`` lists a separate embedding model under (its file's name), or None when
    the served model embeds (or nothing does)."""
    embedder = embedder_of(dec)
    if embedder is None or embedder.model_path == dec.target_path:
        return None
    return os.path.splitext(os.path.basename(embedder.model_path))[0]


def embedding_meta(dec: Any) -> Optional[dict]:
    """What a model card says of the model that embeds (None: nothing does)."""
    embedder = embedder_of(dec)
    return None if embedder is None else {"dimensions": embedder.dimensions, "max_tokens": embedder.max_tokens}


def add_embedding_routes(app: FastAPI, ready_decoder: Callable[[], Any], authorized: Callable[..., None],
                         model_name: str, timeout: Optional[float]) -> None:
    """Register ``/v1/embeddings`` on ``app``; a request may take ``timeout`` seconds (None: no limit)."""

    # One embedding at a time (the embedder takes them in turn anyway): the others wait here, on the event
    # loop, not each in a thread of the pool that tokenizing and grammar compiling for generation share.
    one_at_a_time = anyio.CapacityLimiter(1)

    @app.post("/v1/embeddings", dependencies=[Depends(authorized)], response_model=EmbeddingList,
              responses=error_responses(400, 401, 404, 413, 503, 504),
              summary="Vectors of texts (OpenAI's embeddings)")
    async def embeddings(body: EmbeddingRequest, request: Request) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        dec = ready_decoder()
        try:
            embedder = dec.embeddings
        except UnsupportedModelError as exc:
            raise RequestError(400, str(exc), param="model", code="embeddings_unsupported") from None
        left = threading.Event()  # the client went away: the passes not yet run are not run
        async with anyio.create_task_group() as tg:
            async def watch() -> None:
                while not await request.is_disconnected():
                    await anyio.sleep(0.1)
                left.set()

            tg.start_soon(watch)
            try:
                outcome: Any = await anyio.to_thread.run_sync(_answer, dec, embedder, body, model_name, left,
                                                              deadline, limiter=one_at_a_time)
            except Exception as exc:  # raised below, out of the group (which would wrap it in an ExceptionGroup)
                outcome = exc
            tg.cancel_scope.cancel()
        if isinstance(outcome, GenerationCancelled):
            if outcome.reason == "timeout":
                raise RequestError(504, f"the request took longer than the server's limit of {timeout} s",
                                   type="timeout_error", code="timeout")
            raise RequestError(499, "the client closed the request", type="cancelled")  # no one reads it
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def _answer(dec: Any, embedder: Any, body: EmbeddingRequest, model_name: str, cancel: threading.Event,
            deadline: Optional[float]) -> dict:
    """The embeddings of ``body`` (on a worker thread: tokenizing and the passes), by ``deadline``
    (``time.monotonic()``) unless ``cancel`` is set first."""
    own_name = embedding_model_name(dec)
    if body.model is not None and body.model not in (model_name, own_name):
        names = f"'{model_name}'" + (f" or '{own_name}'" if own_name else "")
        raise RequestError(404, f"The model '{body.model}' does not exist; this server embeds with {names}",
                           param="model", code="model_not_found")
    if body.dimensions is not None and body.dimensions > embedder.dimensions:
        raise RequestError(400, f"dimensions={body.dimensions}: this model's embeddings have "
                                f"{embedder.dimensions} values", param="dimensions")
    try:
        sequences = [_tokens(embedder, x, i) for i, x in enumerate(body.input)]
        limit = embedder.max_tokens
        for i, seq in enumerate(sequences):
            if len(seq) > limit:
                raise RequestError(400, f"input {i} is {len(seq)} tokens; this server embeds at most {limit} "
                                        "tokens per input (--embedding-max-tokens)", param="input",
                                   code="context_length_exceeded")
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        vectors = embedder.embed(sequences, cancel=cancel, timeout=timeout)
    except GenerationCancelled:
        raise
    except InvalidPromptError as exc:
        raise RequestError(400, str(exc), param="input") from None
    except DecoderClosedError as exc:
        raise RequestError(503, f"the server is shutting down: {exc}", type="server_error") from None
    except SpecDecError as exc:
        raise RequestError(500, f"embedding failed: {exc}", type="server_error") from None
    if body.dimensions is not None:
        vectors = _shortened(vectors, body.dimensions)
    as_base64 = body.encoding_format == "base64"
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") if as_base64
             else v.tolist()} for i, v in enumerate(vectors)]
    n = sum(len(s) for s in sequences)
    return {"object": "list", "data": data, "model": body.model or own_name or model_name,
            "usage": {"prompt_tokens": n, "total_tokens": n}}


def _tokens(embedder: Any, value: Union[str, List[int]], index: int) -> List[int]:
    if not isinstance(value, str):
        return value
    try:
        return list(embedder.tokens(value))
    except (UnicodeEncodeError, ValueError) as exc:
        raise RequestError(400, f"input {index} cannot be tokenized: {exc}", param="input") from None


def _shortened(vectors: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` values of each row, L2-normalised again."""
    out = np.ascontiguousarray(vectors[:, :n])
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return np.divide(out, norms, out=out, where=norms > 0)
