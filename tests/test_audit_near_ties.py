"""The audit's near-tie test at the edge of the support (audit/near_ties.py)."""

from __future__ import annotations

import numpy as np
import pytest

from specdec_cpu import SamplingParams
from specdec_cpu.audit import AuditAccumulator, GeneratedSequence, audit_sequences
from specdec_cpu.audit.chains import TEMPERATURE_FIRST, TEMPERATURE_LAST, chain_distribution
from specdec_cpu.audit.near_ties import within_tolerance
from specdec_cpu.audit.target import TargetModel

TOL = 0.05


def _row_with_mass_ahead(mass_ahead: float, t: float, n: int = 50) -> tuple[np.ndarray, int]:
    """A row whose token 1 holds ``mass_ahead`` of the probability at temperature t
    and token 2 is next; the rest share the remainder."""
    p = np.full(n, (1.0 - mass_ahead) / (n - 1) * 0.999)
    p[1] = mass_ahead
    p[2] = (1.0 - mass_ahead) / (n - 1) * 1.05  # clearly ahead of the tail
    p /= p.sum()
    return (t * np.log(p)).astype(np.float32), 2


@pytest.mark.parametrize("chain", [TEMPERATURE_FIRST, TEMPERATURE_LAST])
def test_a_token_just_past_the_top_p_cut_is_a_near_tie_and_one_far_past_it_is_not(chain):
    params = SamplingParams(temperature=0.7, top_p=0.95)
    for mass, near in ((0.9504, True), (0.9515, True), (0.96, False), (0.99, False)):
        logits, x = _row_with_mass_ahead(mass, 1.0 if chain == TEMPERATURE_LAST else 0.7)
        p = chain_distribution(logits, params, chain)
        assert np.count_nonzero(p) == 1 and p[x] == 0  # a one-token nucleus: x is outside it
        assert within_tolerance(logits, x, params, chain, TOL) is near, mass
        assert within_tolerance(logits, x, params, chain, 0.0) is False


def test_two_nearly_equal_logits_at_the_edge_swap_within_the_tolerance():
    # The audit's real case: the 8th and 9th tokens 0.006 apart, the nucleus ending at the 8th.
    # Its probabilities: the 7th and 8th are the 8th and 9th tokens of the nucleus's order.
    head = [0.4739, 0.2342, 0.0868, 0.0607, 0.0437, 0.0347, 0.0147, 0.0084, 0.0084, 0.0065]
    p0 = np.array(head + [(1.0 - sum(head)) / 100] * 100)
    logits = (0.7 * np.log(p0)).astype(np.float32)
    logits[8] = logits[7] - 0.006
    params = SamplingParams(temperature=0.7, top_p=0.95)
    p = chain_distribution(logits, params)
    assert np.flatnonzero(p).tolist() == list(range(8))  # mass ahead of the 9th: 0.957
    assert within_tolerance(logits, 8, params, TEMPERATURE_FIRST, TOL)
    assert not within_tolerance(logits, 8, params, TEMPERATURE_FIRST, 0.005)  # less than the 0.006 gap
    assert not within_tolerance(logits, 9, params, TEMPERATURE_FIRST, TOL)  # 0.18 logits behind


def test_top_k_min_p_and_greedy_edges():
    logits = np.array([3.0, 2.0, 1.0, 0.98, 0.5, -1.0], dtype=np.float32)
    top_k = SamplingParams(temperature=1.0, top_k=3)
    assert within_tolerance(logits, 3, top_k, TEMPERATURE_FIRST, TOL)  # 0.02 behind the 3rd
    assert not within_tolerance(logits, 4, top_k, TEMPERATURE_FIRST, TOL)
    min_p = SamplingParams(temperature=1.0, min_p=float(np.exp(-2.4)))  # keeps logits >= 0.6
    kept = chain_distribution(logits, min_p)
    assert kept[3] > 0 and kept[4] == 0
    assert not within_tolerance(logits, 4, min_p, TEMPERATURE_FIRST, TOL)  # 0.1 short
    assert within_tolerance(logits, 4, SamplingParams(temperature=1.0, min_p=float(np.exp(-2.47))),
                            TEMPERATURE_FIRST, TOL)  # 0.03 short
    greedy = SamplingParams(temperature=0.0)
    for gap in (0.0, 0.01, 0.049, 0.051, 0.7):  # greedy: the old rule, logit gap <= tolerance
        row = np.array([1.0, 1.0 - gap, -5.0], dtype=np.float32)
        assert within_tolerance(row, 1, greedy, TEMPERATURE_FIRST, TOL) is (gap <= TOL), gap
    assert not within_tolerance(np.array([0.0, -np.inf], dtype=np.float32), 1, greedy, TEMPERATURE_FIRST, TOL)


def test_the_accumulator_asks_only_for_outcomes_outside_the_support():
    asked = []

    def near(i):
        asked.append(i)
        return i == 1

    acc = AuditAccumulator()
    probs = np.array([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.0, 1.0, 0.0]])
    acc.add(probs, [0, 2, 2, 0], sequence=3, positions=[5, 6, 7, 8], source="f.jsonl:4", near_tie=near)
    assert sorted(asked) == [1, 2, 3]  # row 0's outcome is inside its support
    assert [(m.position, m.near_tie, m.source) for m in acc.impossible] == [(6, True, "f.jsonl:4"),
                                                                            (7, False, "f.jsonl:4")]
    (m,) = acc.mismatches
    assert (m.position, m.expected, m.near_tie) == (8, 1, False)


def test_an_audit_marks_a_token_just_past_the_top_p_cut_as_a_near_tie(tiny_target):
    """Through the whole audit (the tiny model's real row): top-p set just below
    the mass ahead of the emitted token leaves it outside by rounding's width (a
    near tie, the verdict passes); set further below, it is a real failure."""
    seq = GeneratedSequence(prompt="hello", tokens=[0])
    with TargetModel(tiny_target, n_threads=1) as model:
        ((_, logits),) = list(model.rows(model.prompt_ids(seq), [0], False, 16))
        p = chain_distribution(logits[0], SamplingParams(temperature=1.0))
        order = np.argsort(-p, kind="stable")
        x = int(order[3])
        ahead = float(p[order[:3]].sum())
        # Moving logit differences by 0.05 moves the mass ahead by about ahead·(1 − ahead)·0.05.
        width = ahead * (1.0 - ahead) * 0.05
        assert ahead - 3 * width > p[order[0]]  # the far cut still keeps more than one token
        sample = GeneratedSequence(prompt="hello", tokens=[x])
        for cut, near in ((ahead - 0.2 * width, True), (ahead - 3 * width, False)):
            report = audit_sequences(model, [sample], SamplingParams(temperature=1.0, top_p=cut))
            (m,) = report.impossible
            assert (m.token, m.near_tie) == (x, near), cut
            assert report.verdict == ("pass" if near else "fail")
