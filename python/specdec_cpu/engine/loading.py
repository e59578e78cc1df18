"""Loading a (target, draft) pair: once, checked, and closed whole on failure."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, Union

from .vocab import check_vocab_compatible
from .vocab_cut import cut_draft
from .weights import LlamaWeights

__all__ = ["ModelPair", "load_pair"]

PathLike = Union[str, "os.PathLike[str]"]


class ModelPair:
    """A target and an optional draft, loaded (memory-mapped) and checked to
    share a vocabulary.  Closing the pair closes both models and every
    context made over them (dropping it does not: each model is freed when
    nothing refers to it any more)."""

    def __init__(self, target: LlamaWeights, draft: Optional[LlamaWeights]) -> None:
        self.target, self.draft = target, draft

    def close(self) -> None:
        for w in (self.draft, self.target):
            if w is not None:
                w.close()

    def __enter__(self) -> "ModelPair":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def closed_on_error(self) -> Iterator["ModelPair"]:
        """Close the pair (its contexts too) if the block raises: what a
        constructor building on the pair uses, so a failure leaves nothing
        loaded behind."""
        try:
            yield self
        except BaseException:
            self.close()
            raise


def load_pair(target: PathLike, draft: Optional[PathLike] = None, *, draft_vocab: Optional[int] = None,
              progress: Optional[Callable[[str], None]] = None) -> ModelPair:
    """Load ``target`` and ``draft``; with ``draft_vocab`` the draft is its
    cached cut to that many ids (written on first use).

    Raises ``ModelLoadError`` (a missing or unreadable file),
    ``VocabMismatchError`` (a draft that cannot draft for this target) or
    ``ValueError`` (a bad ``draft_vocab``); nothing stays loaded then.
    """
    draft = cut_draft(draft, draft_vocab, progress)
    target_w = LlamaWeights(target)
    draft_w = None
    try:
        if draft is not None:
            draft_w = LlamaWeights(draft)
            check_vocab_compatible(target_w, draft_w)
    except BaseException:
        target_w.close()
        if draft_w is not None:
            draft_w.close()
        raise
    return ModelPair(target_w, draft_w)
