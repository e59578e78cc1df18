"""Prompt-lookup drafting: propose what followed the last occurrence of the
current suffix in the text so far.

A proposal is deterministic, so it is verified as q = one-hot at each
proposed token (``Draft.probs is None``): accept with probability p(x),
otherwise sample from p with x removed and renormalised (docs/math.md §5).  That is
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
    ``position`` is where the proposal is copied from, in the text the
    lookup searched (see :class:`NgramDrafter`: the reference, then the
    sequence), and ``token`` is the token found there, the first one
    proposed.  ``unanimous`` is False when another compared occurrence
    matches as far back but was followed by a different token: the text
    does not say which to copy.
    """

    length: int
    position: int
    unanimous: bool
    token: int


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

    Negative tokens are separators between texts: no n-gram reaching over
    one is indexed, none is indexed as a continuation and no match extends
    across one.

    ``extend`` costs O(max_ngram − min_ngram + 1) per new token and
    ``truncate`` the same per removed token; nothing rescans the history.
    """

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1) -> None:
        _check_orders(max_ngram, min_ngram)
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.tokens: list[int] = []
        self._pos: dict[tuple[int, ...], list[int]] = {}
        self._separators: list[int] = []  # their positions, increasing

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` and index the n-grams they complete."""
        toks = self.tokens
        pos = self._pos
        seps = self._separators
        lo, hi = self.min_ngram, self.max_ngram
        for t in tokens:
            t = int(t)
            i = len(toks)  # t sits at position i: it continues every n-gram ending at i
            if t < 0:
                seps.append(i)
            else:
                room = i - 1 - seps[-1] if seps else i  # tokens since the last separator
                for n in range(lo, min(hi, room) + 1):
                    key = tuple(toks[i - n:i])
                    stack = pos.get(key)
                    if stack is None:
                        pos[key] = [i]
                    else:
                        stack.append(i)
            toks.append(t)

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
        seps = self._separators
        lo, hi = self.min_ngram, self.max_ngram
        for i in range(len(toks) - 1, n_keep - 1, -1):
            if toks[i] < 0:
                seps.pop()  # the last one: those after it went first
                continue
            room = i - 1 - seps[-1] if seps else i
            for n in range(lo, min(hi, room) + 1):
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
        self._separators = []

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

    def find(self, candidates: int = 1, max_match: int = 0, prefer_before: int = 0) -> Optional[Match]:
        """The best earlier occurrence of a suffix of the indexed tokens.

        The longest suffix n-gram (``max_ngram`` down to ``min_ngram``) with
        an earlier occurrence is the key.  Among its ``candidates`` most
        recent occurrences, the one whose match extends furthest back (up to
        ``max_match`` tokens; 0: no extension) wins, the most recent on a
        tie: a longer shared context predicts the continuation better.  With
        ``prefer_before``, an occurrence before that position wins a tie
        against one after it.
        ``None`` when no suffix of length ``min_ngram`` or more occurred before.
        """
        toks = self.tokens
        size = len(toks)
        pos = self._pos
        for n in range(min(self.max_ngram, size - 1), self.min_ngram - 1, -1):
            stack = pos.get(tuple(toks[size - n:]))
            if not stack:
                continue
            found = []
            for i in stack[:-1 - max(candidates, 1):-1]:  # most recent first
                length = n
                limit = min(max_match, i)
                while length < limit and toks[i - 1 - length] == toks[size - 1 - length] >= 0:
                    length += 1
                found.append((length, i < prefer_before, i))
            best_len = max(f[0] for f in found)
            tied = [f for f in found if f[0] == best_len]
            best_i = max(tied, key=lambda f: f[1])[2]  # the first of the maxima: the most recent
            unanimous = all(toks[i] == toks[best_i] for _, _, i in tied)
            return Match(best_len, best_i, unanimous, toks[best_i])
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
        unwrap_lines: also look up the prompt's hard-wrapped lines, joined
            (the decoder passes them to :meth:`set_reference` at the start
            of each generation; see :mod:`.unwrap`).

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

    The text searched is a *reference* (texts the sequence may copy from
    that are not part of it, each closed by a separator no token equals)
    followed by the sequence itself.  Without a reference (the default)
    positions are positions in the sequence.  When an occurrence in the
    reference and one in the sequence match equally far back, the text the
    generation followed where the two last disagreed wins (at first the
    sequence): a model that joins the lines of a quote once will join them
    again, one that keeps them keeps them.
    """

    name = "ngram"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, max_draft: int = 24,
                 candidates: int = 8, max_match: int = 64, unwrap_lines: bool = True) -> None:
        _check_orders(max_ngram, min_ngram)
        for arg, v, lo, bound in (("max_draft", max_draft, 1, "1"), ("candidates", candidates, 1, "1"),
                                  ("max_match", max_match, max_ngram, f"max_ngram ({max_ngram})")):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{arg} must be an int >= {bound}, got {v!r}")
        if not isinstance(unwrap_lines, bool):
            raise ValueError(f"unwrap_lines must be a bool, got {unwrap_lines!r}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.max_draft = max_draft
        self.candidates = candidates
        self.max_match = max_match
        self.unwrap_lines = unwrap_lines
        self.index = NgramIndex(max_ngram, min_ngram)
        self._reference: list[int] = []  # the texts, each followed by _SEPARATOR
        # Which text wins a tie between the two: the one the generation
        # followed where they last disagreed (at first the sequence), and
        # the last match that had a tie: (len(seq), its position, the other's).
        self._prefer_reference = False
        self._contest: Optional[tuple[int, int, int]] = None
        self._found: Optional[tuple[int, Optional[Match]]] = None  # (len(seq), find())

    @property
    def reference(self) -> list[list[int]]:
        """The texts looked up besides the sequence (a copy)."""
        texts, start = [], 0
        for i, t in enumerate(self._reference):
            if t == _SEPARATOR:
                texts.append(self._reference[start:i])
                start = i + 1
        return texts

    def set_reference(self, texts: Sequence[Sequence[int]]) -> None:
        """Look up ``texts`` (token sequences) as well as the sequence, from
        the next :meth:`begin` on; ``[]`` looks up the sequence alone.

        They are indexed once; the index keeps them while the reference is
        unchanged, so setting the same reference for each generation of a
        conversation costs a comparison.
        """
        reference: list[int] = []
        for text in texts:
            reference.extend(int(t) for t in text)
            reference.append(_SEPARATOR)
        if any(t < 0 for t in reference if t != _SEPARATOR):
            raise ValueError("reference token ids must be >= 0")
        if reference != self._reference:
            # Keep what the index shares with the new reference; the sequence
            # is indexed again behind it at the next call.
            self.index.truncate(self.index.common_prefix(reference))
            self._reference = reference
            self._found, self._contest = None, None

    def begin(self, seq: Sequence[int]) -> None:
        """Index the reference and ``seq``, reusing what is already indexed."""
        self._found = None
        self._prefer_reference, self._contest = False, None
        self.index.align(self._reference + list(seq))

    def match(self, seq: Sequence[int]) -> Optional[Match]:
        """The match after ``seq`` (see :meth:`NgramIndex.find`), or ``None``."""
        self._sync(seq)
        found = self._found
        if found is None or found[0] != len(seq):
            found = (len(seq), self._find(seq))
            self._found = found
        return found[1]

    def _find(self, seq: Sequence[int]) -> Optional[Match]:
        """The index's match, ties between the reference and the sequence
        going to the text the generation has been following."""
        base = len(self._reference)
        if not base:
            return self.index.find(self.candidates, self.max_match)
        self._settle_contest(seq)
        prefer = self._prefer_reference
        m = self.index.find(self.candidates, self.max_match, base if prefer else 0)
        if m is not None:
            other = self.index.find(self.candidates, self.max_match, 0 if prefer else base)
            assert other is not None  # the same occurrences as m's, only ties broken the other way
            if other.length == m.length and (other.position < base) != (m.position < base):
                self._contest = (len(seq), m.position, other.position)
        return m

    def _settle_contest(self, seq: Sequence[int]) -> None:
        """Where the last match could have come from either text, see which
        one the tokens emitted since follow where the two disagree."""
        if self._contest is None:
            return
        start, chosen, other = self._contest
        self._contest = None
        toks = self.index.tokens
        for j, t in enumerate(seq[start:]):
            a, b = toks[chosen + j], toks[other + j]
            if a == b:
                if t != a:
                    return  # neither text said this
                continue
            if t == b:
                self._prefer_reference = other < len(self._reference)
            return

    def propose(self, seq: Sequence[int], gamma: int, params: SamplingParams, rng: Rng) -> Draft:
        """``min(gamma, max_draft)`` tokens after ``seq``, none without a match.

        A match in the reference proposes at most what follows it there.
        ``params`` and ``rng`` are unused: the proposal is deterministic.
        """
        start = time.perf_counter()
        m = self.match(seq)
        if m is None or gamma <= 0:
            tokens = np.zeros(0, dtype=np.int32)
        else:
            i = m.position
            want = min(int(gamma), self.max_draft)
            if i < len(self._reference):
                following = self._reference[i:i + want]
                if _SEPARATOR in following:
                    following = following[:following.index(_SEPARATOR)]
                tokens = np.asarray(following, dtype=np.int32)
            else:
                period = np.asarray(self.index.tokens[i:i + self.max_draft], dtype=np.int32)
                tokens = period[np.arange(want) % period.shape[0]]
        return Draft(tokens, None, time.perf_counter() - start, self.name)

    def rollback(self, n_valid: int) -> None:
        """Forget positions ``>= n_valid`` of the sequence (a no-op when the
        index holds less)."""
        n_keep = len(self._reference) + n_valid
        if n_keep < len(self.index):
            self._found = None
            self.index.truncate(n_keep)

    def reset(self) -> None:
        """Forget the sequence and the reference."""
        self._found, self._contest, self._prefer_reference = None, None, False
        self._reference = []
        self.index.clear()

    def _sync(self, seq: Sequence[int]) -> None:
        """Bring the index up to the reference followed by ``seq``.

        The index normally holds the reference and a prefix of ``seq`` (the
        decoder keeps it so): then only the new tokens are indexed.  A cheap
        check of the last indexed token catches a caller that changed the
        sequence without ``begin``/``rollback``; the index then realigns.
        """
        idx = self.index
        base = len(self._reference)
        k = len(idx) - base  # tokens of seq indexed
        if k < 0 or k > len(seq) or (k and idx.tokens[-1] != seq[k - 1]):
            self._found = None
            idx.align(self._reference + list(seq))
        elif k < len(seq):
            self._found = None
            idx.extend(seq[k:])


_SEPARATOR = -1  # closes each reference text: equal to no token, so no match runs across it


def _check_orders(max_ngram: int, min_ngram: int) -> None:
    for name, v in (("min_ngram", min_ngram), ("max_ngram", max_ngram)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if min_ngram > max_ngram:
        raise ValueError(f"min_ngram ({min_ngram}) must be <= max_ngram ({max_ngram})")
