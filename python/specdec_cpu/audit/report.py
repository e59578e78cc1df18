"""The audit's result: the statistics, the checks, a verdict and how to print them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ..params import SamplingParams
from .accumulate import AuditStatistics, Mismatch

__all__ = ["AuditReport", "DEFAULT_THRESHOLD", "DEFAULT_TIE_TOLERANCE"]

#: The verdict fails when either test's p-value is below this.
DEFAULT_THRESHOLD = 1e-3
#: How far rounding in another pass may move a difference between two logits
#: (near_ties.py): cache layouts of a batched engine move them by up to 0.02 on
#: the F32 demo target (tests/test_audit_batch_layouts.py).
DEFAULT_TIE_TOLERANCE = 0.05

_SHOWN = 5  # mismatches listed in the text output


@dataclass
class AuditReport:
    """What an audit found.

    ``statistics`` is None when no position was informative (every one a
    point mass, or none at all).  ``mismatches`` are point-mass positions
    whose outcome is not the one possible token (greedy, or a one-token
    nucleus); ``impossible`` are outcomes with probability 0 at other
    positions (outside top-k / top-p / min-p).  Either kind fails the
    verdict unless it is a near tie: inside the support once logit
    differences move by ``tie_tolerance``, as rounding in another pass can
    move them (near_ties.py).
    """

    target: str
    params: SamplingParams
    chain: str
    sequences: int
    stopped: int
    positions: int
    point_mass: int
    statistics: Optional[AuditStatistics]
    mismatches: List[Mismatch] = field(default_factory=list)
    impossible: List[Mismatch] = field(default_factory=list)
    tie_tolerance: float = DEFAULT_TIE_TOLERANCE
    threshold: float = DEFAULT_THRESHOLD
    warnings: List[str] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        """Informative positions audited by the tests."""
        return self.statistics.tokens if self.statistics is not None else 0

    @property
    def near_ties(self) -> List[Mismatch]:
        """Outcomes outside the support that rounding within the tolerance can explain."""
        return [m for m in self.mismatches + self.impossible if m.near_tie]

    @property
    def real_mismatches(self) -> List[Mismatch]:
        """Point-mass mismatches beyond the tolerance."""
        return [m for m in self.mismatches if not m.near_tie]

    @property
    def real_impossible(self) -> List[Mismatch]:
        """Probability-0 outcomes beyond the tolerance."""
        return [m for m in self.impossible if not m.near_tie]

    @property
    def reasons(self) -> List[str]:
        """Why the verdict fails (empty when it passes)."""
        out = []
        st = self.statistics
        if st is not None and st.chi2_p < self.threshold:
            out.append(f"rank-bin chi-square p = {st.chi2_p:.3g} < {self.threshold:g}")
        if st is not None and st.z_p < self.threshold:
            lean = ("more likely tokens than the target's distribution gives" if st.z < 0
                    else "less likely tokens than the target's distribution gives")
            out.append(f"surprisal z = {st.z:+.2f} (p = {st.z_p:.3g} < {self.threshold:g}): {lean}")
        if self.real_impossible:
            out.append(f"{len(self.real_impossible)} tokens with probability 0 under the target's distribution "
                       f"(beyond the tie tolerance {self.tie_tolerance:g})")
        if self.real_mismatches:
            out.append(f"{len(self.real_mismatches)} point-mass positions where the token is not the only "
                       f"possible one (beyond the tie tolerance {self.tie_tolerance:g})")
        return out

    @property
    def verdict(self) -> str:
        """``"pass"`` or ``"fail"`` (see :attr:`reasons`)."""
        return "fail" if self.reasons else "pass"

    # -- output ----------------------------------------------------------

    def to_dict(self) -> Dict[str, Any]:
        """Plain data for ``--json``: the summary keys first, then the details."""
        st = self.statistics
        data: Dict[str, Any] = {
            "verdict": self.verdict,
            "reasons": self.reasons,
            "threshold": self.threshold,
            "tokens": self.tokens,
            "chi2_p": None if st is None else st.chi2_p,
            "z": None if st is None else st.z,
            "z_p": None if st is None else st.z_p,
            "tv": None if st is None else list(st.tv),
            "tv_estimate": None if st is None else st.tv_estimate,
            "tv_level": None if st is None else st.level,
            "chi2": None if st is None else st.chi2,
            "chi2_dof": None if st is None else st.chi2_dof,
            "pearson_chi2": None if st is None else st.pearson_chi2,
            "pearson_p": None if st is None else st.pearson_p,
            "tv_plugin": None if st is None else st.tv_plugin,
            "mean_surprisal_excess": None if st is None else st.mean_surprisal_excess,
            "bins": [] if st is None else [dataclasses.asdict(b) for b in st.bins],
            "positions": self.positions,
            "point_mass": self.point_mass,
            "mismatches": [dataclasses.asdict(m) for m in self.mismatches],
            "near_ties": len(self.near_ties),
            "impossible": [dataclasses.asdict(m) for m in self.impossible],
            "sequences": self.sequences,
            "stopped": self.stopped,
            "target": self.target,
            "chain": self.chain,
            "params": {"temperature": self.params.temperature, "top_k": self.params.top_k,
                       "top_p": self.params.top_p, "min_p": self.params.min_p},
            "tie_tolerance": self.tie_tolerance,
            "warnings": list(self.warnings),
        }
        return data

    def lines(self) -> List[str]:
        """The human-readable report."""
        p = self.params
        st = self.statistics
        out = [
            f"target: {self.target}",
            f"chain: {self.chain} (temperature {p.temperature:g}, top-k {p.top_k}, top-p {p.top_p:g}, "
            f"min-p {p.min_p:g})",
            f"sequences: {self.sequences} ({self.stopped} stopped at an end-of-generation token, "
            f"audited as the outcome 'any EOG token')",
            f"positions: {self.positions} ({self.tokens} audited, {self.point_mass} point masses "
            f"(one possible token, e.g. greedy: only checked), {len(self.impossible)} with probability 0)",
        ]
        if self.point_mass:
            out.append(f"point-mass mismatches (token not the argmax): {len(self.real_mismatches)} beyond "
                       f"the tie tolerance {self.tie_tolerance:g}, "
                       f"{len(self.mismatches) - len(self.real_mismatches)} near ties")
            out += [f"  {_mismatch(m)}" for m in self.mismatches[:_SHOWN]]
        if self.impossible:
            out.append(f"probability-0 tokens: {len(self.real_impossible)} beyond the tie tolerance "
                       f"{self.tie_tolerance:g}, {len(self.impossible) - len(self.real_impossible)} near ties "
                       "(at the edge of the support)")
            out += [f"  impossible: {_mismatch(m)}" for m in self.impossible[:_SHOWN]]
        if st is None:
            out.append("no informative positions: the statistical tests did not run")
        else:
            out.append("rank bins (rank 0 = the most likely outcome):   observed   expected")
            out += [f"  {b.ranks:>12} {b.observed:>30d} {b.expected:>10.1f}" for b in st.bins]
            out += [
                f"chi-square over rank bins: {st.chi2:.1f} on {st.chi2_dof} dof, p = {st.chi2_p:.3g} "
                f"(Pearson, conservative: p = {st.pearson_p:.3g})",
                f"surprisal z = {st.z:+.2f}, p = {st.z_p:.3g} (mean excess {st.mean_surprisal_excess:+.4f} "
                f"nats per token; negative = biased toward likely tokens)",
                f"TV gap (pooled rank bins): estimate {st.tv_estimate:.4f}, {100 * st.level:g}% interval "
                f"[{st.tv[0]:.4f}, {st.tv[1]:.4f}]",
            ]
            if st.tokens < 200:
                out.append(f"note: only {st.tokens} token{'s' if st.tokens > 1 else ''}: the p-values rest on "
                           "normal approximations that want a few hundred")
        out += [f"warning: {w}" for w in self.warnings]
        verdict = self.verdict
        if verdict == "pass":
            out.append(f"verdict: pass (fails when either test has p < {self.threshold:g}, or on "
                       "impossible tokens / point-mass mismatches)")
        else:
            out.append("verdict: fail: " + "; ".join(self.reasons))
        return out


def _mismatch(m: Mismatch) -> str:
    text = f"sequence {m.sequence}, position {m.position}: token {m.token}"
    if m.expected is not None:
        text += f", argmax {m.expected}"
    if m.logit_gap is not None:
        text += f" (logit gap {m.logit_gap:.4f})"
    if m.near_tie:
        text += ", a near tie"
    if m.source:
        text += f" [{m.source}]"
    return text
