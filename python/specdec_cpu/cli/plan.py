"""``specdec-cpu plan``: the speed-up table for an acceptance rate and costs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from ..planning import theory
from ..planning.costmodel import CostModel
from ..planning.forecast import forecast
from ._common import UsageError, emit, int_in, nonneg_float, positive_float, probability
from ._format import plan_lines


def register(sub: "argparse._SubParsersAction") -> None:
    """Add the ``plan`` subcommand."""
    p = sub.add_parser(
        "plan",
        help="what γ, what speed-up: the plan table for given α and costs",
        description="Print the expected tokens per step and the speed-up over plain decoding "
                    "for every draft length γ, mark the best γ*, and print the continuous "
                    "optimum and the ceiling 1/(1 − α).",
    )
    p.add_argument("--alpha", type=probability, metavar="A",
                   help="acceptance α = Σ min(p, q) in [0, 1] (default: from --calibration)")
    p.add_argument("--cost", type=nonneg_float, metavar="C",
                   help="draft cost c = T_draft(1) / T_target(1) (default: from --calibration)")
    v = p.add_mutually_exclusive_group()
    v.add_argument("--verify-cost", type=positive_float, metavar="V",
                   help="cost of verifying k ≥ 2 rows in one target pass relative to one row, "
                        "the same for every k (default 1: a memory-bound target)")
    v.add_argument("--calibration", metavar="FILE",
                   help="a calibration JSON (from `specdec-cpu calibrate`): its measured "
                        "v(k) curve, and α and c unless given")
    p.add_argument("--gamma-max", type=int_in(0, 64), default=12, metavar="N",
                   help="largest γ in the table (default 12)")
    p.add_argument("--users", type=_users, metavar="K[,K...]",
                   help="also plan for K concurrent requests sharing each target pass (a batched "
                        "server): the γ per request the batch planner picks and the predicted "
                        "speed-up over continuous batching alone; needs --calibration")
    p.add_argument("--plot", metavar="OUT.png",
                   help="also draw speed-up against γ to this image (needs matplotlib)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the plan table (and draw it with --plot)."""
    model = load_calibration(args.calibration) if args.calibration else None
    alpha = _pick("--alpha", args.alpha, model.alpha if model else None, model)
    cost = _pick("--cost", args.cost, model.cost if model else None, model)
    flat_v: Optional[float] = None  # without a calibration: one v(k) for every k ≥ 2
    if model is not None:
        verify: theory.VerifyCost = model.verify_curve(args.gamma_max + 1)
        v_text = f"v(k) measured ({args.calibration})"
        if args.gamma_max + 1 > model.k_max:
            v_text = (f"v(k) measured for k ≤ {model.k_max}, continued linearly beyond "
                      f"({args.calibration}; `calibrate --gamma-max {args.gamma_max}` measures them)")
    else:
        verify = flat_v = 1.0 if args.verify_cost is None else args.verify_cost
        v_text = f"v(k) = {flat_v:g} for k ≥ 2" + (" (memory-bound target)" if flat_v == 1.0 else "")

    star = theory.optimal_gamma(alpha, cost, args.gamma_max, verify)
    rows = theory.plan_table(alpha, cost, args.gamma_max, verify)
    lines = [f"α = {alpha:.4g}   c = {cost:.4g}   {v_text}", ""]
    lines += plan_lines(rows, star)
    lines += ["", continuous_line(alpha, cost, flat_v), ceiling_line(alpha)]
    if args.users:
        if model is None:
            raise UsageError("--users needs --calibration FILE (the measured pass times of both models)")
        lines += [""] + users_lines(model, alpha, args.users, args.gamma_max)
        if args.cost is not None:
            lines.append(f"(--cost {args.cost:g} is not used for K requests: the draft's measured pass times are)")
    emit("\n".join(lines))
    if args.plot:
        from ._plot import plot_plan

        plot_plan(Path(args.plot), alpha, cost, rows, star, flat_v)
        emit(f"plot written to {args.plot}")
    return 0


def users_lines(model: CostModel, alpha: float, users: list[int], gamma_max: int) -> list[str]:
    """The batch plan for each number of concurrent requests: every request
    accepts draft rows with probability α; one target pass verifies all of
    them, one draft pass per depth drafts for all (docs/serving.md §2)."""
    lines = [f"K concurrent requests (α = {alpha:.4g} each; measured target and draft pass times by rows):",
             "    K   γ per request   tok/s planned   tok/s at γ = 0   speed-up over continuous batching"]
    plain_somewhere = False
    for f in forecast(model, alpha, users, gamma_max):
        shown = str(f.gammas[0]) if len(set(f.gammas)) == 1 else ",".join(map(str, f.gammas))
        lines.append(f"{f.users:5d}   {shown:<13s}   {f.planned_tps:13.1f}   {f.plain_tps:14.1f}   {f.gain:.2f}×")
        plain_somewhere |= not any(f.gammas)
    if plain_somewhere:
        lines.append("(γ = 0: the batch's rows are worth more as other requests' tokens than as drafts; "
                     "the planner runs continuous batching alone)")
    return lines


def _users(text: str) -> list[int]:
    try:
        ks = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a comma-separated list of integers, got {text!r}") from None
    if not ks or any(not 1 <= k <= 256 for k in ks):
        raise argparse.ArgumentTypeError(f"each K must be in [1, 256], got {text!r}")
    return ks


def continuous_line(alpha: float, cost: float, flat_v: Optional[float]) -> str:
    """The continuous optimum of E/(c·γ + v) for a flat v, or why there is none."""
    if flat_v is None:
        return "continuous optimum: not defined for a measured v(k) curve (see the table)"
    try:
        # E/(c·γ + v) has the stationary point of E/((c/v)·γ + 1).
        g = theory.stationary_gamma(alpha, cost / flat_v)
    except ValueError as exc:
        return f"continuous optimum: none ({str(exc).removeprefix('no interior optimum: ')})"
    s = theory.speedup(alpha, g, cost, flat_v)
    note = " (below plain decoding: the jump from v(1) = 1 to v dominates)" if s < 1.0 else ""
    return f"continuous optimum: γ ≈ {g:.2f} at {s:.3f}×{note}"


def ceiling_line(alpha: float) -> str:
    """The tokens-per-step ceiling 1/(1 − α)."""
    c = theory.ceiling(alpha)
    shown = "∞" if c == float("inf") else f"{c:.2f}"
    return f"ceiling: 1/(1 − α) = {shown} tokens per step (the speed-up limit for free drafts and a flat v = 1)"


def load_calibration(path: str) -> CostModel:
    """A cost model from a cache file or ``calibrate --json`` output."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise OSError(f"cannot read calibration {path}: {exc.strerror or exc}") from None
    try:
        return CostModel.from_json(text)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def _pick(flag: str, given: Optional[float], fallback: Optional[float], model: Optional[CostModel]) -> float:
    if given is not None:
        return given
    if fallback is not None:
        return fallback
    if model is None:
        raise UsageError(f"{flag} is required (or pass --calibration FILE)")
    raise UsageError(f"{flag} is required: the calibration does not contain it")
