"""One step of a batched decoder as its planner saw it and as it ran.

A ``BatchedDecoder(..., step_trace=callback)`` calls ``callback`` with a
:class:`StepRecord` after every step (on the scheduler's thread: keep it
quick, e.g. append to a list or write a line).  This is how the planner's
predictions are checked against what happened: the rate the chosen plan
predicted, the rate plain batching (every γ = 0) was predicted to reach in
the same step, the tokens and the time the step really took, and every pass
with the time the planner's curve predicted for it before the pass ran.
``bench/step_trace.py`` summarises a file of such records.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional

__all__ = ["StepRecord", "StepTrace"]


@dataclass(frozen=True)
class StepRecord:
    """One scheduler step.

    Attributes:
        start: ``time.perf_counter()`` when the step began.
        seconds: the step's wall time.
        gammas: γ of every decoding request (0: a plain row).
        routes: each one's drafter (``"model"``, ``"ngram"``, None).
        probes: whether each one was a probe (re-measuring its α̂).
        alpha_hats: the α̂ of each drafting request's draft rows, as planned.
        alphas: the exact Σ min(p, q) of each one's verified rows.
        accepted: each one's accepted draft tokens.
        prompt_rows: prompt rows in the target pass (requests being prefilled).
        catch_up_rows: rows of the draft's catch-up in the first draft pass.
        catch_up_gain: the gain over plain batching the catch-up was judged
            to buy (the planned rate with the caught-up requests drafting over
            the rate without; 0 without a catch-up).
        planned_rate: tokens per ms the chosen plan predicted.
        plain_rate: tokens per ms plain batching was predicted to reach.
        emitted: tokens the step emitted (first tokens of prompts included).
        target_passes: ``(rows, ms, predicted ms)`` of the target pass.
        draft_passes: ``(rows, ms, predicted ms)`` of each draft pass.
    """

    start: float
    seconds: float
    gammas: tuple[int, ...]
    routes: tuple[Optional[str], ...]
    probes: tuple[bool, ...]
    alpha_hats: tuple[tuple[float, ...], ...]
    alphas: tuple[tuple[float, ...], ...]
    accepted: tuple[int, ...]
    prompt_rows: int
    catch_up_rows: int
    catch_up_gain: float
    planned_rate: float
    plain_rate: float
    emitted: int
    target_passes: tuple[tuple[int, float, float], ...]
    draft_passes: tuple[tuple[int, float, float], ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for a JSON line)."""
        return asdict(self)


#: What a BatchedDecoder calls after every step.
StepTrace = Callable[[StepRecord], None]
