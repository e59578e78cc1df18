"""Observed against expected counts per rank bin, as an image (matplotlib, optional)."""

from __future__ import annotations

from pathlib import Path
from typing import Union

from .report import AuditReport

__all__ = ["plot_bins"]


def plot_bins(path: Union[str, Path], report: AuditReport) -> None:
    """Bars of observed and expected counts per rank bin, with ±2σ whiskers
    on the expected (σ² = Σ_t π_tb(1 − π_tb), the count's variance under the
    target), and the verdict in the title."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'specdec-cpu[plot]'") from None
    st = report.statistics
    if st is None:
        raise ValueError("nothing to plot: no informative positions were audited")

    fig = Figure(figsize=(7.0, 4.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs = range(len(st.bins))
    width = 0.4
    ax.bar([x - width / 2 for x in xs], [b.observed for b in st.bins], width, label="observed", color="C0")
    ax.bar([x + width / 2 for x in xs], [b.expected for b in st.bins], width, label="expected (target)",
           color="C1", yerr=[2 * b.sd for b in st.bins], capsize=3)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([b.ranks for b in st.bins], rotation=45, ha="right")
    ax.set_yscale("log")
    ax.set_xlabel("probability rank of the emitted token (0 = most likely)")
    ax.set_ylabel("tokens")
    ax.set_title(f"{report.verdict}: {st.tokens} tokens, chi-square p = {st.chi2_p:.3g}, "
                 f"z = {st.z:+.2f} (p = {st.z_p:.3g})", fontsize=10)
    ax.legend(loc="best")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
