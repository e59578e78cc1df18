"""Sampling parameters shared by the target and the draft model."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional


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
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: Optional[int] = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        _check_real("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int):
            raise TypeError(f"top_k must be an int >= 0 (0 means off), got {self.top_k!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 means off), got {self.top_k}")
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

    @property
    def greedy(self) -> bool:
        """True when sampling reduces to the argmax."""
        return self.temperature == 0.0 or self.top_k == 1


def _check_real(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
