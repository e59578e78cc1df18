"""Drawing the plan as an image (matplotlib is an optional extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..planning import theory
from ..planning.theory import PlanRow


def plot_plan(path: Path, alpha: float, cost: float, rows: Sequence[PlanRow], star: int,
              flat_v: Optional[float]) -> None:
    """Speed-up against γ: integer points, the continuous curve for a flat v, γ* marked."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'specdec-cpu[plot]'") from None

    # A bare Figure (no pyplot) touches no global backend state.
    fig = Figure(figsize=(6.4, 4.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    gammas = [r.gamma for r in rows]
    ax.plot(gammas, [r.speedup for r in rows], "o", color="C0", label="speed-up at integer γ")
    if flat_v is not None and len(rows) > 1:
        g = np.linspace(1e-3, gammas[-1], 400)
        ax.plot(g, theory.speedup(alpha, g, cost, flat_v), "-", color="C0", alpha=0.4,
                label="continuous γ")
    ax.axhline(1.0, color="grey", linestyle=":", label="plain decoding")
    best = rows[star]
    ax.plot([best.gamma], [best.speedup], "*", color="C3", markersize=14,
            label=f"γ* = {best.gamma}: {best.speedup:.2f}×")
    ax.set_xlabel("γ (draft tokens per step)")
    ax.set_ylabel("speed-up over plain decoding")
    v_text = "measured v(k)" if flat_v is None else f"v = {flat_v:g}"
    ax.set_title(f"α = {alpha:.3g}, c = {cost:.3g}, {v_text}")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
