"""llama-server's ``POST /tokenize`` and ``POST /detokenize``, in its shapes.

``/tokenize`` takes ``content`` (text), ``add_special`` (BOS where the
model wants one; default false), ``parse_special`` (control tokens' texts
become those tokens; default true) and ``with_pieces`` (each id with its
piece: text, or its bytes as a list of ints when they are not UTF-8) and
answers ``{"tokens": [...]}``; ``/detokenize`` turns ``tokens`` back into
``{"content": text}``.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Union

from fastapi import Depends, FastAPI
from pydantic import BaseModel, ConfigDict, Field

from .errors import RequestError, error_responses
from .openai_schema import MAX_TOKEN_ID, JsonInt

__all__ = ["add_token_routes", "detokenize"]

_STRICT = ConfigDict(extra="forbid", strict=True)


class TokenizeRequest(BaseModel):
    model_config = _STRICT

    content: str
    add_special: Optional[bool] = Field(default=None, description="Add BOS where the model wants one (default false)")
    parse_special: Optional[bool] = Field(default=None, description="Parse control tokens' texts (default true)")
    with_pieces: Optional[bool] = Field(default=None, description="Each id with its piece (default false)")


class TokenPiece(BaseModel):
    id: int
    piece: Union[str, List[int]] = Field(description="The piece's text, or its bytes when they are not UTF-8")


class TokenizeResponse(BaseModel):
    tokens: List[Union[int, TokenPiece]]


class DetokenizeRequest(BaseModel):
    model_config = _STRICT

    tokens: List[JsonInt] = Field(json_schema_extra={"items": {"type": "integer", "minimum": 0,
                                                           "maximum": MAX_TOKEN_ID}})


class DetokenizeResponse(BaseModel):
    content: str


def detokenize(tokenizer: Any, ids: List[int], n_vocab: int, param: str = "tokens") -> str:
    """The text of ``ids`` (400 naming ``param`` for an id outside the vocabulary)."""
    for i, t in enumerate(ids):
        if not 0 <= t < n_vocab:
            raise RequestError(400, f"{param}[{i}] = {t} is outside the vocabulary [0, {n_vocab})", param=param)
    return b"".join(tokenizer.token_bytes(t) for t in ids).decode("utf-8", "replace")


def add_token_routes(app: FastAPI, ready_decoder: Callable[[], Any], authorized: Callable[..., None]) -> None:
    """Register ``/tokenize`` and ``/detokenize`` on ``app``."""
    errors = error_responses(400, 401, 413, 503)

    @app.post("/tokenize", dependencies=[Depends(authorized)], response_model=TokenizeResponse, responses=errors,
              summary="Text to token ids (llama-server's shape)")
    def tokenize(body: TokenizeRequest) -> dict:
        dec = ready_decoder()
        tok = dec.tokenizer
        try:
            ids = tok.tokenize(body.content, add_special=bool(body.add_special),
                               parse_special=body.parse_special is not False)
        except (UnicodeEncodeError, ValueError) as exc:
            raise RequestError(400, f"content cannot be tokenized: {exc}", param="content") from None
        if not body.with_pieces:
            return {"tokens": ids}
        out = []
        for t in ids:
            raw = tok.token_bytes(t)
            try:
                piece: Union[str, List[int]] = raw.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(raw)
            out.append({"id": t, "piece": piece})
        return {"tokens": out}

    @app.post("/detokenize", dependencies=[Depends(authorized)], response_model=DetokenizeResponse,
              responses=errors, summary="Token ids to text (llama-server's shape)")
    def detokenize_route(body: DetokenizeRequest) -> dict:
        dec = ready_decoder()
        return {"content": detokenize(dec.tokenizer, body.tokens, dec.n_vocab)}
