"""Statistical helpers shared by the exactness tests.

``assert_matches_distribution`` is a chi-square goodness-of-fit check whose
threshold a correct sampler fails less than once in a million runs (the
default ``alpha``).  Together with fixed seeds this makes the exactness tests
deterministic in practice while still catching any real bias: a wrong
residual, a wrong acceptance rule or an off-by-one in a support typically
moves the statistic by thousands of standard deviations at the sample sizes
used here.

``expected_distribution`` is an independent float64 numpy statement of the
sampling pipeline (temperature -> top-k -> top-p -> min-p -> normalise, ties
towards the lower token id) used to compute what the samplers must produce.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np
from scipy import stats

__all__ = [
    "assert_matches_distribution",
    "assert_binomial",
    "chi_square_pvalue",
    "expected_distribution",
    "ranked_ids",
]


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray, *, min_expected: float = 5.0):
    """Pearson chi-square p-value of ``counts`` against ``probs``.

    Bins whose expected count is below ``min_expected`` are pooled into one
    bin; a pooled bin that is still too small is merged into the smallest
    regular bin.  Only bins with ``probs > 0`` take part (an impossible
    outcome is checked separately).  Returns ``(pvalue, statistic, dof,
    table)`` where ``table`` lists ``(label, observed, expected)`` per bin
    after pooling; the p-value is 1.0 when fewer than two bins remain.
    """
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    if counts.shape != probs.shape:
        raise ValueError(f"counts {counts.shape} and probs {probs.shape} differ in shape")
    n = counts.sum()
    live = probs > 0
    p = probs[live] / probs[live].sum()
    obs = counts[live]
    labels = np.flatnonzero(live)
    exp = n * p

    big = exp >= min_expected
    table = [(str(int(lab)), o, e) for lab, o, e in zip(labels[big], obs[big], exp[big])]
    small_obs, small_exp = obs[~big].sum(), exp[~big].sum()
    if (~big).any():
        pooled_label = f"pooled({int((~big).sum())} ids)"
        if small_exp >= min_expected or not table:
            table.append((pooled_label, small_obs, small_exp))
        else:
            # Merge the under-filled pool into the smallest regular bin.
            j = min(range(len(table)), key=lambda i: table[i][2])
            lab, o, e = table[j]
            table[j] = (f"{lab}+{pooled_label}", o + small_obs, e + small_exp)
    if len(table) < 2:
        return 1.0, 0.0, 0, table
    f_obs = np.array([t[1] for t in table])
    f_exp = np.array([t[2] for t in table])
    stat, pvalue = stats.chisquare(f_obs, f_exp)
    return float(pvalue), float(stat), len(table) - 1, table


def assert_matches_distribution(
    counts: np.ndarray,
    probs: np.ndarray,
    *,
    alpha: float = 1e-6,
    what: str = "samples",
) -> None:
    """Fail unless ``counts`` look like independent draws from ``probs``.

    ``counts[i]`` is how often outcome ``i`` occurred, ``probs`` the exact
    distribution (any shape; both are flattened, so a joint distribution over
    pairs can be passed as a matrix).  Fails at once if an outcome with
    probability 0 occurred, and otherwise when the chi-square p-value is
    below ``alpha`` (default 1e-6: a correct sampler fails less than once in
    a million runs).  The message shows the bins that deviate most.
    """
    counts = np.asarray(counts)
    probs = np.asarray(probs, dtype=np.float64)
    shape = probs.shape
    c = counts.ravel()
    pr = probs.ravel()
    assert c.shape == pr.shape, f"counts shape {counts.shape} != probs shape {shape}"
    assert np.all(pr >= 0) and abs(pr.sum() - 1.0) < 1e-6, f"probs is not a distribution (sum {pr.sum()})"

    impossible = np.flatnonzero((pr == 0) & (c > 0))
    if impossible.size:
        where = [_label(i, shape) for i in impossible[:10]]
        raise AssertionError(
            f"{what}: {int(c[impossible].sum())} draws of outcomes with probability 0: "
            + ", ".join(f"{w} x{int(c[i])}" for w, i in zip(where, impossible[:10]))
        )

    pvalue, stat, dof, table = chi_square_pvalue(c, pr)
    if pvalue < alpha:
        n = c.sum()
        z = [((o - e) / np.sqrt(e), lab, o, e) for lab, o, e in table]
        z.sort(key=lambda t: -abs(t[0]))
        lines = [
            f"  bin {_pretty(lab, shape)}: observed {int(o)}, expected {e:.1f} (z = {zz:+.1f})"
            for zz, lab, o, e in z[:8]
        ]
        raise AssertionError(
            f"{what} do not follow the expected distribution: chi2 = {stat:.1f} on {dof} dof, "
            f"p = {pvalue:.3g} < {alpha:g} (n = {int(n)})\nworst bins:\n" + "\n".join(lines)
        )


def assert_binomial(successes: int, trials: int, prob: float, *, alpha: float = 1e-6, what: str = "rate") -> None:
    """Fail unless ``successes`` out of ``trials`` is consistent with ``prob``."""
    if prob <= 0.0 or prob >= 1.0:
        expected = 0 if prob <= 0.0 else trials
        assert successes == expected, f"{what}: {successes}/{trials} but the probability is exactly {prob}"
        return
    pvalue = stats.binomtest(int(successes), int(trials), float(prob)).pvalue
    assert pvalue >= alpha, (
        f"{what}: {successes}/{trials} = {successes / trials:.5f}, expected {prob:.5f} "
        f"(binomial p = {pvalue:.3g} < {alpha:g})"
    )


def _label(flat_index: int, shape: Sequence[int]) -> str:
    if len(shape) <= 1:
        return f"id {flat_index}"
    return "ids " + str(tuple(int(i) for i in np.unravel_index(flat_index, shape)))


def _pretty(label: str, shape: Sequence[int]) -> str:
    if label.isdigit():
        return _label(int(label), shape)
    return label


# ---------------------------------------------------------------------------
# An independent reference of the sampling pipeline (float64, by sorting).
# ---------------------------------------------------------------------------


def ranked_ids(logits: np.ndarray) -> np.ndarray:
    """Token ids by descending logit, ties towards the lower id."""
    x = np.asarray(logits, dtype=np.float64)
    # lexsort sorts by the last key first: primary key -x, secondary the id.
    return np.lexsort((np.arange(x.size), -x))


def expected_distribution(
    logits: np.ndarray,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    params: Optional[object] = None,
) -> np.ndarray:
    """The exact sampling distribution of one logits row, in float64.

    ``params`` (a SamplingParams) overrides the keyword knobs when given.
    Greedy (temperature 0 or top_k 1) is a one-hot at the argmax, lowest id
    on ties.  Needs at least one finite logit.
    """
    if params is not None:
        temperature, top_k, top_p, min_p = params.temperature, params.top_k, params.top_p, params.min_p
    x = np.asarray(logits, dtype=np.float64).ravel()
    v = x.size
    order = ranked_ids(x)
    out = np.zeros(v)
    if not np.isfinite(x[order[0]]):
        raise ValueError("the reference needs at least one finite logit")
    if temperature == 0.0 or top_k == 1:
        out[order[0]] = 1.0
        return out
    # temperature -> softmax over the ranked row (stable: subtract the max first)
    z = (x[order] - x[order[0]]) / temperature
    w = np.exp(z)  # -inf logits give exactly 0
    keep = w > 0
    # top-k
    if 0 < top_k < v:
        keep[top_k:] = False
    # top-p: the smallest ranked prefix whose mass reaches top_p
    if top_p < 1.0:
        m = np.where(keep, w, 0.0)
        m = m / m.sum()
        before = np.concatenate(([0.0], np.cumsum(m)[:-1]))
        keep &= before < top_p
    # min-p: relative to the largest kept probability (the first ranked token)
    if min_p > 0.0:
        keep &= w >= min_p * w[0]
    m = np.where(keep, w, 0.0)
    out[order] = m / m.sum()
    return out


@dataclass
class OutcomeTally:
    """How often each outcome of a law came out of ``n`` generations, and
    what the speculation did meanwhile (summed ``GenerationStats``)."""

    counts: np.ndarray
    probs: np.ndarray
    forced: int = 0
    drafted: int = 0
    accepted: int = 0
    longest: int = 0  # the largest γ of a step


def tally_outcomes(generate: Callable[[], Any], law: Dict[Tuple, float], n: int,
                   outcome: Callable[[Any], Tuple]) -> OutcomeTally:
    """Call ``generate`` ``n`` times and count ``outcome(generation)`` over
    the cells of ``law`` (outcome -> exact probability); an outcome outside
    them fails at once."""
    cells = sorted(law)
    index = {c: i for i, c in enumerate(cells)}
    tally = OutcomeTally(np.zeros(len(cells)), np.array([law[c] for c in cells]))
    for _ in range(n):
        gen = generate()
        key = outcome(gen)
        assert key in index, f"{key} is outside the law's support"
        tally.counts[index[key]] += 1
        s = gen.stats
        tally.forced, tally.drafted, tally.accepted = (tally.forced + s.forced, tally.drafted + s.drafted,
                                                       tally.accepted + s.accepted)
        tally.longest = max(tally.longest, max(s.gammas))
    return tally
