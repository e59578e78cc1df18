"""Sequence slots of the batched contexts, and prompt-prefix reuse between them.

A slot is one llama.cpp sequence id, in the target context and (when there
is one) the draft context alike.  A finished request leaves its tokens in
its slot: the next request whose prompt starts the same way (the next turn
of a conversation, or any request sharing a system prompt) decodes only
what differs.  In a unified KV cache a prefix held by *another* slot, even
a busy one, is shared by tagging its cells with the new slot as well: no
copy, no recomputation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..core.protocols import SequenceLM

__all__ = ["Claim", "SlotTable"]


@dataclass(frozen=True)
class Claim:
    """A slot given to a request, and how much of its prompt is cached there."""

    slot: int
    target_cached: int
    draft_cached: int


class SlotTable:
    """Which slots are free, and how a new prompt is placed in one.

    Placement: the free slot holding the longest prefix of the prompt is
    taken (ties: the least recently used, so recent conversations stay
    cached longest) and cut back to that prefix; if another slot holds a
    longer prefix, the free slot is emptied and shares that one instead.
    The draft context follows the same slot, with its own prefix.
    """

    def __init__(self, target: SequenceLM, draft: Optional[SequenceLM] = None) -> None:
        self.target, self.draft = target, draft
        n = target.n_seq
        self._free = set(range(n))
        self._used_at = [0.0] * n

    @property
    def n_free(self) -> int:
        return len(self._free)

    @property
    def n_slots(self) -> int:
        return self.target.n_seq

    def claim(self, prompt: Sequence[int], reuse: bool = True) -> Claim:
        """Take a free slot for ``prompt`` and prepare its caches.

        At most ``len(prompt) − 1`` tokens are reused: the last prompt token
        is always decoded with the request's first step (its logits are the
        first token's distribution).  Without ``reuse`` none is (a request
        that needs every prompt row's logits).
        """
        if not self._free:
            raise RuntimeError("no free slot")  # the scheduler checks n_free first
        limit = len(prompt) - 1 if reuse else 0
        p = np.asarray(prompt[:limit], dtype=np.int64)
        t_prefix = [_common(self.target.tokens(s), p) for s in range(self.n_slots)]
        slot = max(self._free, key=lambda s: (t_prefix[s], -self._used_at[s]))
        self._free.discard(slot)
        target_cached = self._place(self.target, t_prefix, slot)
        draft_cached = 0
        if self.draft is not None:
            d_prefix = [_common(self.draft.tokens(s), p) for s in range(self.n_slots)]
            draft_cached = self._place(self.draft, d_prefix, slot)
        return Claim(slot, target_cached, draft_cached)

    def release(self, slot: int) -> None:
        """Give a slot back; its tokens stay cached for later prompts."""
        self._used_at[slot] = time.monotonic()
        self._free.add(slot)

    @staticmethod
    def _place(ctx: SequenceLM, prefix: list[int], slot: int) -> int:
        """Make ``slot`` of ``ctx`` hold the longest available prefix; its length.

        A model whose cache cannot drop a suffix (a recurrent target decoding
        plainly, ``can_truncate`` False) keeps its cache only when the
        prompt extends all of it; otherwise it starts over."""
        if not getattr(ctx, "can_truncate", True):
            if prefix[slot] < ctx.n_past(slot):
                ctx.clear(slot)
                return 0
            return prefix[slot]
        best = max(range(len(prefix)), key=lambda s: (prefix[s], s == slot))
        if best != slot and prefix[best] > prefix[slot]:
            ctx.clear(slot)
            ctx.copy_prefix(best, slot, prefix[best])
            return prefix[best]
        ctx.truncate(slot, prefix[slot])
        return prefix[slot]


def _common(cached: Sequence[int], prompt: np.ndarray) -> int:
    """Length of the common prefix of a slot's tokens and the prompt."""
    n = min(len(cached), prompt.shape[0])
    if n == 0:
        return 0
    a = np.asarray(cached[:n], dtype=np.int64)
    diff = np.flatnonzero(a != prompt[:n])
    return int(diff[0]) if diff.size else n
