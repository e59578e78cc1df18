"""Property tests of the sampling kernels (hypothesis), on every ISA path.

Random rows (1..300 ids, -inf entries, ties, large magnitudes) and random
valid parameters: the kernels must give proper distributions with the same
support as an independent float64 reference, sample only inside it, verify
within its contract, and reject bad input with TypeError/ValueError instead
of crashing.

The reference decides truncation in float64, the kernels in float32.  Where
a top-p or min-p decision sits within rounding of its threshold, or a cut
falls between two distinct logits whose weights exp((x - max) / T) round to
the same float32 value (a float32 kernel then sees a tie and breaks it by
id), the example is skipped (``assume``) rather than calling either answer
wrong; see ``ambiguous``.  Exact ties are never skipped: they must break
towards the lower id.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from stats_helpers import expected_distribution, ranked_ids

from specdec_cpu import SamplingParams, sampling
from specdec_cpu.sampling import DRAFT_STREAM, VERIFY_STREAM, Rng

# SPECDEC_PROPERTY_EXAMPLES=5000 for a long bug hunt; the default keeps the file fast.
PROPS = settings(
    max_examples=int(os.environ.get("SPECDEC_PROPERTY_EXAMPLES", "120")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# --------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------

finite_logit = st.one_of(
    st.floats(-30, 30, width=32),
    st.floats(-1e4, 1e4, width=32),
    st.sampled_from([0.0, 1.0, -1.0, 5.0]),  # repeated values make exact ties
)
logit = st.one_of(finite_logit, finite_logit, finite_logit, st.just(-np.inf))


@st.composite
def rows(draw, min_v=1, max_v=300, n_rows=None):
    """float32 logits ``(V,)`` or ``(n_rows, V)``, each row with a finite entry,
    sometimes placed at a misaligned address."""
    v = draw(st.integers(min_v, max_v))
    shape = (v,) if n_rows is None else (n_rows, v)
    x = draw(hnp.arrays(np.float32, shape, elements=logit))
    x = np.atleast_2d(x)
    for r in range(x.shape[0]):
        if not np.isfinite(x[r]).any():
            x[r, draw(st.integers(0, v - 1))] = draw(finite_logit)
    x = x.reshape(shape)
    offset = draw(st.integers(0, 3))  # misaligned start (by whole floats), still contiguous
    buf = np.empty(x.size + offset, dtype=np.float32)
    out = buf[offset:].reshape(shape)
    out[...] = x
    return out


@st.composite
def params_for(draw, v):
    t = draw(st.one_of(st.just(0.0), st.floats(0.0, 5.0), st.floats(0.05, 2.0)))
    top_k = draw(st.one_of(st.just(0), st.integers(1, v + 3)))
    top_p = draw(st.one_of(st.just(1.0), st.floats(0.0, 1.0, exclude_min=True)))
    min_p = draw(st.one_of(st.just(0.0), st.floats(0.0, 1.0, exclude_max=True)))
    return SamplingParams(temperature=t, top_k=top_k, top_p=top_p, min_p=min_p)


# --------------------------------------------------------------------------
# Reference with an "is this decision within rounding?" flag
# --------------------------------------------------------------------------

TOL = 1e-4


def ambiguous(logits: np.ndarray, params: SamplingParams) -> bool:
    """True when float32 rounding could legitimately flip a truncation decision.

    Three cases: (1) a top-p prefix mass or a min-p ratio within ``TOL`` of
    its threshold; (2) a kept and a dropped token whose *distinct* logits give
    weights exp((x - max) / T) within float32 rounding of each other (a
    float32 kernel may see them as a tie and break it by id); (3) the cut
    falls among weights so small that float32 holds them coarsely or not at
    all.  Exact ties are not ambiguous.
    """
    x = np.asarray(logits, dtype=np.float64)
    t = params.temperature
    if t == 0.0 or params.top_k == 1:
        return False
    if t < 1e-30:
        return True  # 1/T overflows float32: outside what a float32 kernel can state
    order = ranked_ids(x)
    xs = x[order]
    w = np.exp((xs - xs[0]) / t)
    v = x.size
    live = int((w > 0).sum())
    kept = min(params.top_k, live) if 0 < params.top_k < v else live
    if params.top_p < 1.0:
        c = np.cumsum(w[:kept] / w[:kept].sum())
        j = min(int(np.searchsorted(c, params.top_p)), kept - 1)  # first index with c >= top_p
        for i in (j - 1, j, j + 1):
            if 0 <= i < kept and abs(c[i] - params.top_p) < TOL:
                return True
        kept = j + 1
    if params.min_p > 0.0:
        if np.any(np.abs(w[:kept] - params.min_p) < TOL * params.min_p):
            return True
        kept = int((w[:kept] >= params.min_p).sum())
    if kept < v and w[kept] > 0:
        low, high = w[kept - 1], w[kept]  # smallest kept, largest dropped weight
        if low < 1e-30:
            return True
        near = np.concatenate([xs[:kept][w[:kept] <= high * (1 + 1e-6)], xs[kept:][w[kept:] >= low * (1 - 1e-6)]])
        if near.size and np.unique(near).size > 1:
            return True
    return False


def check_row_against_reference(p: np.ndarray, logits: np.ndarray, params: SamplingParams) -> None:
    v = logits.size
    assert p.dtype == np.float32 and p.shape == (v,)
    assert np.all(p >= 0), "negative probability"
    assert abs(float(p.astype(np.float64).sum()) - 1.0) < 1e-5, f"row sums to {p.sum()}"
    ref = expected_distribution(logits, params=params)
    top = int(ranked_ids(logits)[0])
    assert p[top] > 0, f"the argmax {top} is not in the support"
    support, ref_support = p > 0, ref > 0
    extra = np.flatnonzero(support & ~ref_support)
    assert extra.size == 0, f"ids {extra[:10].tolist()} kept but the reference drops them"
    missing = np.flatnonzero(ref_support & ~support & (ref > 1e-20))
    assert missing.size == 0, f"ids {missing[:10].tolist()} dropped but the reference keeps them ({ref[missing[:5]]})"
    np.testing.assert_allclose(p, ref, rtol=1e-3, atol=2e-6)


# --------------------------------------------------------------------------
# distribution / sample
# --------------------------------------------------------------------------


@PROPS
@given(data=st.data())
def test_distribution_matches_reference(isa, data):
    logits = data.draw(rows())
    params = data.draw(params_for(logits.size))
    assume(not ambiguous(logits, params))
    p = sampling.distribution(logits, params)
    check_row_against_reference(p, logits, params)
    if params.greedy:
        assert p[int(ranked_ids(logits)[0])] == 1.0


@settings(PROPS, max_examples=max(10, PROPS.max_examples // 4))
@given(
    v=st.sampled_from([257, 1000, 4099, 32_000, 151_936]),
    seed=st.integers(0, 2**32 - 1),
    scale=st.sampled_from([0.5, 3.0, 12.0]),
    masked=st.floats(0.0, 0.9),
    data=st.data(),
)
def test_distribution_matches_reference_on_vocabulary_sized_rows(isa, v, seed, scale, masked, data):
    """Real vocabulary sizes take the selection paths (many candidates, several radix levels)."""
    g = np.random.default_rng(seed)
    logits = (g.normal(size=v) * scale).astype(np.float32)
    logits[g.random(v) < masked] = -np.inf
    logits[g.integers(v)] = np.float32(scale)  # at least one finite entry
    params = data.draw(params_for(min(v, 300)))
    assume(not ambiguous(logits, params))
    check_row_against_reference(sampling.distribution(logits, params), logits, params)
    tok = sampling.sample(logits, params, Rng(seed))
    assert expected_distribution(logits, params=params)[tok] > 0


@PROPS
@given(data=st.data())
def test_distribution_of_rows_is_rowwise(isa, data):
    n = data.draw(st.integers(1, 4))
    logits = data.draw(rows(max_v=120, n_rows=n))
    params = data.draw(params_for(logits.shape[1]))
    p = sampling.distribution(logits, params)
    assert p.shape == logits.shape and p.dtype == np.float32
    for r in range(n):
        np.testing.assert_allclose(p[r], sampling.distribution(np.ascontiguousarray(logits[r]), params), atol=1e-7)
        if not ambiguous(logits[r], params):
            check_row_against_reference(p[r], logits[r], params)


@PROPS
@given(data=st.data(), seed=st.integers(0, 2**64 - 1))
def test_sample_stays_in_the_support(isa, data, seed):
    logits = data.draw(rows())
    params = data.draw(params_for(logits.size))
    p = sampling.distribution(logits, params)
    rng = Rng(seed, DRAFT_STREAM)
    out = np.empty(logits.size, dtype=np.float32)
    for _ in range(5):
        tok = sampling.sample(logits, params, rng)
        assert isinstance(tok, int) and 0 <= tok < logits.size
        assert p[tok] > 0, f"sampled id {tok} has probability 0"
        tok = sampling.sample_into(logits, params, rng, out)
        assert 0 <= tok < logits.size and out[tok] > 0
        np.testing.assert_array_equal(out, p)


@given(seed=st.integers(0, 2**64 - 1), stream=st.integers(0, 7))
@settings(max_examples=30, deadline=None)
def test_rng_is_reproducible_and_streams_differ(seed, stream):
    logits = np.zeros(1000, dtype=np.float32)
    params = SamplingParams()
    a = [sampling.sample(logits, params, Rng(seed, stream)) for _ in range(3)]
    r1, r2, other = Rng(seed, stream), Rng(seed, stream), Rng(seed, stream + 1)
    s1 = [sampling.sample(logits, params, r1) for _ in range(20)]
    s2 = [sampling.sample(logits, params, r2) for _ in range(20)]
    s3 = [sampling.sample(logits, params, other) for _ in range(20)]
    assert s1 == s2, "same (seed, stream) must reproduce the same draws"
    assert s1 != s3, "different streams must not share draws"
    assert len(set(s1)) > 10, "a generator should move on between draws"
    assert a == [s1[0]] * 3


# --------------------------------------------------------------------------
# acceptance_rate
# --------------------------------------------------------------------------


@PROPS
@given(data=st.data())
def test_acceptance_rate_properties(isa, data):
    both = data.draw(rows(n_rows=2))
    params = data.draw(params_for(both.shape[1]))
    p = sampling.distribution(np.ascontiguousarray(both[0]), params)
    q = sampling.distribution(np.ascontiguousarray(both[1]), params)
    a = sampling.acceptance_rate(p, q)
    assert 0.0 <= a <= 1.0 + 1e-6
    assert a == pytest.approx(sampling.acceptance_rate(q, p), abs=1e-6)
    assert a == pytest.approx(float(np.minimum(p.astype(np.float64), q).sum()), abs=1e-5)
    assert sampling.acceptance_rate(p, p) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("t,expected", [(0.0, 1.00), (0.5, 0.97), (1.0, 0.94)])
def test_seed_toy_case_acceptance(isa, t, expected):
    """Target logits (2, 0), draft logits (1.5, 0)."""
    params = SamplingParams(temperature=t)
    p = sampling.distribution(np.array([2.0, 0.0], dtype=np.float32), params)
    q = sampling.distribution(np.array([1.5, 0.0], dtype=np.float32), params)
    assert round(sampling.acceptance_rate(p, q), 2) == expected


# --------------------------------------------------------------------------
# verify
# --------------------------------------------------------------------------


@PROPS
@given(data=st.data(), seed=st.integers(0, 2**64 - 1), one_hot=st.booleans())
def test_verify_contract(isa, data, seed, one_hot):
    gamma = data.draw(st.integers(1, 4))
    target = data.draw(rows(max_v=200, n_rows=gamma + 1))
    v = target.shape[1]
    draft = data.draw(hnp.arrays(np.float32, (gamma, v), elements=finite_logit))
    params = data.draw(params_for(v))
    q = np.zeros((gamma, v), dtype=np.float32)
    rng_d = Rng(seed, DRAFT_STREAM)
    tokens = np.array(
        [sampling.sample_into(np.ascontiguousarray(draft[j]), params, rng_d, q[j]) for j in range(gamma)],
        dtype=np.int32,
    )
    res = sampling.verify(target, tokens, None if one_hot else q, params, Rng(seed, VERIFY_STREAM))
    assert isinstance(res.n_accepted, int) and 0 <= res.n_accepted <= gamma
    assert isinstance(res.token, int) and 0 <= res.token < v
    n_rows = gamma if res.n_accepted == gamma else res.n_accepted + 1
    alphas = np.asarray(res.alphas)
    assert alphas.shape == (n_rows,), f"alphas {alphas} for n_accepted={res.n_accepted}, γ={gamma}"
    assert np.all((alphas >= 0) & (alphas <= 1 + 1e-6))
    p_rows = sampling.distribution(target, params)
    q_rows = np.eye(v, dtype=np.float32)[tokens] if one_hot else q
    for r in range(n_rows):
        assert alphas[r] == pytest.approx(sampling.acceptance_rate(p_rows[r], q_rows[r]), abs=1e-5)
    # accepted draft tokens are possible under the target; the emitted one too
    for r in range(res.n_accepted):
        assert p_rows[r, tokens[r]] > 0, f"accepted token {tokens[r]} has p = 0 in row {r}"
    assert p_rows[res.n_accepted, res.token] > 0, (
        f"emitted token {res.token} has p = 0 in row {res.n_accepted}"
    )
    if res.n_accepted < gamma:
        if one_hot:
            # the residual of a one-hot draft never re-emits the rejected token
            # (unless it is the only token left, p(x) = 1, which is never rejected)
            assert res.token != tokens[res.n_accepted]
    # reproducible from the seed
    again = sampling.verify(target, tokens, None if one_hot else q, params, Rng(seed, VERIFY_STREAM))
    assert (again.n_accepted, again.token) == (res.n_accepted, res.token)


# --------------------------------------------------------------------------
# Bad input: TypeError / ValueError, never a crash or a silent copy
# --------------------------------------------------------------------------

P = SamplingParams()
GOOD = np.linspace(-1, 1, 16, dtype=np.float32)


def _bad_logits():
    return {
        "float64": GOOD.astype(np.float64),
        "float16": GOOD.astype(np.float16),
        "int32": np.arange(16, dtype=np.int32),
        "strided": np.zeros(32, dtype=np.float32)[::2],
        "fortran-2d": np.asfortranarray(np.zeros((3, 16), np.float32)),
        "3d": np.zeros((2, 2, 4), dtype=np.float32),
        "empty": np.zeros(0, dtype=np.float32),
        "nan": np.array([0.0, np.nan, 1.0], dtype=np.float32),
        "+inf": np.array([0.0, np.inf, 1.0], dtype=np.float32),
        "all -inf": np.full(4, -np.inf, dtype=np.float32),
    }


@pytest.mark.parametrize("case", list(_bad_logits()))
def test_bad_logits_raise(isa, case):
    x = _bad_logits()[case]
    rng = Rng(0)
    with pytest.raises((TypeError, ValueError)):
        sampling.distribution(x, P)
    with pytest.raises((TypeError, ValueError)):
        sampling.sample(x, P, rng)
    with pytest.raises((TypeError, ValueError)):
        sampling.sample_into(x, P, rng, np.zeros(64, dtype=np.float32))


def test_nan_message_names_the_row():
    x = np.zeros((3, 8), dtype=np.float32)
    x[2, 5] = np.nan
    with pytest.raises(ValueError, match="2"):
        sampling.distribution(x, P)
    toks = np.array([1, 2], dtype=np.int32)
    q = np.full((2, 8), 1 / 8, dtype=np.float32)
    x[2, 5] = 0.0
    x[0, 3] = np.nan
    with pytest.raises(ValueError, match="(?i)nan"):
        sampling.verify(x, toks, q, P, Rng(0))


@PROPS
@given(data=st.data())
def test_nan_anywhere_raises(isa, data):
    logits = data.draw(rows(max_v=100))
    logits[data.draw(st.integers(0, logits.size - 1))] = np.nan
    params = data.draw(params_for(logits.size))
    with pytest.raises(ValueError):
        sampling.distribution(logits, params)
    with pytest.raises(ValueError):
        sampling.sample(logits, params, Rng(1))


def _verify_inputs(v=8, gamma=2):
    target = np.zeros((gamma + 1, v), dtype=np.float32)
    toks = np.arange(gamma, dtype=np.int32)
    q = np.full((gamma, v), 1.0 / v, dtype=np.float32)
    return target, toks, q


def _bad_verify_cases():
    t, k, q = _verify_inputs()
    qz = q.copy()
    qz[1, 1] = 0.0  # token 1 drafted with q = 0
    return {
        "target float64": (t.astype(np.float64), k, q),
        "target wrong rows": (t[:2].copy(), k, q),
        "target 1d": (t[0].copy(), k, q),
        "target strided": (np.zeros((3, 16), np.float32)[:, ::2], k, q),
        "target nan": (np.where(np.arange(8) == 3, np.nan, t).astype(np.float32), k, q),
        "probs float64": (t, k, q.astype(np.float64)),
        "probs wrong rows": (t, k, q[:1].copy()),
        "probs short vocab": (t, k, q[:, :7].copy()),
        "probs strided": (t, k, np.zeros((2, 16), np.float32)[:, ::2]),
        "token negative": (t, np.array([0, -1], np.int32), q),
        "token == V": (t, np.array([0, 8], np.int32), q),
        "token huge int64": (t, np.array([0, 2**32 + 1], np.int64), q),
        "token with q = 0": (t, k, qz),
        "tokens 2d": (t, k.reshape(1, 2), q),
    }


@pytest.mark.parametrize("case", list(_bad_verify_cases()))
def test_bad_verify_inputs_raise(isa, case):
    target, toks, q = _bad_verify_cases()[case]
    with pytest.raises((TypeError, ValueError)):
        sampling.verify(target, toks, q, P, Rng(0))


def test_bad_other_inputs_raise():
    rng = Rng(0)
    with pytest.raises(TypeError):
        sampling.distribution(GOOD, {"temperature": 1.0})
    with pytest.raises((TypeError, ValueError)):
        sampling.sample_into(GOOD, P, rng, np.zeros(8, dtype=np.float32))  # too short
    with pytest.raises((TypeError, ValueError)):
        sampling.sample_into(GOOD, P, rng, np.zeros(16, dtype=np.float64))
    with pytest.raises((TypeError, ValueError)):
        sampling.acceptance_rate(GOOD, GOOD[:8].copy())
    with pytest.raises((TypeError, ValueError)):
        sampling.acceptance_rate(GOOD.astype(np.float64), GOOD)
    with pytest.raises((TypeError, ValueError)):
        sampling.verify_pointer(0, 3, 8, np.arange(2, dtype=np.int32), None, P, rng)  # null pointer
    target, toks, q = _verify_inputs()
    with pytest.raises((TypeError, ValueError)):
        sampling.verify_pointer(target.ctypes.data, 2, 8, toks, q, P, rng)  # rows != γ+1
    with pytest.raises((TypeError, ValueError)):
        sampling.set_isa("no-such-isa")
