"""A one-sequence model (``CausalLM``) seen as a ``SequenceLM`` of one slot.

The step core drives every model through ``SequenceLM``; this adapter lets
``SpeculativeDecoder`` run the same core over a plain llama.cpp context or a
synthetic test model.  It keeps the mirror of the tokens the model holds,
changed only after a model call returned, so an interrupted call is undone
(``resync``) and the mirror stays exact.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

from .protocols import CausalLM, LogitRowsView, Rows

__all__ = ["ArrayRows", "OneSequenceLM"]

#: Rows one pass may carry for a model that states no batch limit (a synthetic one).
UNBOUNDED_BATCH = 512


class ArrayRows:
    """Logits rows held in a numpy array (implements ``LogitRowsView``)."""

    def __init__(self, array: np.ndarray) -> None:
        self._array = array
        self.n_rows, self.n_vocab = int(array.shape[0]), int(array.shape[1])

    def view(self) -> np.ndarray:
        return self._array

    def mask_columns(self, ids: np.ndarray, rows: Optional[Sequence[int]] = None) -> None:
        if not self._array.flags.writeable:  # a view of the model's own buffer: copy once
            self._array = self._array.copy()
        if rows is None:
            self._array[:, ids] = -np.inf
        else:
            self._array[np.ix_(np.asarray(rows, dtype=np.int64), ids)] = -np.inf


class OneSequenceLM:
    """``model`` as a ``SequenceLM`` whose only sequence is 0.

    ``n_batch`` is the model's own (a verify pass must fit one batch), else
    unbounded.  ``can_truncate`` is the model's: a recurrent model can only
    be extended or emptied.
    """

    n_seq = 1

    def __init__(self, model: CausalLM) -> None:
        self.model = model
        self._tokens: List[int] = []
        if model.n_past:  # a model handed over with a cache we do not know: start empty
            model.truncate(0)

    @property
    def n_vocab(self) -> int:
        return self.model.n_vocab

    @property
    def n_ctx(self) -> int:
        return self.model.n_ctx

    @property
    def n_batch(self) -> int:
        return int(getattr(self.model, "n_batch", None) or UNBOUNDED_BATCH)

    @property
    def can_truncate(self) -> bool:
        return bool(getattr(self.model, "can_truncate", True))

    def n_past(self, seq: int) -> int:
        return len(self._tokens)

    def tokens(self, seq: int) -> List[int]:
        return self._tokens

    def decode(self, parts: Sequence[Rows]) -> List[Optional[LogitRowsView]]:
        """Each part in turn (one sequence: at most one part)."""
        if len(parts) > 1:
            raise ValueError(f"a one-sequence model got {len(parts)} parts in one decode")
        out: List[Optional[LogitRowsView]] = []
        for part in parts:
            tokens = list(part.tokens)
            # Some CausalLMs (synthetic ones) always return at least one row.
            try:
                logits = self.model.eval(tokens, max(part.n_logits, 1))
            except BaseException:
                self.resync()
                raise
            self._tokens.extend(tokens)
            out.append(ArrayRows(logits[-part.n_logits:]) if part.n_logits else None)
        return out

    def truncate(self, seq: int, n: int) -> None:
        if n < len(self._tokens):
            try:
                self.model.truncate(n)
            except BaseException:
                self.resync()
                raise
            del self._tokens[n:]

    def clear(self, seq: int) -> None:
        self.truncate(seq, 0)

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        raise ValueError("a one-sequence model has no second sequence to copy from")

    def resync(self) -> None:
        """After a failed or interrupted call: make the model and the mirror agree.

        An interruption can leave the model shorter than the mirror (a
        recurrent state dropped) or longer (tokens decoded, mirror not yet
        extended)."""
        n = self.model.n_past
        if n < len(self._tokens):
            del self._tokens[n:]
        elif n > len(self._tokens):
            self.model.truncate(len(self._tokens))
