"""The OpenAI request bodies the server accepts, and what they become.

Pydantic models validate every field the server uses (a bad value is a 400
that names the field); fields it does not know are ignored, as OpenAI
clients expect.  Fields OpenAI defines whose request the server cannot
honour (``n`` > 1, log-probabilities, penalties) are refused rather than
silently ignored: the output would not be what was asked for.
"""

from __future__ import annotations

from typing import Any, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..params import SamplingParams
from ..core.request_args import GAMMA_LIMIT

__all__ = ["ChatCompletionRequest", "CompletionRequest", "RequestError", "chat_text"]

MAX_STOP = 4  # as OpenAI


class RequestError(Exception):
    """A request the server refuses: ``status`` with OpenAI's error fields."""

    def __init__(self, status: int, message: str, *, param: Optional[str] = None,
                 code: Optional[str] = None, type: str = "invalid_request_error",
                 headers: Optional[dict] = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _Sampling(BaseModel):
    """Fields both endpoints share."""

    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = None
    max_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    min_p: float = Field(default=0.0, ge=0.0, lt=1.0)
    seed: Optional[int] = Field(default=None, ge=0, lt=2**63)
    stop: Optional[Union[str, List[str]]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    n: int = 1
    gamma: Union[Literal["auto"], int] = "auto"
    ignore_eos: bool = False  # as llama-server's and vLLM's: generate max_tokens, never end at EOS
    # Defined by OpenAI, not served: refused unless left at their neutral value.
    logprobs: Optional[Union[bool, int]] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Optional[dict] = None
    best_of: Optional[int] = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int) -> int:
        if v != 1:
            raise ValueError(f"only n=1 is supported (one choice per request), got {v}")
        return v

    @field_validator("gamma")
    @classmethod
    def _gamma(cls, v: Union[str, int]) -> Union[str, int]:
        if isinstance(v, int) and not 0 <= v <= GAMMA_LIMIT:
            raise ValueError(f"must be 'auto' or an int in [0, {GAMMA_LIMIT}], got {v}")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: Optional[Union[str, List[str]]]) -> Optional[List[str]]:
        if v is None:
            return None
        stops = [v] if isinstance(v, str) else v
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop sequences must not be empty")
        return stops

    @model_validator(mode="after")
    def _unsupported(self) -> "_Sampling":
        for name, neutral in (("logprobs", (None, False, 0)), ("presence_penalty", (0.0,)),
                              ("frequency_penalty", (0.0,)), ("logit_bias", (None,)), ("best_of", (None, 1))):
            if getattr(self, name) not in neutral and not (name == "logit_bias" and not self.logit_bias):
                raise ValueError(f"{name} is not supported by this server")
        return self

    def params(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                              min_p=self.min_p, seed=self.seed, ignore_eos=self.ignore_eos)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: ``prompt`` is text, a list of one text, or token ids."""

    prompt: Union[str, List[str], List[int]]
    max_tokens: Optional[int] = Field(default=16, ge=1)  # OpenAI's default for completions
    echo: bool = False
    suffix: Optional[str] = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: Any) -> Union[str, List[int]]:
        if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
            if len(v) != 1:
                raise ValueError(f"one prompt per request is supported, got {len(v)}")
            v = v[0]
        if isinstance(v, str) and not v:
            raise ValueError("prompt must not be empty")
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be empty")
        return v

    @model_validator(mode="after")
    def _unsupported_completion(self) -> "CompletionRequest":
        if self.echo:
            raise ValueError("echo is not supported by this server")
        if self.suffix:
            raise ValueError("suffix is not supported by this server")
        return self


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, List[dict]]] = None

    @field_validator("content")
    @classmethod
    def _text_parts(cls, v: Optional[Union[str, List[dict]]]) -> Optional[Union[str, List[dict]]]:
        for part in v if isinstance(v, list) else ():
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"only text content parts are supported, got type {part.get('type')!r}")
        return v

    def text(self) -> str:
        """The message's text (content parts joined)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part["text"] for part in self.content)


class ChatCompletionRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: List[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)

    @property
    def token_limit(self) -> Optional[int]:
        """``max_completion_tokens`` (the newer name) or ``max_tokens``."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def chat_text(messages: List[ChatMessage]) -> list[dict]:
    """Messages as the chat template wants them (``developer`` is a system role)."""
    return [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in messages]
