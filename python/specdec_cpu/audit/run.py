"""Auditing generated sequences against a target model: the whole pipeline."""

from __future__ import annotations

from typing import List, Sequence, Union

import numpy as np

from ..params import SamplingParams
from .accumulate import MIN_EXPECTED, AuditAccumulator
from .chains import TEMPERATURE_FIRST, chain_distribution, check_chain
from .eog import merge_eog
from .report import DEFAULT_THRESHOLD, AuditReport
from .samples import TEXT_WARNING, AuditInputError, GeneratedSequence
from .target import TargetModel

__all__ = ["audit_sequences"]

#: Rows turned into distributions at a time (a float64 (32, V) block is
#: ~40 MB at a 152k vocabulary).
_ROWS_PER_BLOCK = 32


def audit_sequences(
    target: Union[str, TargetModel],
    sequences: Sequence[GeneratedSequence],
    params: SamplingParams,
    *,
    chain: str = TEMPERATURE_FIRST,
    threshold: float = DEFAULT_THRESHOLD,
    tie_tolerance: float = 0.05,
    min_expected: float = MIN_EXPECTED,
) -> AuditReport:
    """Audit ``sequences`` against the target's distributions under ``params`` and ``chain``.

    ``target`` is a GGUF path or an open :class:`TargetModel`.  Each
    emitted position's distribution comes from one batched pass over the
    sequence; the report pools every position of every sequence.
    ``threshold`` is the verdict's p-value threshold, and 1 − ``threshold``
    the TV interval's confidence level.
    """
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    check_chain(chain)
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), got {threshold}")
    if not tie_tolerance >= 0.0:
        raise ValueError(f"tie_tolerance must be >= 0, got {tie_tolerance}")
    if not sequences:
        raise ValueError("no sequences to audit")
    model = target if isinstance(target, TargetModel) else TargetModel(target)
    try:
        return _audit(model, list(sequences), params, chain, threshold, tie_tolerance, min_expected)
    finally:
        if model is not target:
            model.close()


def _audit(model: TargetModel, sequences: List[GeneratedSequence], params: SamplingParams, chain: str,
           threshold: float, tie_tolerance: float, min_expected: float) -> AuditReport:
    prepared = [(model.prompt_ids(s), model.emitted_ids(s), s.stopped) for s in sequences]
    if any(stopped for _, _, stopped in prepared) and not model.eog_ids:
        first = next(s for s in sequences if s.stopped)
        where = f"{first.source}: " if first.source else ""
        raise AuditInputError(f"{where}'stopped' is true but {model.path} has no end-of-generation token")
    warnings: List[str] = []
    n_text = sum(s.text is not None for s in sequences)
    if n_text:
        warnings.append(TEXT_WARNING.format(n=n_text, total=len(sequences)))

    acc = AuditAccumulator()
    n_ctx = max(len(p) + len(e) for p, e, _ in prepared)
    eog_rep = model.eog_ids[0] if model.eog_ids else -1
    positions = 0
    for index, (prompt, emitted, stopped) in enumerate(prepared):
        outcomes = np.asarray(list(emitted) + ([eog_rep] if stopped else []), dtype=np.int64)
        positions += outcomes.size
        for first, logits in model.rows(prompt, emitted, stopped, n_ctx):
            for lo in range(0, logits.shape[0], _ROWS_PER_BLOCK):
                block = logits[lo:lo + _ROWS_PER_BLOCK]
                where = np.arange(first + lo, first + lo + block.shape[0])
                probs = chain_distribution(block, params, chain)
                probs, outs, merged_logits = merge_eog(probs, outcomes[where], model.eog_ids, block)
                acc.add(probs, outs, logits=merged_logits, sequence=index, positions=where)

    return AuditReport(
        target=model.path, params=params, chain=chain, sequences=len(sequences),
        stopped=sum(stopped for _, _, stopped in prepared), positions=positions,
        point_mass=acc.point_mass, statistics=acc.statistics(1.0 - threshold, min_expected),
        mismatches=list(acc.mismatches), impossible=list(acc.impossible),
        tie_tolerance=tie_tolerance, threshold=threshold, warnings=warnings,
    )
