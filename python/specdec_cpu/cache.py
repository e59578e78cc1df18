"""A model's KV cache together with the token ids it holds."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .model import CausalLM


class CachedSequence:
    """Keeps a mirror of the tokens in a model's cache, so that only tokens
    the cache lacks are ever decoded, and so that after an interruption the
    cache can be cut back to what is known to be in it.

    The mirror is updated only after the model call returns: if a call
    raises (or is interrupted), ``resync`` truncates the model back to the
    mirror and the two agree again.
    """

    def __init__(self, model: CausalLM) -> None:
        self.model = model
        self.tokens: list[int] = []

    def __len__(self) -> int:
        return len(self.tokens)

    def common_prefix(self, seq: Sequence[int]) -> int:
        """Length of the common prefix of the cache and ``seq``."""
        n = min(len(self.tokens), len(seq))
        if n == 0:
            return 0
        a = np.asarray(self.tokens[:n], dtype=np.int64)
        b = np.asarray(seq[:n], dtype=np.int64)
        diff = np.flatnonzero(a != b)
        return int(diff[0]) if diff.size else n

    def align(self, seq: Sequence[int]) -> int:
        """Keep the longest prefix of the cache that ``seq`` starts with.

        Called once per generation; afterwards the cache always holds a
        prefix of the sequence being generated, so steps compare nothing.
        """
        n = self.common_prefix(seq)
        self.keep(n)
        return n

    def keep(self, n: int) -> None:
        """Forget everything after the first ``n`` tokens."""
        if n < len(self.tokens):
            self.model.truncate(n)
            del self.tokens[n:]

    def sync_and_eval(self, seq: Sequence[int], n_logits: int = 1) -> np.ndarray:
        """Extend the cache to hold ``seq`` and return logits of its last positions.

        The cache must hold a prefix of ``seq``.  At least the last ``n_logits``
        tokens are decoded, since their logits are needed; everything before
        them that the cache holds is reused.
        """
        self.keep(len(seq) - n_logits)
        new = list(seq[len(self.tokens):])
        logits = self.model.eval(new, n_logits)
        self.tokens.extend(new)
        return logits

    def eval(self, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        """Append ``tokens`` after what the cache holds."""
        logits = self.model.eval(tokens, n_logits)
        self.tokens.extend(tokens)
        return logits

    def resync(self) -> None:
        """After a failed or interrupted call: cut the model back to the mirror."""
        if self.model.n_past != len(self.tokens):
            self.model.truncate(len(self.tokens))

    def reset(self) -> None:
        """Empty the cache."""
        self.keep(0)
