"""The protocols the decoding core drives.

- ``SequenceLM``: a model holding several sequences in its KV cache, which
  one ``decode`` call extends together (every row tagged with its
  sequence) and ``truncate`` cuts back one at a time.  The step core only
  ever talks to this one: ``LlamaMultiContext`` implements it, and
  ``OneSequenceLM`` (one_sequence.py) makes any ``CausalLM`` a one-sequence
  ``SequenceLM``;
- ``CausalLM``: a model with one sequence in its cache (llama.cpp's
  ``LlamaContext``, or a synthetic model of the exactness tests, e.g. a
  Markov chain in numpy);
- ``Tokenizer``: text into ids and ids into bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Protocol, Sequence, runtime_checkable

import numpy as np

__all__ = ["CausalLM", "LogitRowsView", "Rows", "SequenceLM", "Tokenizer", "eog_id_array"]


@runtime_checkable
class CausalLM(Protocol):
    """A causal language model holding one sequence in its cache."""

    @property
    def n_vocab(self) -> int:
        """Number of rows in a logits vector."""

    @property
    def n_ctx(self) -> int:
        """Maximum number of tokens the cache can hold."""

    @property
    def n_past(self) -> int:
        """Number of tokens currently in the cache."""

    def eval(self, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        """Append ``tokens`` to the cache and return logits of the last positions.

        Returns a ``(n_logits, n_vocab)`` float32 C-contiguous array for the
        last ``n_logits`` of ``tokens`` (row i predicts the token after
        ``tokens[len(tokens) - n_logits + i]``).  The array may be a view of
        the model's own buffer, valid only until the next ``eval``/``truncate``.
        """

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens of the cache and forget the rest."""


@dataclass(frozen=True)
class Rows:
    """Tokens to append to one sequence in a ``SequenceLM.decode``.

    ``n_logits`` rows of logits are returned for the last ``n_logits`` tokens
    (0: only extend the cache, e.g. a prompt chunk).
    """

    seq: int
    tokens: Sequence[int]
    n_logits: int = 0


class LogitRowsView(Protocol):
    """One sequence's logits rows after a decode (valid until the next decode)."""

    n_rows: int
    n_vocab: int

    def view(self) -> np.ndarray:
        """A ``(n_rows, n_vocab)`` float32 C-contiguous array over the rows."""

    def mask_columns(self, ids: np.ndarray, rows: Optional[Sequence[int]] = None) -> None:
        """Set columns ``ids`` of ``rows`` (default: every row) to −∞ (banned before sampling)."""


@runtime_checkable
class SequenceLM(Protocol):
    """A causal language model holding ``n_seq`` sequences in its cache.

    A failed ``decode`` leaves every sequence as it was; ``tokens(seq)`` is
    always exactly what the cache holds for that sequence.
    """

    @property
    def n_vocab(self) -> int:
        """Number of values in a logits row."""

    @property
    def n_ctx(self) -> int:
        """Most tokens one sequence may hold."""

    @property
    def n_batch(self) -> int:
        """Most rows one ``decode`` may carry."""

    @property
    def n_seq(self) -> int:
        """Number of sequences (slots)."""

    def n_past(self, seq: int) -> int:
        """Tokens sequence ``seq`` holds."""

    def tokens(self, seq: int) -> List[int]:
        """The ids sequence ``seq`` holds (a mirror: do not modify)."""

    def decode(self, parts: Sequence[Rows]) -> List[Optional[LogitRowsView]]:
        """Append every part's tokens to its sequence in one pass; per part,
        its ``n_logits`` rows of logits (None where it asked for none)."""

    def truncate(self, seq: int, n: int) -> None:
        """Keep the first ``n`` tokens of sequence ``seq``."""

    def clear(self, seq: int) -> None:
        """Empty sequence ``seq``."""

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Make empty sequence ``dst`` hold the first ``n`` tokens of ``src``."""


@runtime_checkable
class Tokenizer(Protocol):
    """Text <-> token ids for one vocabulary."""

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of ``text`` (with BOS when the model wants it and ``add_special``)."""

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes of one token (may be a partial UTF-8 sequence)."""

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, ...)."""

    def chat_prompt(self, messages: Sequence[dict], *, add_generation_prompt: bool = True) -> Optional[str]:
        """The model's chat template applied to ``messages``; None without a template."""


def eog_id_array(tokenizer: Tokenizer, n_vocab: int) -> np.ndarray:
    """Every end-of-generation id below ``n_vocab``, sorted (the tokenizer's
    own ``eog_ids`` when it has them, else one ``is_eog`` call per id)."""
    ids = getattr(tokenizer, "eog_ids", None)
    if ids is None:
        ids = [t for t in range(n_vocab) if tokenizer.is_eog(t)]
    return np.array(sorted(int(t) for t in ids if 0 <= int(t) < n_vocab), dtype=np.intp)
