"""``ConstraintState``: one sequence's position in its grammar.

It follows the decoder: masks for the current position, forced tokens,
consuming drafted or sampled tokens, and rolling back to the accepted prefix
after verification.  Not thread-safe (one sequence, one thread at a time).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, AbstractSet, List, Optional, Protocol, Sequence

import numpy as np

from ..errors import ConstraintError
from . import bitmask
from .grammar import Grammar

if TYPE_CHECKING:
    import llguidance

__all__ = ["ConstraintState"]


class GrammarVocabulary(Protocol):
    """What a state reads of the grammar it was compiled from (a ``CompiledGrammar``)."""

    grammar: Grammar

    @property
    def n_vocab(self) -> int: ...

    @property
    def eos_ids(self) -> tuple[int, ...]: ...

    @property
    def eos_set(self) -> AbstractSet[int]: ...


class ConstraintState:
    """A grammar matcher over one sequence's generated tokens.

    Made by :meth:`CompiledGrammar.new_state`.  Token ids are the
    tokenizer's (the target model's) ids.  End of generation: every id in
    ``eos_ids`` is allowed exactly where the grammar accepts
    (:attr:`accepting`); consuming one there ends the constraint
    (:attr:`ended`), after which nothing more can be consumed.
    """

    def __init__(self, matcher: "llguidance.LLMatcher", compiled: GrammarVocabulary) -> None:
        self._m = matcher
        self._compiled = compiled
        self._n = 0
        # llguidance quirk: where the grammar cannot be extended (stopped,
        # "NoExtension") its mask allows EOS, but try_consume_tokens refuses
        # EOS and consume_token takes it without recording it (a rollback
        # then undoes the token before).  That EOS is tracked here instead.
        self._eos_after_stop = False

    # -- what the state is -----------------------------------------------

    @property
    def n_vocab(self) -> int:
        return self._compiled.n_vocab

    @property
    def eos_ids(self) -> "tuple[int, ...]":
        return self._compiled.eos_ids

    @property
    def n_consumed(self) -> int:
        """Tokens consumed so far (an ending EOS included); ``rollback`` may
        go back at most this many."""
        return self._n

    @property
    def accepting(self) -> bool:
        """The output so far is complete: EOS is allowed here."""
        return bool(self._m.is_accepting())

    @property
    def finished(self) -> bool:
        """Nothing but EOS can follow (the grammar cannot be extended), or
        EOS was consumed: a decoder should end the sequence here (emitting
        EOS is optional)."""
        return self._eos_after_stop or bool(self._m.is_stopped())

    @property
    def ended(self) -> bool:
        """An EOS token was consumed."""
        return self._eos_after_stop or self._m.stop_reason() == "EndOfSentence"

    @property
    def error(self) -> Optional[str]:
        """llguidance's message if the matcher failed (it then stays failed), else None."""
        if not self._m.is_error():
            return None
        return self._m.get_error() or "unknown error"

    # -- decoding --------------------------------------------------------

    def fill_mask(self, row: np.ndarray) -> None:
        """Write the allowed tokens of the next position into ``row``: one
        1-D C-contiguous int32/uint32 array of ``ceil(n_vocab/32)`` words,
        layout in :mod:`.bitmask`.  Does not advance the state.  Where the
        grammar forces text, the row holds the one token llguidance's
        tokenizer gives for it (the first of :meth:`forced_tokens`).  Once
        :attr:`ended`, the row still allows the EOS ids (never an empty row)."""
        bitmask.check_row(row, self.n_vocab)
        self._check()
        self._m.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        self._check()
        # An end-of-generation id that llguidance reads as text (one a GGUF stores as a normal
        # token rather than a control token, as some FIM tokens are) is allowed by its mask wherever
        # that text fits, inside a JSON string for one, though its matcher refuses it there and
        # emitting it ends the output.  EOS ids are allowed exactly where the grammar accepts, so
        # that mask and consume agree.
        bitmask.set_ids(row, self._compiled.eos_ids, self.accepting or self.finished)

    def mask(self) -> np.ndarray:
        """A new int32 row for the next position (see :meth:`fill_mask`)."""
        row = bitmask.allocate(1, self.n_vocab)[0]
        self.fill_mask(row)
        return row

    def fill_masks(self, tokens: Sequence[int], out: np.ndarray) -> int:
        """Masks along a draft: row 0 for the next position, row ``i`` for
        the position after ``tokens[:i]``; stops after the first token the
        grammar rejects (or an EOS).  Returns how many tokens were valid
        (``k``; rows ``0..k`` are written).  The state is left where it was.
        ``out`` is a C-contiguous ``(>= len(tokens) + 1, n_words)`` array."""
        if out.ndim != 2 or out.shape[0] < len(tokens) + 1:
            raise ValueError(f"out needs at least {len(tokens) + 1} rows, got shape {out.shape}")
        self.fill_mask(out[0])
        k = 0
        for t in tokens:
            if self.consume((t,)) != 1:
                break
            k += 1
            if self.ended:
                break
            self.fill_mask(out[k])
        self.rollback(k)
        return k

    def forced_tokens(self, max_n: Optional[int] = None) -> List[int]:
        """The tokens the grammar forces from here (fast-forward tokens: the
        one continuation allowed, as llguidance's tokenizer splits it), at
        most ``max_n``.  Does not advance the state: consume them to."""
        if max_n is not None and max_n <= 0:
            return []
        self._check()
        ff = list(self._m.compute_ff_tokens())
        self._check()
        return ff if max_n is None else ff[:max_n]

    def consume(self, tokens: Sequence[int]) -> int:
        """Advance over the longest valid prefix of ``tokens``; returns its
        length.  The state moves over exactly those tokens (a rejected token
        leaves it valid, where it was before that token).

        Valid means the matcher accepts the token's bytes; that is every
        token the mask allows, and at forced positions also other spellings
        of the forced text (the mask narrows those to one token)."""
        toks = [int(t) for t in tokens]
        for t in toks:
            if not 0 <= t < self.n_vocab:
                raise ValueError(f"token id {t} out of range [0, {self.n_vocab})")
        if not toks:
            return 0
        self._check()
        if self._eos_after_stop:
            return 0
        n = int(self._m.try_consume_tokens(toks))
        if (n < len(toks) and toks[n] in self._compiled.eos_set
                and self._m.stop_reason() in ("NoExtension", "NoExtensionBias")):
            self._eos_after_stop = True
            n += 1
        self._n += n
        self._check()
        return n

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` consumed tokens (``0 <= n <= n_consumed``),
        e.g. the drafts verification rejected."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"n must be an int, got {n!r}")
        if not 0 <= n <= self._n:
            raise ValueError(f"cannot roll back {n} tokens: {self._n} consumed")
        n = int(n)
        self._n -= n
        if n and self._eos_after_stop:
            self._eos_after_stop = False
            n -= 1
        if n:
            # Past its history llguidance would enter a permanent error state; checked above.
            self._m.rollback(n)
            self._check()

    def keep(self, n_keep: int) -> None:
        """Roll back to the first ``n_keep`` consumed tokens."""
        self.rollback(self._n - n_keep)

    def copy(self) -> "ConstraintState":
        """An independent copy (same position)."""
        other = ConstraintState(self._m.deep_copy(), self._compiled)
        other._n = self._n
        other._eos_after_stop = self._eos_after_stop
        return other

    def _check(self) -> None:
        if self._m.is_error():
            raise ConstraintError(f"the {self._compiled.grammar.what} matcher failed: "
                                  f"{self._m.get_error().split(chr(10) + '<state>', 1)[0]}")

    def __repr__(self) -> str:
        return (f"ConstraintState({self._compiled.grammar.what}, consumed={self._n}, "
                f"accepting={self.accepting}, finished={self.finished})")
