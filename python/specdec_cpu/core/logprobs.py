"""Log-probabilities of emitted tokens (OpenAI's ``logprobs``), read off the
target rows a step already holds: no extra pass.

Two distributions can be reported (``LOGPROB_MODES``):

- ``"model"`` (the default, as OpenAI and vLLM report): the target model's
  own distribution, log softmax of its logits at temperature 1, before any
  mask, penalty or truncation;
- ``"sampling"``: the distribution the token was drawn from (mask,
  penalties, temperature, top-k, top-p, min-p), −inf outside its support.

Under speculation the emitted token at row r was drawn from exactly that
row's sampling distribution (docs/math.md §2–§4), so both readings are of
the target, never of the draft.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import numpy as np

from .. import _core, sampling
from ..params import SamplingParams

__all__ = ["LOGPROB_MODES", "MAX_TOP_LOGPROBS", "TokenLogprob", "row_logprobs"]

LOGPROB_MODES = ("model", "sampling")
#: The most alternatives per token (OpenAI's limit).
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token: its log-probability and the ``top`` most likely
    tokens at its position, ``(id, log-probability)`` most likely first."""

    token: int
    logprob: float
    top: Tuple[Tuple[int, float], ...] = ()


def row_logprobs(logits: np.ndarray, tokens: List[int], top_n: int, mode: str, params: SamplingParams,
                 changes: "sampling.Changes" = sampling.NO_CHANGES) -> List[TokenLogprob]:
    """``tokens[r]``'s entry under row ``logits[r]`` (one C++ call for all rows)."""
    k = len(tokens)
    if k == 0:
        return []
    sampling_mode = mode == "sampling"
    knobs = (params.temperature, params.top_k, params.top_p, params.min_p)
    lp, ids, top = _core.logprobs(np.ascontiguousarray(logits[:k]), np.asarray(tokens, dtype=np.int64), top_n,
                                  sampling_mode, *knobs, *((changes.mask, changes.sparse) if sampling_mode
                                                           else (None, None)))
    return [TokenLogprob(int(t), float(lp[r]), tuple(zip(ids[r].tolist(), top[r].tolist())))
            for r, t in enumerate(tokens)]
