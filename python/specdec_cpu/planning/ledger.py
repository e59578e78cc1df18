"""What drafting has earned at each batch size, its investments included
(docs/serving.md §2).

A plan judges one step.  Some costs of drafting are paid before the steps
that draft: a request's draft cache that lags after its prompt or a plain
stretch must catch up (a draft pass over every token it missed), and a
probe re-measuring a stale α̂ drafts on hope.  Such an investment pays only
over the drafting stretch it enables, and in a shared batch that stretch is
short and uncertain.  Traced at four requests on the demo pair, the draft's
catch-ups cost the time of 39 tokens and the drafting steps that followed
lost another 24 against plain batching (8 blocks, 512 tokens each).

So the ledger keeps, per batch size, the tokens that steps which drafted or
caught a draft up emitted beyond what plain batching would have emitted in
the same time (at plain steps' realised rate).  Where that balance is
below −1 token, drafting has not paid for its investments there: the scheduler
makes no new ones (catch-ups, probes) at that batch size, and requests whose
drafts are still current may go on drafting as the plan says.  Every plain
step moves the balance 1% of the way back to 0 (a loss halves in ~70 plain
steps), so the batch size is tried again later: the text, the requests'
acceptance or the machine may have changed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["DraftingLedger"]


@dataclass
class DraftingLedger:
    """Per batch size, the tokens drafting (with its catch-ups and probes)
    gained over plain batching.

    Attributes:
        forget: per plain step of a batch size, the share of its balance
            that fades (the evidence ages while the batch size decodes plain).
        tolerance: a balance above ``-tolerance`` tokens still allows new
            investments (the rounding of an exponential fade never reaches 0).
    """

    forget: float = 0.01
    tolerance: float = 1.0
    balances: dict[int, float] = field(default_factory=dict)

    def record(self, batch: int, gained: float) -> None:
        """A step of ``batch`` requests that drafted or caught a draft up
        emitted ``gained`` tokens more than plain batching would have (negative:
        fewer)."""
        if batch >= 1 and math.isfinite(gained):
            self.balances[batch] = self.balances.get(batch, 0.0) + gained

    def plain_step(self, batch: int) -> None:
        """A step of ``batch`` requests that neither drafted nor caught up."""
        if batch in self.balances:
            self.balances[batch] *= 1.0 - self.forget

    def balance(self, batch: int) -> float:
        """Tokens gained (negative: lost) by drafting at ``batch`` requests, as remembered."""
        return self.balances.get(batch, 0.0)

    def may_invest(self, batch: int) -> bool:
        """Whether drafting at ``batch`` requests has paid for what it cost so far."""
        return self.balance(batch) > -self.tolerance
