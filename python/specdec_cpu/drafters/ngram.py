"""Prompt-lookup drafting: propose what followed the last occurrence of the
current suffix in the text so far.

A proposal is deterministic, so it is verified as q = one-hot at each
proposed token (``Draft.probs is None``): accept with probability p(x),
otherwise sample from p with x removed and renormalised (DESIGN §2).  That is
exact at every temperature, not only for greedy decoding.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

import numpy as np

from ..params import SamplingParams
from ..sampling import Rng
from .base import Draft

__all__ = ["NgramDrafter", "NgramIndex"]


class NgramIndex:
    """Every n-gram (``min_ngram <= n <= max_ngram``) of a growing token
    sequence, mapped to the positions that followed it.

    For each key ``tuple(tokens[i - n:i])`` the index keeps the stack of the
    continuation positions ``i`` (``n <= i < len(tokens)``) in increasing
    order, so the most recent earlier occurrence is the top of the stack and
    cutting the sequence back pops exactly the entries of the removed
    positions.  The n-gram ending at the very end of the sequence (the
    current suffix itself) has no continuation yet and is not indexed, so a
    lookup of the suffix only ever finds earlier occurrences.

    ``extend`` costs O(max_ngram − min_ngram + 1) per new token and
    ``truncate`` the same per removed token; nothing rescans the history.
    """

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1) -> None:
        _check_orders(max_ngram, min_ngram)
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.tokens: list[int] = []
        self._pos: dict[tuple[int, ...], list[int]] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` and index the n-grams they complete."""
        toks = self.tokens
        pos = self._pos
        lo, hi = self.min_ngram, self.max_ngram
        for t in tokens:
            i = len(toks)  # t sits at position i: it continues every n-gram ending at i
            for n in range(lo, min(hi, i) + 1):
                key = tuple(toks[i - n:i])
                stack = pos.get(key)
                if stack is None:
                    pos[key] = [i]
                else:
                    stack.append(i)
            toks.append(int(t))

    def truncate(self, n_keep: int) -> None:
        """Forget every position ``>= n_keep`` (the index then equals one
        built from ``tokens[:n_keep]``)."""
        toks = self.tokens
        if n_keep < 0:
            raise ValueError(f"n_keep must be >= 0, got {n_keep}")
        if n_keep >= len(toks):
            return
        if n_keep == 0 or len(toks) - n_keep > n_keep:
            # Cutting most of it: rebuilding the kept part is cheaper.
            kept = toks[:n_keep]
            self.clear()
            self.extend(kept)
            return
        pos = self._pos
        lo, hi = self.min_ngram, self.max_ngram
        for i in range(len(toks) - 1, n_keep - 1, -1):
            for n in range(lo, min(hi, i) + 1):
                key = tuple(toks[i - n:i])
                stack = pos[key]
                stack.pop()
                if not stack:
                    del pos[key]
        del toks[n_keep:]

    def clear(self) -> None:
        """Empty the index."""
        self.tokens = []
        self._pos = {}

    def common_prefix(self, seq: Sequence[int]) -> int:
        """Length of the common prefix of the indexed tokens and ``seq``."""
        n = min(len(self.tokens), len(seq))
        if n == 0:
            return 0
        a = np.asarray(self.tokens[:n], dtype=np.int64)
        b = np.asarray(seq[:n], dtype=np.int64)
        diff = np.flatnonzero(a != b)
        return int(diff[0]) if diff.size else n

    def align(self, seq: Sequence[int]) -> None:
        """Make the index hold exactly ``seq``, keeping the common prefix."""
        self.truncate(self.common_prefix(seq))
        if len(seq) > len(self.tokens):
            self.extend(seq[len(self.tokens):])

    def find(self) -> Optional[tuple[int, int]]:
        """The longest n-gram suffix of the indexed tokens that occurred
        earlier, as ``(n, i)``: ``i`` is the position that followed its most
        recent earlier occurrence.  ``None`` when no suffix of length
        ``min_ngram`` or more occurred before."""
        toks = self.tokens
        size = len(toks)
        pos = self._pos
        for n in range(min(self.max_ngram, size - 1), self.min_ngram - 1, -1):
            stack = pos.get(tuple(toks[size - n:]))
            if stack:
                return n, stack[-1]
        return None

    def positions(self, key: Sequence[int]) -> list[int]:
        """Continuation positions of ``key``, oldest first (a copy)."""
        return list(self._pos.get(tuple(key), ()))


class NgramDrafter:
    """Drafts by prompt lookup: the tokens that followed the most recent
    earlier occurrence of the longest matching suffix n-gram.

    Args:
        max_ngram: longest suffix tried (tried first).
        min_ngram: shortest suffix accepted as a match.
        max_draft: most tokens proposed in one step (besides ``gamma``).

    A proposal is ``tokens[i : i + min(gamma, max_draft)]`` of the sequence,
    cut at its end, where ``i`` follows the match: possibly fewer than
    ``gamma`` tokens, and none at all when nothing matches (the decoder then
    takes a plain step).  The index is updated incrementally with the tokens
    appended since the last call; the decoder keeps it a prefix of the
    sequence through ``begin`` and ``rollback``.
    """

    name = "ngram"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, max_draft: int = 16) -> None:
        _check_orders(max_ngram, min_ngram)
        if isinstance(max_draft, bool) or not isinstance(max_draft, int) or max_draft < 1:
            raise ValueError(f"max_draft must be an int >= 1, got {max_draft!r}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.max_draft = max_draft
        self.index = NgramIndex(max_ngram, min_ngram)
        self._found: Optional[tuple[int, Optional[tuple[int, int]]]] = None  # (length, find())

    def begin(self, seq: Sequence[int]) -> None:
        """Index ``seq``, reusing what is already indexed of it."""
        self._found = None
        self.index.align(seq)

    def match(self, seq: Sequence[int]) -> Optional[tuple[int, int]]:
        """``(n, i)`` of the longest suffix match of ``seq`` (see
        :meth:`NgramIndex.find`), or ``None``."""
        self._sync(seq)
        found = self._found
        if found is None or found[0] != len(seq):
            found = (len(seq), self.index.find())
            self._found = found
        return found[1]

    def available(self, seq: Sequence[int]) -> int:
        """How many tokens a proposal after ``seq`` could hold (0: no match)."""
        m = self.match(seq)
        return 0 if m is None else min(len(seq) - m[1], self.max_draft)

    def routes(self, seq: Sequence[int]) -> tuple[str, ...]:
        """The proposals available after ``seq``: ``("ngram",)`` or none."""
        return (self.name,) if self.match(seq) is not None else ()

    def propose(self, seq: Sequence[int], gamma: int, params: SamplingParams, rng: Rng) -> Draft:
        """Up to ``min(gamma, max_draft)`` tokens after ``seq`` (maybe none).

        ``params`` and ``rng`` are unused: the proposal is deterministic.
        """
        start = time.perf_counter()
        m = self.match(seq)
        if m is None or gamma <= 0:
            tokens = np.zeros(0, dtype=np.int32)
        else:
            i = m[1]
            want = min(int(gamma), self.max_draft)
            tokens = np.asarray(self.index.tokens[i:i + want], dtype=np.int32)
        return Draft(tokens, None, time.perf_counter() - start, self.name)

    def rollback(self, n_valid: int) -> None:
        """Forget positions ``>= n_valid`` (a no-op when the index holds less)."""
        if n_valid < len(self.index):
            self._found = None
            self.index.truncate(n_valid)

    def reset(self) -> None:
        self._found = None
        self.index.clear()

    def _sync(self, seq: Sequence[int]) -> None:
        """Bring the index up to ``seq``.

        The index is normally a prefix of ``seq`` (the decoder keeps it so):
        then only the new tokens are indexed.  A cheap check of the last
        indexed token catches a caller that changed the sequence without
        ``begin``/``rollback``; the index then realigns.
        """
        idx = self.index
        k = len(idx)
        if k > len(seq) or (k and idx.tokens[-1] != seq[k - 1]):
            self._found = None
            idx.align(seq)
        elif k < len(seq):
            self._found = None
            idx.extend(seq[k:])


def _check_orders(max_ngram: int, min_ngram: int) -> None:
    for name, v in (("min_ngram", min_ngram), ("max_ngram", max_ngram)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if min_ngram > max_ngram:
        raise ValueError(f"min_ngram ({min_ngram}) must be <= max_ngram ({max_ngram})")
