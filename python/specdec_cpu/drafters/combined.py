"""Prompt lookup when the text offers a continuation, a draft model otherwise."""

from __future__ import annotations

from typing import Sequence

from ..params import SamplingParams
from ..sampling import Rng
from .base import Draft, Drafter
from .ngram import NgramDrafter


class CombinedDrafter:
    """Uses the n-gram proposal when one exists, else the model's draft.

    The two are separate *routes* named after their drafts (``"ngram"``,
    ``"model"``), so acceptance is recorded per route (``Draft.name``) and a
    decoder can keep one γ controller per route:

    - :meth:`routes` lists the routes available after ``seq``, preferred first;
    - ``drafters[route].propose(...)`` drafts through one route;
    - :meth:`propose` is the plain protocol: the n-gram continuation (up to
      ``gamma`` tokens) when there is one, else ``gamma`` model tokens.

    ``begin``, ``rollback`` and ``reset`` go to both drafters.  The model
    drafter's cache only ever holds a prefix of the sequence (rolled back
    with everything else) and catches up with the tokens an n-gram step
    accepted lazily, inside its own next ``propose``.
    """

    name = "combined"

    def __init__(self, model_drafter: Drafter, ngram_drafter: NgramDrafter) -> None:
        if getattr(model_drafter, "name", None) == ngram_drafter.name:
            raise ValueError("model_drafter and ngram_drafter must have different names")
        self.model = model_drafter
        self.ngram = ngram_drafter
        self.drafters: dict[str, Drafter] = {ngram_drafter.name: ngram_drafter,
                                             model_drafter.name: model_drafter}

    def routes(self, seq: Sequence[int]) -> tuple[str, ...]:
        """``("ngram", "model")`` when the n-gram drafter has a match after
        ``seq``, else ``("model",)``."""
        if self.ngram.match(seq) is not None:
            return (self.ngram.name, self.model.name)
        return (self.model.name,)

    def begin(self, seq: Sequence[int]) -> None:
        self.ngram.begin(seq)
        self.model.begin(seq)

    def propose(self, seq: Sequence[int], gamma: int, params: SamplingParams, rng: Rng) -> Draft:
        """The n-gram continuation if there is one, else ``gamma`` tokens
        from the model drafter."""
        if self.ngram.match(seq) is not None:
            return self.ngram.propose(seq, gamma, params, rng)
        return self.model.propose(seq, gamma, params, rng)

    def rollback(self, n_valid: int) -> None:
        self.ngram.rollback(n_valid)
        self.model.rollback(n_valid)

    def reset(self) -> None:
        self.ngram.reset()
        self.model.reset()
