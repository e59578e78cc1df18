"""What a drafter hands the step: its proposed tokens (and, for a sampling
drafter, the q rows they came from)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np


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
