"""Penalties, biases and ``min_tokens`` as sparse row changes (docs/math.md §12).

A penalty at a position depends on the tokens before it.  In a speculative
step the target's row i and the draft's row i both continue the output
followed by the first i draft tokens, so both get the changes of that
prefix: then p and q are the distributions of the same (penalised) process
and the verify stays exact.

:class:`Penalties` holds one sequence's counts (its output tokens, and the
recent window of prompt and output for ``repeat_penalty``) and builds the
``sampling.Changes.sparse`` rows for any prefix of a draft: per row, each
affected id once, with ``scale_pos``/``scale_neg`` (repeat penalty) and
``add`` (presence, frequency, bias, and −inf for a ban).

A grammar's end outranks ``min_tokens`` (and ``ignore_eos``): at a
position where its mask allows nothing but end ids, the output is a
complete document and only an end may follow, so the ends stay allowed
there.  The rule is a function of the prefix, the same for p and q.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Deque, Iterable, List, Optional, Sequence

import numpy as np

from ..constraints import bitmask
from ..params import SamplingParams

__all__ = ["Penalties"]


class Penalties:
    """The sparse changes of one sequence's rows.

    ``prompt`` seeds the repeat-penalty window; ``end_ids`` are the ids
    ``min_tokens`` bans (the end-of-generation ids and ``stop_token_ids``).
    """

    def __init__(self, params: SamplingParams, prompt: Sequence[int], end_ids: Iterable[int]) -> None:
        self.params = params
        self.output: Counter = Counter()  # occurrences in the output so far
        self.n_output = 0
        last_n = params.repeat_last_n
        self._repeat = params.repeat_penalty != 1.0 and last_n != 0
        self.window: Deque[int] = deque(prompt[-last_n:] if last_n > 0 else prompt,
                                        maxlen=last_n if last_n > 0 else None)
        self._bias = dict(params.logit_bias or ())
        self._end_ids = sorted(set(int(t) for t in end_ids) | set(params.stop_token_ids))
        self._end_bits: Optional[np.ndarray] = None  # _end_ids as a mask row, once a grammar's rows come

    def append(self, tokens: Iterable[int]) -> None:
        """The sequence emitted ``tokens``."""
        for t in tokens:
            self.output[t] += 1
            self.n_output += 1
            if self._repeat:
                self.window.append(t)

    def rows(self, draft: Sequence[int] | np.ndarray, k: int, first: int = 0,
             masks: Optional[np.ndarray] = None) -> tuple:
        """The sparse changes of rows ``first .. first + k - 1``, row j
        continuing the output followed by ``draft[:j]`` (as
        ``sampling.Changes.sparse``); ``masks`` (a grammar's rows of the
        same positions, if any) say where only an end may follow."""
        draft = [int(t) for t in draft[:first + k - 1]]
        ended = [False] * k
        if masks is not None and self.n_output + first < self.params.min_tokens:  # some row is below min_tokens
            if self._end_bits is None:
                self._end_bits = bitmask.from_ids(self._end_ids, masks.shape[1] * 32, np.uint32)
            ended = [bitmask.allows_only(masks[j], self._end_bits) for j in range(k)]
        out: List[tuple] = [self._row(draft[:j], ended[j - first]) for j in range(first, first + k)]
        offsets = np.zeros(k + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(r[0]) for r in out])
        if not out or offsets[-1] == 0:
            empty_f = np.zeros(0, dtype=np.float32)
            return offsets, np.zeros(0, dtype=np.int32), empty_f, empty_f, empty_f
        cat = [np.concatenate([r[i] for r in out]) for i in range(4)]
        return (offsets, cat[0].astype(np.int32), cat[1].astype(np.float32), cat[2].astype(np.float32),
                cat[3].astype(np.float32))

    def _row(self, extra: List[int], ended: bool = False) -> tuple:
        p = self.params
        counts = self.output
        if extra:
            counts = counts.copy()
            counts.update(extra)
        add = dict(self._bias)
        if p.presence_penalty or p.frequency_penalty:
            for t, c in counts.items():
                add[t] = add.get(t, 0.0) - p.presence_penalty - p.frequency_penalty * c
        if self.n_output + len(extra) < p.min_tokens and not ended:
            for t in self._end_ids:
                add[t] = -np.inf
        repeated: Optional[set] = None
        if self._repeat:
            window = list(self.window) + list(extra)
            if p.repeat_last_n > 0:
                window = window[-p.repeat_last_n:]
            repeated = set(window)
        ids = sorted(set(add) | (repeated or set()))
        n = len(ids)
        pos, neg = np.ones(n), np.ones(n)
        if repeated:
            hit = np.fromiter((t in repeated for t in ids), dtype=bool, count=n)
            pos[hit], neg[hit] = 1.0 / p.repeat_penalty, p.repeat_penalty
        adds = np.fromiter((add.get(t, 0.0) for t in ids), dtype=np.float64, count=n)
        return np.asarray(ids, dtype=np.int64), pos, neg, adds
