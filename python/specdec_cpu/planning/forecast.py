"""What the batch planner expects for K concurrent requests on a calibration.

Before a server runs, and after a benchmark, the same question comes up:
with this pair's measured pass times on this machine and an acceptance α,
how much can drafting add to continuous batching at K requests?
:func:`forecast` answers it with the planner itself (not a separate
formula): K identical requests, each offered the draft model with every
row accepted with probability α, one plan.  ``specdec-cpu plan --users``
prints it; ``bench.serving`` sets it beside the measured gains, so a goal
above it is seen to be above what the machine allows (docs/serving.md §2).

The pass times are the calibration's, taken with a short cache: the
forecast is the gain at the start of a conversation, optimistic for a long
one (whose passes cost more, drafts included).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .batch_planner import BatchPlanner, DraftOption, PlanRequest
from .costmodel import CostModel

__all__ = ["BatchForecast", "forecast"]


@dataclass(frozen=True)
class BatchForecast:
    """The plan for ``users`` requests: each one's γ and the batch's rates."""

    users: int
    gammas: tuple[int, ...]
    #: expected tokens per second of the whole batch with the planned γs
    planned_tps: float
    #: tokens per second of continuous batching alone (every γ = 0)
    plain_tps: float

    @property
    def gain(self) -> float:
        """Planned over plain: the speed-up drafting can add at this K."""
        return self.planned_tps / self.plain_tps


def forecast(model: CostModel, alpha: float, users: Sequence[int], gamma_max: int = 12) -> list[BatchForecast]:
    """One :class:`BatchForecast` per K in ``users``.

    Args:
        model: a calibration with the draft's pass times by batch size
            (``draft_batch_ms``, measured by ``specdec-cpu calibrate`` with
            a draft model).
        alpha: every draft row's acceptance probability, in [0, 1].
        users: the numbers of concurrent requests, each >= 1.
        gamma_max: the longest draft a request may be given.

    Raises:
        ValueError: the calibration has no draft times by batch size, or an
            argument is out of range.
    """
    if not model.draft_batch_ms:
        raise ValueError("the calibration has no draft pass times by batch size (draft_batch_ms): "
                         "run `specdec-cpu calibrate` with a draft model and --batch N > 1")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if not users or any(k < 1 for k in users):
        raise ValueError(f"users must be a non-empty list of K >= 1, got {list(users)}")
    if gamma_max < 1:
        raise ValueError(f"gamma_max must be >= 1, got {gamma_max}")
    planner = BatchPlanner(model, max_rows=max(model.k_max, max(users) * (gamma_max + 1)),
                           max_draft_rows=max(len(model.draft_batch_ms), max(users)))
    option = DraftOption("model", [alpha] * gamma_max, costly=True, catch_up=1)
    out = []
    for k in users:
        gammas = tuple(g for _, g in planner.plan([PlanRequest(options=[option])] * k))
        out.append(BatchForecast(k, gammas, 1000.0 * planner.last_rate, 1000.0 * planner.plain_rate(k)))
    return out
