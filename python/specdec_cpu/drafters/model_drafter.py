"""A small language model as the drafter."""

from __future__ import annotations

import time
from typing import Optional, Sequence

import numpy as np

from .. import sampling
from ..cache import CachedSequence
from ..model import CausalLM
from ..params import SamplingParams
from .base import Draft
from .vocab_map import DraftVocab


class ModelDrafter:
    """Samples γ tokens from a draft model, keeping each q row.

    q rows live in one preallocated ``(γ_max, V_target)`` buffer, laid out
    over the target's ids by a :class:`DraftVocab` (a draft with fewer or
    more rows than the target, or one cut to part of the vocabulary:
    ``source_ids``, see engine/vocab_cut.py).
    """

    name = "model"

    def __init__(self, model: CausalLM, n_vocab_target: int, gamma_max: int,
                 source_ids: Optional[np.ndarray] = None) -> None:
        self.cache = CachedSequence(model)
        self.n_vocab = n_vocab_target
        self._q = np.zeros((max(gamma_max, 1), n_vocab_target), dtype=np.float32)
        self._tokens = np.zeros(max(gamma_max, 1), dtype=np.int32)
        self.vocab = DraftVocab(model.n_vocab, n_vocab_target, source_ids)

    def ensure_capacity(self, gamma: int) -> None:
        """Grow the q buffer if a larger γ is requested."""
        if gamma > self._q.shape[0]:
            self._q = np.zeros((gamma, self.n_vocab), dtype=np.float32)
            self._tokens = np.zeros(gamma, dtype=np.int32)

    def begin(self, seq: Sequence[int]) -> None:
        """Reuse the cached prefix ``seq`` shares with the last conversation."""
        self.cache.align(seq)

    def propose(self, seq: Sequence[int], gamma: int, params: SamplingParams, rng: sampling.Rng) -> Draft:
        """Sample ``gamma`` tokens after ``seq`` from the draft model."""
        start = time.perf_counter()
        self.ensure_capacity(gamma)
        logits = self.cache.sync_and_eval(seq, 1)
        for i in range(gamma):
            tok = self.vocab.sample_into(logits[0], params, rng, self._q[i])
            self._tokens[i] = tok
            if i + 1 < gamma:  # the last draft token is never fed: the target scores it
                logits = self.cache.eval((tok,), 1)
        return Draft(self._tokens[:gamma], self._q[:gamma], time.perf_counter() - start, self.name)

    def rollback(self, n_valid: int) -> None:
        """Drop rejected draft tokens from the cache."""
        self.cache.keep(n_valid)

    def reset(self) -> None:
        self.cache.reset()
