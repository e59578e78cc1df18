"""Auditing generated sequences against a target model: the whole pipeline."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Union

import numpy as np

from ..params import SamplingParams
from .accumulate import MIN_EXPECTED, AuditAccumulator
from .chains import TEMPERATURE_FIRST, chain_distribution, check_chain
from .eog import merge_eog
from .near_ties import within_tolerance
from .report import DEFAULT_THRESHOLD, DEFAULT_TIE_TOLERANCE, AuditReport
from .samples import EOG_WARNING, TEXT_WARNING, AuditInputError, GeneratedSequence
from .target import TargetModel

__all__ = ["audit_sequences", "AuditSession"]

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
    tie_tolerance: float = DEFAULT_TIE_TOLERANCE,
    min_expected: float = MIN_EXPECTED,
    grammar: Any = None,
) -> AuditReport:
    """Audit ``sequences`` against the target's distributions under ``params`` and ``chain``.

    ``target`` is a GGUF path or an open :class:`TargetModel`.  Each
    emitted position's distribution comes from one batched pass over the
    sequence; the report pools every position of every sequence.
    ``threshold`` is the verdict's p-value threshold, and 1 − ``threshold``
    the TV interval's confidence level.  With a ``grammar`` (a
    ``constraints.Grammar`` or a JSON schema) the sequences were generated
    under it, and each position's distribution is the target's masked by
    the grammar's allowed set there, mask first (docs/math.md §11).
    """
    _check_args(params, chain, threshold, tie_tolerance)
    if not sequences:
        raise ValueError("no sequences to audit")
    session = AuditSession(target, params, chain=chain, threshold=threshold, tie_tolerance=tie_tolerance,
                           min_expected=min_expected, grammar=grammar)
    try:
        session.add(list(sequences))
        return session.report()
    finally:
        session.close()


def _check_args(params: SamplingParams, chain: str, threshold: float, tie_tolerance: float) -> None:
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    check_chain(chain)
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), got {threshold}")
    if not tie_tolerance >= 0.0:
        raise ValueError(f"tie_tolerance must be >= 0, got {tie_tolerance}")


class AuditSession:
    """An audit fed in batches: :meth:`add` scores sequences into one pool,
    :meth:`report` reports over everything added so far.

    For generating until enough positions are audited (the informative share
    of the positions is only known once they are scored)::

        with AuditSession(target, params) as session:
            while session.tokens < 20000:
                session.add(more_sequences())
            report = session.report()

    Arguments are those of :func:`audit_sequences`, which is one ``add``
    followed by ``report``.  Sequences are numbered across batches (the
    ``sequence`` of a mismatch counts from the first sequence ever added).
    """

    def __init__(self, target: Union[str, TargetModel], params: SamplingParams, *,
                 chain: str = TEMPERATURE_FIRST, threshold: float = DEFAULT_THRESHOLD,
                 tie_tolerance: float = DEFAULT_TIE_TOLERANCE, min_expected: float = MIN_EXPECTED,
                 grammar: Any = None) -> None:
        _check_args(params, chain, threshold, tie_tolerance)
        self.model = target if isinstance(target, TargetModel) else TargetModel(target)
        self._own = self.model is not target
        self._grammar = None if grammar is None else self.model.compiled_grammar(grammar)
        self.params = params
        self.chain = chain
        self.threshold = threshold
        self.tie_tolerance = tie_tolerance
        self.min_expected = min_expected
        self.accumulator = AuditAccumulator()
        self.sequences = 0
        self.stopped = 0
        self.positions = 0
        self.text_sequences = 0
        self.eog_sequences = 0  # sequences holding an EOG id among their emitted tokens

    @property
    def tokens(self) -> int:
        """Informative positions pooled so far (what the report calls ``tokens``)."""
        return self.accumulator.tokens

    def add(self, sequences: Sequence[GeneratedSequence]) -> None:
        """Score ``sequences`` (each in one batched pass of the target) into the pool."""
        model = self.model
        prepared = [(model.prompt_ids(s), model.emitted_ids(s), s.stopped) for s in sequences]
        if any(stopped for _, _, stopped in prepared) and not model.eog_ids:
            first_stopped = next(s for s in sequences if s.stopped)
            at = f"{first_stopped.source}: " if first_stopped.source else ""
            raise AuditInputError(f"{at}'stopped' is true but {model.path} has no end-of-generation token")
        if not prepared:
            return
        acc = self.accumulator
        n_ctx = max(len(p) + len(e) for p, e, _ in prepared)
        eog_rep = model.eog_ids[0] if model.eog_ids else -1
        for offset, ((prompt, emitted, stopped), seq) in enumerate(zip(prepared, sequences)):
            outcomes = np.asarray(list(emitted) + ([eog_rep] if stopped else []), dtype=np.int64)
            self.positions += outcomes.size
            allowed = self._allowed(emitted, stopped, seq)
            for first, logits in model.rows(prompt, emitted, stopped, n_ctx):
                for lo in range(0, logits.shape[0], _ROWS_PER_BLOCK):
                    block = logits[lo:lo + _ROWS_PER_BLOCK]
                    where = np.arange(first + lo, first + lo + block.shape[0])
                    if allowed is not None:
                        block = np.where(allowed[where], block, -np.inf).astype(block.dtype)
                    probs = chain_distribution(block, self.params, self.chain)
                    probs, outs, merged_logits = merge_eog(probs, outcomes[where], model.eog_ids, block)
                    assert merged_logits is not None  # logits given, logits returned
                    acc.add(probs, outs, logits=merged_logits, sequence=self.sequences + offset, positions=where,
                            source=seq.source or None, near_tie=self._near_tie(merged_logits, outs))
        self.sequences += len(prepared)
        self.stopped += sum(stopped for _, _, stopped in prepared)
        self.text_sequences += sum(s.text is not None for s in sequences)
        eog = set(model.eog_ids)
        self.eog_sequences += sum(not eog.isdisjoint(e) for _, e, _ in prepared)

    def _allowed(self, emitted: List[int], stopped: bool, seq: GeneratedSequence) -> Optional[np.ndarray]:
        """The grammar's allowed set at every audited position (rows, V) bool,
        or None without a grammar; a token the grammar does not allow where it
        was emitted is an input error naming it."""
        if self._grammar is None:
            return None
        from ..constraints import bitmask

        state = self._grammar.new_state()
        n_vocab = self.model.n_vocab
        rows = np.zeros((len(emitted) + int(stopped), n_vocab), dtype=bool)
        for i, t in enumerate(emitted):
            rows[i] = bitmask.to_bool(state.mask(), n_vocab)
            if not rows[i, t] or state.consume([t]) != 1:
                where = f"{seq.source}: " if seq.source else ""
                raise AuditInputError(f"{where}token {t} at position {i} is not allowed by the "
                                      f"{self._grammar.grammar.what}")
        if stopped:
            rows[-1] = bitmask.to_bool(state.mask(), n_vocab)
        return rows

    def _near_tie(self, logits: np.ndarray, outcomes: np.ndarray) -> Callable[[int], bool]:
        def test(i: int) -> bool:
            return within_tolerance(logits[i], int(outcomes[i]), self.params, self.chain, self.tie_tolerance)
        return test

    def report(self) -> AuditReport:
        """The report over every sequence added so far."""
        acc = self.accumulator
        warnings: List[str] = []
        if self.text_sequences:
            warnings.append(TEXT_WARNING.format(n=self.text_sequences, total=self.sequences))
        if self.eog_sequences:
            warnings.append(EOG_WARNING.format(n=self.eog_sequences, total=self.sequences))
        return AuditReport(
            target=self.model.path, params=self.params, chain=self.chain, sequences=self.sequences,
            stopped=self.stopped, positions=self.positions, point_mass=acc.point_mass,
            statistics=acc.statistics(1.0 - self.threshold, self.min_expected),
            mismatches=list(acc.mismatches), impossible=list(acc.impossible),
            tie_tolerance=self.tie_tolerance, threshold=self.threshold, warnings=warnings,
        )

    def close(self) -> None:
        """Close the target model when this session opened it."""
        if self._own:
            self.model.close()

    def __enter__(self) -> "AuditSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
