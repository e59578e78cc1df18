"""Drafters: where proposals come from besides the draft model (which the
step core drives directly, core/step.py).

- :mod:`.ngram` — :class:`NgramDrafter`, prompt lookup: a continuation of
  the text copied from where its last tokens occurred before (also over the
  prompt's hard-wrapped lines joined, :mod:`.unwrap`);
- :mod:`.vocab_map` — :class:`DraftVocab`, where a draft model's logits
  columns sit in the target's vocabulary (a cut draft's included);
- :mod:`.base` — :class:`Draft`, what a proposal is.
"""

from .base import Draft
from .ngram import Match, NgramDrafter, NgramIndex

__all__ = ["Draft", "Match", "NgramDrafter", "NgramIndex"]
