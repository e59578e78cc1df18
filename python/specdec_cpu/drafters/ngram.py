"""Prompt-lookup drafting: propose what followed the last occurrence of the
current suffix in the text so far.

A proposal is deterministic, so it is verified as q = one-hot at each
proposed token (``Draft.probs is None``): accept with probability p(x),
otherwise sample from p with x removed and renormalised (DESIGN §2).  That is
exact at every temperature, not only for greedy decoding.
"""

from __future__ import annotations

import time
from typing import NamedTuple, Optional, Sequence

import numpy as np

from ..params import SamplingParams
from ..sampling import Rng
from .base import Draft

__all__ = ["Match", "NgramDrafter", "NgramIndex"]


class Match(NamedTuple):
    """Where the current suffix occurred before.

    ``length`` tokens before ``position`` equal the last ``length`` tokens;
    ``position`` is where the proposal is copied from.  ``unanimous`` is
    False when another compared occurrence matches as far back but was
    followed by a different token: the text does not say which to copy.
    """

    length: int
    position: int
    unanimous: bool


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

    def find(self, candidates: int = 1, max_match: int = 0) -> Optional[Match]:
        """The best earlier occurrence of a suffix of the indexed tokens.

        The longest suffix n-gram (``max_ngram`` down to ``min_ngram``) with
        an earlier occurrence is the key.  Among its ``candidates`` most
        recent occurrences, the one whose match extends furthest back (up to
        ``max_match`` tokens; 0: no extension) wins, the most recent on a
        tie: a longer shared context predicts the continuation better.
        ``None`` when no suffix of length ``min_ngram`` or more occurred before.
        """
        toks = self.tokens
        size = len(toks)
        pos = self._pos
        for n in range(min(self.max_ngram, size - 1), self.min_ngram - 1, -1):
            stack = pos.get(tuple(toks[size - n:]))
            if not stack:
                continue
            best_len, best_i, unanimous = -1, -1, True
            for i in stack[:-1 - max(candidates, 1):-1]:  # most recent first
                length = n
                limit = min(max_match, i)
                while length < limit and toks[i - 1 - length] == toks[size - 1 - length]:
                    length += 1
                if length > best_len:
                    best_len, best_i, unanimous = length, i, True
                elif length == best_len and toks[i] != toks[best_i]:
                    unanimous = False
            return Match(best_len, best_i, unanimous)
        return None

    def positions(self, key: Sequence[int]) -> list[int]:
        """Continuation positions of ``key``, oldest first (a copy)."""
        return list(self._pos.get(tuple(key), ()))


class NgramDrafter:
    """Drafts by prompt lookup: the tokens that followed an earlier occurrence
    of the current suffix.

    Args:
        max_ngram: longest suffix n-gram tried as a key (tried first).
        min_ngram: shortest suffix accepted as a match.
        max_draft: most tokens proposed in one step (besides ``gamma``).
        candidates: recent occurrences of the key compared; the one sharing
            the longest context with the suffix wins (see
            :meth:`NgramIndex.find`).
        max_match: how far back a match is followed (>= ``max_ngram``).

    The :class:`Match` tells the γ controller how far to trust the proposal:
    a suffix that repeats 40 earlier tokens is being copied, one that
    repeats a single token may be a coincidence, and one whose occurrences
    were followed by different tokens is a guess.

    A proposal is ``min(gamma, max_draft)`` tokens: what followed the match.
    Where the continuation reaches the end of the sequence (the match lies
    ``d`` tokens back and the text repeats with period ``d``) it continues
    the period, as copying the continuation into itself would.  No match, no
    proposal (the decoder then takes a plain step).  The index is updated
    incrementally with the tokens appended since the last call; the decoder
    keeps it a prefix of the sequence through ``begin`` and ``rollback``.
    """

    name = "ngram"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, max_draft: int = 24,
                 candidates: int = 8, max_match: int = 64) -> None:
        _check_orders(max_ngram, min_ngram)
        for arg, v, lo in (("max_draft", max_draft, 1), ("candidates", candidates, 1),
                           ("max_match", max_match, max_ngram)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{arg} must be an int >= {lo}, got {v!r}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.max_draft = max_draft
        self.candidates = candidates
        self.max_match = max_match
        self.index = NgramIndex(max_ngram, min_ngram)
        self._found: Optional[tuple[int, Optional[Match]]] = None  # (len(seq), find())

    def begin(self, seq: Sequence[int]) -> None:
        """Index ``seq``, reusing what is already indexed of it."""
        self._found = None
        self.index.align(seq)

    def match(self, seq: Sequence[int]) -> Optional[Match]:
        """The match after ``seq`` (see :meth:`NgramIndex.find`), or ``None``."""
        self._sync(seq)
        found = self._found
        if found is None or found[0] != len(seq):
            found = (len(seq), self.index.find(self.candidates, self.max_match))
            self._found = found
        return found[1]

    def routes(self, seq: Sequence[int]) -> tuple[str, ...]:
        """The proposals available after ``seq``: ``("ngram",)`` or none."""
        return (self.name,) if self.match(seq) is not None else ()

    def propose(self, seq: Sequence[int], gamma: int, params: SamplingParams, rng: Rng) -> Draft:
        """``min(gamma, max_draft)`` tokens after ``seq``, none without a match.

        ``params`` and ``rng`` are unused: the proposal is deterministic.
        """
        start = time.perf_counter()
        m = self.match(seq)
        if m is None or gamma <= 0:
            tokens = np.zeros(0, dtype=np.int32)
        else:
            i = m.position
            period = np.asarray(self.index.tokens[i:i + self.max_draft], dtype=np.int32)
            want = min(int(gamma), self.max_draft)
            tokens = period[np.arange(want) % period.shape[0]]
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
