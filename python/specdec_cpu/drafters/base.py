"""The drafter protocol."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol, Sequence

import numpy as np

from ..params import SamplingParams
from ..sampling import Rng


@dataclass
class Draft:
    """γ proposed tokens and, for a sampling drafter, the q rows they came from.

    ``probs`` is ``None`` for a deterministic drafter: q is then one-hot at
    each proposed token (accept with probability p(x); docs/math.md §5).
    """

    tokens: np.ndarray
    probs: Optional[np.ndarray]
    seconds: float = 0.0
    name: str = "model"

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


class Drafter(Protocol):
    """Proposes up to ``gamma`` continuation tokens of ``seq``."""

    name: str

    def begin(self, seq: Sequence[int]) -> None:
        """A generation starts from ``seq`` (keep whatever state still matches it)."""

    def propose(self, seq: Sequence[int], gamma: int, params: SamplingParams, rng: Rng) -> Draft:
        """Propose up to ``gamma`` tokens after ``seq``."""

    def rollback(self, n_valid: int) -> None:
        """Only the first ``n_valid`` tokens of the last proposal's context plus
        accepted drafts are part of the sequence now; forget the rest."""

    def reset(self) -> None:
        """Forget any state tied to the current sequence."""
