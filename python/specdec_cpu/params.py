"""Sampling parameters shared by the target and the draft model."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple, Union, cast

#: OpenAI's limits for the penalties and for one logit bias.
PENALTY_LIMIT = 2.0
BIAS_LIMIT = 100.0
#: Token counts (top_k, repeat_last_n, min_tokens) beyond any vocabulary or
#: context mean the same as this; the kernels take them as 32-bit ints.
COUNT_LIMIT = 2**30
#: repeat_penalty is kept in [1/limit, limit]: its scale of a logit (the
#: penalty or its inverse) must stay a normal float32; no use needs more.
REPEAT_PENALTY_LIMIT = 1000.0


@dataclass(frozen=True)
class SamplingParams:
    """How one token is drawn from a row of logits.

    The pipeline order is temperature -> top-k -> top-p -> min-p -> normalise
    (the order of HF transformers and vLLM; llama.cpp's default chain differs).
    The same parameters are applied to the target and the draft, so that the
    draft's q and the target's p are the *final* sampling distributions and
    speculative sampling reproduces the target's distribution exactly.

    Args:
        temperature: >= 0. ``0`` means greedy (argmax, ties to the lowest id).
        top_k: >= 0. Keep the k most likely tokens; ``0`` means off.
        top_p: in (0, 1]. Keep the smallest most-likely prefix whose mass
            reaches ``top_p`` (including the token that crosses it); ``1`` is off.
        min_p: in [0, 1). Drop tokens whose probability is below
            ``min_p`` times the largest probability; ``0`` is off.
        seed: starts the request's random streams afresh; ``None`` uses the
            decoder's own streams.  The same seed repeats a run only with
            the same model files, kernel ISA and CPU, a fixed γ (or greedy
            decoding) and the same cache history (a fresh or reset decoder):
            a prompt prefix cached by an earlier call is not decoded again,
            and batched passes round differently from one-row passes
            (docs/math.md §9).
        ignore_eos: never end at an end-of-generation token: the target's
            end-of-generation ids get probability 0 before the pipeline
            above (logit −∞), so the output is exactly the target's
            distribution given that generation goes on, for ``max_tokens``
            tokens unless a stop string or the context ends it first (fixed-
            length output, and benchmarks comparing engines on equal work;
            llama.cpp's and vLLM's ``ignore_eos``).  Only the target's rows
            are masked: a draft proposing an end token is rejected like any
            token the target cannot emit.

    Penalties and biases change the logits before the pipeline, for the
    target's and the draft's row of a position alike, each from the tokens
    before that position, drafted ones included (docs/math.md §12):

        presence_penalty: in [-2, 2]; subtracted once from the logit of
            every token the output holds so far (OpenAI's).
        frequency_penalty: in [-2, 2]; subtracted per occurrence in the
            output so far (OpenAI's).
        repeat_penalty: in [0.001, 1000], 1 is off; a token among the last
            ``repeat_last_n`` tokens (prompt included) has a positive logit
            divided by it and a negative one multiplied (llama.cpp's).
        repeat_last_n: the window of ``repeat_penalty``; 0 is off, -1 the
            whole sequence.
        logit_bias: ``{token id: bias}``, each in [-100, 100], added to the
            logit (OpenAI's; -100 practically bans the token).
        min_tokens: the end-of-generation tokens and ``stop_token_ids``
            are banned until the output has this many tokens.
        stop_token_ids: tokens that end the generation as the end token
            does (not part of the output).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: Optional[int] = None
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    logit_bias: Union[Mapping[int, float], Tuple[Tuple[int, float], ...], None] = None
    min_tokens: int = 0
    stop_token_ids: Tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _check_real("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise TypeError(f"top_k must be an int >= 0 (0 means off), got {self.top_k!r}")
        if not 0 <= self.top_k <= COUNT_LIMIT:
            raise ValueError(f"top_k must be in [0, 2**30] (0 means off), got {self.top_k}")
        _check_real("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1] (1 means off), got {self.top_p}")
        _check_real("min_p", self.min_p)
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f"min_p must be in [0, 1) (0 means off), got {self.min_p}")
        if self.seed is not None:
            if isinstance(self.seed, bool) or not isinstance(self.seed, int):
                raise TypeError(f"seed must be an int or None, got {self.seed!r}")
            if not 0 <= self.seed < 2**64:
                raise ValueError(f"seed must be in [0, 2**64), got {self.seed}")
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"ignore_eos must be a bool, got {self.ignore_eos!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            _check_real(name, getattr(self, name))
            if not -PENALTY_LIMIT <= getattr(self, name) <= PENALTY_LIMIT:
                raise ValueError(f"{name} must be in [-2, 2] (0 means off), got {getattr(self, name)}")
        _check_real("repeat_penalty", self.repeat_penalty)
        if not 1 / REPEAT_PENALTY_LIMIT <= self.repeat_penalty <= REPEAT_PENALTY_LIMIT:
            raise ValueError(f"repeat_penalty must be in [0.001, 1000] (1 means off), got {self.repeat_penalty}")
        _check_int("repeat_last_n", self.repeat_last_n, -1, "(0 means off, -1 the whole sequence)")
        _check_int("min_tokens", self.min_tokens, 0, "")
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        stops = self.stop_token_ids
        if isinstance(stops, (str, bytes)) or not isinstance(stops, (tuple, list)):
            raise TypeError(f"stop_token_ids must be a sequence of token ids, got {stops!r}")
        for t in stops:
            _check_int("stop_token_ids entries", t, 0, "")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in stops))

    @property
    def bias_pairs(self) -> Tuple[Tuple[int, float], ...]:
        """``logit_bias`` as stored: sorted (id, bias) pairs, empty for none.

        The field's type is what the constructor takes (a mapping too);
        ``__post_init__`` has turned it into pairs by now."""
        return cast(Tuple[Tuple[int, float], ...], self.logit_bias or ())

    @property
    def greedy(self) -> bool:
        """True when sampling reduces to the argmax."""
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def adjusts_logits(self) -> bool:
        """Whether penalties, biases or ``min_tokens`` change rows before the pipeline."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias or self.min_tokens
                    or (self.repeat_penalty != 1.0 and self.repeat_last_n != 0))


def _check_int(name: str, value: object, low: int, meaning: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int in [{low}, 2**30] {meaning}".rstrip() + f", got {value!r}")
    if not low <= value <= COUNT_LIMIT:
        raise ValueError(f"{name} must be in [{low}, 2**30] {meaning}".rstrip() + f", got {value}")


def _bias_pairs(bias: Any) -> Optional[Tuple[Tuple[int, float], ...]]:
    """``logit_bias`` as sorted (id, bias) pairs (hashable, like the rest of the parameters)."""
    if bias is None:
        return None
    items = bias.items() if isinstance(bias, Mapping) else bias
    pairs = {}
    try:
        for token, value in items:
            _check_int("logit_bias keys", token, 0, "(token ids)")
            _check_real(f"logit_bias[{token}]", value)
            if not -BIAS_LIMIT <= value <= BIAS_LIMIT:
                raise ValueError(f"logit_bias[{token}] must be in [-100, 100], got {value}")
            pairs[int(token)] = float(value)
    except (TypeError, ValueError) as exc:
        if "logit_bias" not in str(exc):  # not a dict nor (id, bias) pairs: "cannot unpack ...", "not iterable"
            raise TypeError(f"logit_bias must map token ids to numbers (a dict, or (id, bias) pairs), "
                            f"got {bias!r}") from None
        raise
    return tuple(sorted(pairs.items())) or None


def _check_real(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
