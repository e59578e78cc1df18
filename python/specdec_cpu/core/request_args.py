"""Checks of one generation request's arguments, shared by every decoder.

Each check names the argument and the expected value, and runs in the
caller's thread before anything is queued or decoded, so a bad request never
reaches a model (and never disturbs other requests of a batch).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np

from ..errors import ContextOverflowError, InvalidPromptError
from ..params import SamplingParams
from .logprobs import LOGPROB_MODES, MAX_TOP_LOGPROBS
from .protocols import Tokenizer

__all__ = ["GAMMA_LIMIT", "Prompt", "chat_prompt", "check_gamma", "check_request", "check_unicode", "prompt_tokens"]

GAMMA_LIMIT = 64
Prompt = Union[str, bytes, Sequence[int]]


def check_gamma(gamma: object) -> None:
    """``"auto"`` or an int in [0, GAMMA_LIMIT]."""
    if gamma == "auto":
        return
    if isinstance(gamma, bool) or not isinstance(gamma, int) or not 0 <= gamma <= GAMMA_LIMIT:
        raise ValueError(f"gamma must be 'auto' or an int in [0, {GAMMA_LIMIT}], got {gamma!r}")


def check_request(*, max_tokens: object, params: object, gamma: object, has_drafter: bool,
                  cancel: object, timeout: object, n_vocab: Optional[int] = None, logprobs: object = None,
                  logprob_mode: object = "model", prompt_logprobs: object = None) -> None:
    """Raise ``TypeError``/``ValueError`` naming the first bad argument
    (token ids in ``params`` are checked against ``n_vocab`` when given)."""
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    if n_vocab is not None:
        for name, ids in (("logit_bias", [t for t, _ in params.bias_pairs]),
                          ("stop_token_ids", params.stop_token_ids)):
            bad = [t for t in ids if t >= n_vocab]
            if bad:
                raise ValueError(f"{name}: token id {bad[0]} is outside the vocabulary [0, {n_vocab})")
    for name, value in (("logprobs", logprobs), ("prompt_logprobs", prompt_logprobs)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 0 <= value <= MAX_TOP_LOGPROBS):
            raise ValueError(f"{name} must be None or an int in [0, {MAX_TOP_LOGPROBS}] (alternatives per token), "
                             f"got {value!r}")
    if logprob_mode not in LOGPROB_MODES:
        raise ValueError(f"logprob_mode must be one of {', '.join(LOGPROB_MODES)}, got {logprob_mode!r}")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < (prompt_logprobs is None):
        raise ValueError(f"max_tokens must be an int >= 1 (0 only with prompt_logprobs: scoring the prompt), "
                         f"got {max_tokens!r}")
    check_gamma(gamma)
    if not has_drafter and gamma not in (0, "auto"):
        raise ValueError(f"gamma={gamma} needs a drafter: this decoder has none")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
            raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if cancel is not None and not callable(getattr(cancel, "is_set", None)):
        raise TypeError(f"cancel must be a threading.Event (anything with is_set()) or None, got {cancel!r}")


def prompt_tokens(prompt: Any, tokenizer: Tokenizer, n_vocab: int, limit: int) -> list[int]:
    """The prompt as token ids: text and UTF-8 bytes are tokenized (with BOS
    when the model wants it, special tokens parsed), ids are checked.

    Raises ``InvalidPromptError`` (empty, not UTF-8 / Unicode, an id outside
    the vocabulary), ``TypeError`` (not a prompt at all) or
    ``ContextOverflowError`` (longer than ``limit`` tokens).
    """
    if isinstance(prompt, (bytes, bytearray, memoryview)):
        prompt = _utf8_text(bytes(prompt))
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidPromptError("prompt is empty")
        check_unicode(prompt)
        tokens = tokenizer.tokenize(prompt, add_special=True, parse_special=True)
    else:
        tokens = _token_ids(prompt, n_vocab)
    if not tokens:
        raise InvalidPromptError("prompt is empty")
    if len(tokens) > limit:
        raise ContextOverflowError(
            f"prompt is {len(tokens)} tokens but the context holds {limit}; "
            "shorten the prompt or raise n_ctx")
    return tokens


def check_unicode(text: str, name: str = "prompt") -> None:
    """``InvalidPromptError`` naming ``name`` for text UTF-8 cannot hold (a
    lone surrogate, as a JSON ``\\ud800`` escape gives)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidPromptError(
            f"{name} is not valid Unicode: {exc.reason} at index {exc.start} "
            f"({text[exc.start:exc.end]!r}); lone surrogates cannot be encoded as UTF-8") from None


def _utf8_text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidPromptError(
            f"prompt is not valid UTF-8: {exc.reason} at byte {exc.start} "
            f"({data[exc.start:exc.end]!r})") from None


def _token_ids(prompt: object, n_vocab: int) -> list[int]:
    """A prompt of token ids as a list of ints, each checked."""
    if isinstance(prompt, np.ndarray) and prompt.ndim == 1 and prompt.dtype.kind in "iu":
        tokens = prompt.tolist()
    else:
        try:
            tokens = list(prompt)  # type: ignore[call-overload]
        except TypeError:
            raise TypeError("prompt must be a str, UTF-8 bytes or a sequence of int token ids, "
                            f"got {type(prompt).__name__}") from None
        for i, t in enumerate(tokens):
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                raise TypeError(f"prompt[{i}] must be an int token id, got {t!r}")
        tokens = [int(t) for t in tokens]
    for i, t in enumerate(tokens):
        if not 0 <= t < n_vocab:
            raise InvalidPromptError(f"prompt token id {t} (prompt[{i}]) is outside the vocabulary [0, {n_vocab})")
    return tokens



def chat_prompt(tokenizer: Tokenizer, messages: Sequence[dict]) -> str:
    """The model's chat template applied to ``messages`` (``ValueError`` without one)."""
    text = tokenizer.chat_prompt(messages, add_generation_prompt=True)
    if text is None:
        raise ValueError("the target model has no chat template; use generate() with a raw prompt")
    return text
