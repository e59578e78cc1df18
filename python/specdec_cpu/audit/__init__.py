"""Is it exact?  Auditing any engine's samples against the target's distributions.

Given generated sequences (prompt + emitted token ids) and the sampling
settings they were produced with, the audit recomputes the target model's
final sampling distribution p_t at every emitted position and tests, pooled
over positions and sequences, whether the emitted tokens x_t look like draws
from those p_t:

* **rank bins**: the rank of x_t under p_t falls in a bin of ranks
  (0, 1, 2, 3–4, 5–7, 8–15, ...) with probability π_tb; a chi-square compares
  the observed bin counts with Σ_t π_tb, using the counts' exact covariance;
* **surprisal**: Z = Σ(−log p_t(x_t) − H_t) / √Σ Var_t is about N(0, 1); a
  sampler biased toward likely tokens gives Z < 0;
* **total variation**: an interval for the gap between the pooled rank-bin
  laws (0 is inside it exactly when the chi-square passes).

Positions where p_t is a point mass (greedy) only get checked to be the
argmax.  End-of-generation ids are one merged outcome, so a sequence that
stopped at one can be audited although the token is not in its text.

Entry points: :func:`audit_sequences` (a target GGUF and sequences),
:class:`AuditSession` (the same, fed in batches until enough is audited),
:class:`AuditAccumulator` (distributions you computed yourself),
:func:`read_jsonl` (the input format), and ``specdec-cpu audit``.
"""

from __future__ import annotations

from .accumulate import MIN_EXPECTED, AuditAccumulator, AuditStatistics, BinCount, Mismatch
from .chains import CHAINS, TEMPERATURE_FIRST, TEMPERATURE_LAST, chain_distribution
from .eog import merge_eog
from .report import DEFAULT_THRESHOLD, DEFAULT_TIE_TOLERANCE, AuditReport
from .samples import AuditInputError, GeneratedSequence, parse_lines, read_jsonl

__all__ = [
    "audit_sequences",
    "AuditSession",
    "AuditAccumulator",
    "AuditStatistics",
    "AuditReport",
    "BinCount",
    "Mismatch",
    "GeneratedSequence",
    "AuditInputError",
    "read_jsonl",
    "parse_lines",
    "chain_distribution",
    "merge_eog",
    "CHAINS",
    "TEMPERATURE_FIRST",
    "TEMPERATURE_LAST",
    "DEFAULT_THRESHOLD",
    "DEFAULT_TIE_TOLERANCE",
    "MIN_EXPECTED",
    "TargetModel",
    "generate_samples",
]


def __getattr__(name: str):
    # The pieces that load llama.cpp are imported on first use.
    if name == "audit_sequences":
        from .run import audit_sequences

        return audit_sequences
    if name == "AuditSession":
        from .run import AuditSession

        return AuditSession
    if name == "TargetModel":
        from .target import TargetModel

        return TargetModel
    if name == "generate_samples":
        from .generate import generate_samples

        return generate_samples
    raise AttributeError(f"module 'specdec_cpu.audit' has no attribute {name!r}")
