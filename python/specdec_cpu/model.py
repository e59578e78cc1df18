"""The two small protocols the decoder drives.

``CausalLM`` is a model with a KV cache that can be extended and truncated;
``Tokenizer`` turns text into ids and ids into bytes.  The llama.cpp engine
implements both; tests plug in synthetic models (e.g. Markov chains in numpy)
to check the exactness of whole sequences.
"""

from __future__ import annotations

from typing import Optional, Protocol, Sequence, runtime_checkable

import numpy as np


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
