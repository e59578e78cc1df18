"""Text rendering of plan tables and verify-cost curves (shared by commands)."""

from __future__ import annotations

from typing import Optional, Sequence

from ..planning.theory import PlanRow


def plan_lines(rows: Sequence[PlanRow], star: int) -> list[str]:
    """The seed-style table (γ, E[tokens], speed-up, % of best), with γ* = ``star`` marked."""
    lines = ["    γ   E[tokens]   speed-up   % of best"]
    for r in rows:
        mark = ""
        if r.gamma == star:
            mark = f"   ← γ* = {star}" + (" (plain decoding: speculation does not pay)" if star == 0 else "")
        lines.append(f"  {r.gamma:3d}   {r.expected_tokens:9.3f}   {r.speedup:7.3f}×   {r.pct_of_best:8.1f}%{mark}")
    return lines


def verify_lines(target_ms: Sequence[float], ks: Optional[Sequence[int]] = None) -> list[str]:
    """T(k) and v(k) = T(k)/T(1) per row count k (``ks``: which k, default all)."""
    lines = ["    k    T(k) ms     v(k)"]
    for k in (range(1, len(target_ms) + 1) if ks is None else ks):
        t = target_ms[k - 1]
        lines.append(f"  {k:3d}   {t:8.2f}   {t / target_ms[0]:6.2f}")
    return lines


def draft_lines(draft_ms: Sequence[float]) -> list[str]:
    """T_draft(b) and its ratio to T_draft(1) per batch size b."""
    lines = ["    b    T(b) ms   T(b)/T(1)"]
    for b, t in enumerate(draft_ms, start=1):
        lines.append(f"  {b:3d}   {t:8.2f}   {t / draft_ms[0]:6.2f}")
    return lines
