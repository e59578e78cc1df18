"""The C++ kernels against the plain numpy references, on every kernel path
(instruction set) this CPU supports."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
import reference as ref

from specdec_cpu import _core

ISAS = list(_core.supported_isas())
TEMPERATURES = (0.0, 0.3, 1.0, 2.0)
TOP_PS = (0.01, 0.5, 1.0)
MIN_PS = (0.0, 0.05, 0.3)
LARGE_SIZES = (151_936, 262_144)


def misaligned(values: np.ndarray, offset: int) -> np.ndarray:
    """A C-contiguous float32 view of `values` starting `offset` floats into a
    fresh buffer, i.e. not aligned to a vector boundary."""
    buf = np.empty(values.size + 8, dtype=np.float32)
    view = buf[offset : offset + values.size]
    view[...] = values
    assert view.flags.c_contiguous
    return view


def make_logits(rng: np.random.Generator, n: int, ties: bool) -> np.ndarray:
    """Logits with a spread small enough that no finite entry underflows in
    float32 at T = 0.3, some -inf entries and (optionally) many exact ties."""
    if ties:
        x = rng.integers(-6, 7, size=n).astype(np.float32) * np.float32(0.5)
    else:
        x = np.clip(rng.standard_normal(n) * 2.5, -12, 12).astype(np.float32)
        if n > 4:  # duplicate a few values, including the maximum
            src = rng.integers(0, n, size=max(1, n // 8))
            dst = rng.integers(0, n, size=src.size)
            x[dst] = x[src]
            x[rng.integers(0, n)] = x.max()
    if n > 2:
        masked = rng.random(n) < 0.1
        masked[int(np.argmax(x))] = False
        x[masked] = -np.inf
    return x


def grid(n: int):
    top_ks = sorted({0, 1, 5, n})
    return itertools.product(TEMPERATURES, top_ks, TOP_PS, MIN_PS)


def check_against_reference(logits: np.ndarray, got: np.ndarray, t, k, p, mp) -> None:
    want = ref.distribution(logits, t, k, p, mp)
    label = f"n={logits.size} T={t} top_k={k} top_p={p} min_p={mp}"
    assert got.dtype == np.float32 and got.shape == logits.shape, label
    got_support = np.nonzero(got > 0)[0]
    want_support = np.nonzero(want > 0)[0]
    if not np.array_equal(got_support, want_support):
        if ref.top_p_ambiguous(logits, t, k, p):
            return  # the cut sits on a cumulative-mass tie: either side is right
        raise AssertionError(f"{label}: support {got_support[:20]} != reference {want_support[:20]}")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-12, err_msg=label)
    assert abs(float(got.astype(np.float64).sum()) - 1.0) < 1e-5, label


# --- distribution -------------------------------------------------------------


def test_distribution_small_sizes(isa):
    rng = np.random.default_rng(1234)
    for n in range(1, 2 * 16 + 2):
        for ties in (False, True):
            values = make_logits(rng, n, ties)
            logits = misaligned(values, offset=1 + n % 3)
            for t, k, p, mp in grid(n):
                got = _core.distribution(logits, t, k, p, mp)
                check_against_reference(logits, got, t, k, p, mp)


@pytest.mark.parametrize("n", LARGE_SIZES)
def test_distribution_large_rows(isa, n):
    rng = np.random.default_rng(n)
    values = make_logits(rng, n, ties=False)
    logits = misaligned(values, offset=3)
    cases = [
        (1.0, 0, 1.0, 0.0),
        (0.0, 0, 1.0, 0.0),
        (0.3, 5, 1.0, 0.0),
        (0.8, 0, 0.95, 0.0),
        (1.0, 0, 0.5, 0.0),
        (2.0, 0, 0.01, 0.0),
        (1.0, 40, 0.95, 0.05),
        (2.0, n, 1.0, 0.3),
        (0.3, 0, 1.0, 0.05),
        (1.0, 1000, 0.5, 0.0),
        (2.0, 50_000, 1.0, 0.0),
    ]
    for t, k, p, mp in cases:
        check_against_reference(logits, _core.distribution(logits, t, k, p, mp), t, k, p, mp)


def test_distribution_large_ties(isa):
    n = 262_144
    rng = np.random.default_rng(5)
    logits = make_logits(rng, n, ties=True)
    cases = [(1.0, 5, 1.0, 0.0), (0.3, 1000, 0.9, 0.0), (1.0, 0, 0.3, 0.05), (2.0, 0, 1.0, 0.3),
             (1.0, 50_000, 1.0, 0.0), (0.7, 0, 0.97, 0.0), (2.0, 100_000, 0.8, 0.0)]
    for t, k, p, mp in cases:
        check_against_reference(logits, _core.distribution(logits, t, k, p, mp), t, k, p, mp)


def test_distribution_rows_match_single_rows(isa):
    rng = np.random.default_rng(7)
    logits = np.stack([make_logits(rng, 300, ties=False) for _ in range(4)])
    for t, k, p, mp in [(0.0, 0, 1.0, 0.0), (0.7, 20, 0.9, 0.05), (1.3, 0, 0.5, 0.0)]:
        rows = _core.distribution(logits, t, k, p, mp)
        assert rows.shape == logits.shape
        for r in range(4):
            np.testing.assert_array_equal(rows[r], _core.distribution(logits[r], t, k, p, mp))
    empty = np.zeros((0, 10), np.float32)
    assert _core.distribution(empty, 1.0, 0, 1.0, 0.0).shape == (0, 10)


def test_greedy_ties_to_lowest_id(isa):
    x = np.array([1.0, 3.0, -np.inf, 3.0, 2.0], np.float32)
    for t, k in [(0.0, 0), (1.0, 1), (0.0, 5)]:
        d = _core.distribution(x, t, k, 1.0, 0.0)
        np.testing.assert_array_equal(d, [0, 1, 0, 0, 0])
    # top-k cut inside a tie keeps the lower ids
    x = np.array([2.0, 5.0, 5.0, 5.0, 1.0], np.float32)
    d = _core.distribution(x, 1.0, 2, 1.0, 0.0)
    np.testing.assert_allclose(d, [0, 0.5, 0.5, 0, 0])


def test_sample_and_sample_into(isa):
    rng = np.random.default_rng(11)
    logits = make_logits(rng, 5000, ties=False)
    for t, k, p, mp in [(1.0, 0, 1.0, 0.0), (0.7, 50, 0.9, 0.0), (1.5, 0, 0.8, 0.02), (0.0, 0, 1.0, 0.0)]:
        want = ref.distribution(logits, t, k, p, mp)
        a, b = _core.Rng(99, 3), _core.Rng(99, 3)
        out = np.full(5003, np.nan, np.float32)
        for _ in range(20):
            u = ref.philox_uniform(99, 3, a.counter)
            tok = _core.sample(logits, t, k, p, mp, a)
            assert want[tok] > 0
            assert tok == ref.sample_inverse_cdf(want, u)
            assert _core.sample_into(logits, t, k, p, mp, b, out) == tok
        np.testing.assert_array_equal(out[:5000], _core.distribution(logits, t, k, p, mp))
        np.testing.assert_array_equal(out[5000:], 0)
        assert a.counter == b.counter == 20


def test_sample_never_picks_zero_weight(isa):
    x = np.full(1000, -np.inf, np.float32)
    x[[3, 500, 999]] = [0.0, 1.0, 2.0]
    rng = _core.Rng(5)
    seen = {_core.sample(x, 1.0, 0, 1.0, 0.0, rng) for _ in range(300)}
    assert seen <= {3, 500, 999} and len(seen) == 3


# --- exp ----------------------------------------------------------------------


def test_exp_accuracy(isa):
    x = np.concatenate([np.linspace(-87.3, 0.0, 200_001), -np.logspace(-8, 1, 1001)]).astype(np.float32)
    got = _core._exp(x).astype(np.float64)
    want = np.exp(x.astype(np.float64))
    ulp = np.spacing(want.astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got - want) / ulp) <= 1.5
    special = np.array([-np.inf, -1e30, -200.0, -104.0, -88.0, 0.0], np.float32)
    np.testing.assert_array_equal(_core._exp(special), [0, 0, 0, 0, 0, 1])
    sizes = np.arange(1, 40, dtype=np.float32) * -0.1  # tails of every length
    for n in range(1, 40):
        np.testing.assert_allclose(_core._exp(misaligned(sizes[:n], n % 4)), np.exp(sizes[:n]), rtol=3e-7)


# --- acceptance rate, toy case ------------------------------------------------


def test_acceptance_rate(isa):
    rng = np.random.default_rng(3)
    for n in list(range(1, 34)) + [151_936]:
        p = rng.random(n).astype(np.float32)
        q = rng.random(n).astype(np.float32)
        p, q = misaligned(p / p.sum(), 1), misaligned(q / q.sum(), 2)
        assert _core.acceptance_rate(p, q) == pytest.approx(ref.acceptance_rate(p, q), rel=1e-6)


def test_toy_acceptance():
    target = np.array([2.0, 0.0], np.float32)
    draft = np.array([1.5, 0.0], np.float32)
    for t, want in [(0.0, "1.00"), (0.5, "0.97"), (1.0, "0.94")]:
        p = _core.distribution(target, t, 0, 1.0, 0.0)
        q = _core.distribution(draft, t, 0, 1.0, 0.0)
        assert f"{_core.acceptance_rate(p, q):.2f}" == want


# --- verify -------------------------------------------------------------------


def _replay(seed: int, stream: int):
    n = [0]

    def uniform():
        u = ref.philox_uniform(seed, stream, n[0])
        n[0] += 1
        return u

    return uniform, n


@pytest.mark.parametrize("n_vocab", [7, 33, 4096])
def test_verify_matches_reference(isa, n_vocab):
    rng = np.random.default_rng(n_vocab)
    settings = [(0.0, 0, 1.0, 0.0), (1.0, 0, 1.0, 0.0), (0.7, 5, 0.9, 0.0), (1.5, 0, 0.5, 0.05)]
    for trial, (t, k, p, mp) in itertools.product(range(25), settings):
        gamma = int(rng.integers(0, 5))
        base = make_logits(rng, n_vocab, ties=False)
        target = np.stack([base + rng.standard_normal(n_vocab).astype(np.float32) * 0.5 for _ in range(gamma + 1)])
        draft_logits = target[:gamma] + rng.standard_normal((gamma, n_vocab)).astype(np.float32) * 0.7
        q = _core.distribution(np.ascontiguousarray(draft_logits).reshape(gamma, n_vocab), t, k, p, mp)
        tokens = np.array([int(rng.choice(n_vocab, p=row / row.sum())) for row in q.astype(np.float64)], np.int32)
        for probs in (q, None):
            seed = 1000 * trial + n_vocab
            uniform, used = _replay(seed, 1)
            want = ref.verify(target, tokens, probs, t, k, p, mp, uniform)
            r = _core.Rng(seed, 1)
            n_acc, token, alphas = _core.verify(target, tokens, probs, t, k, p, mp, r)
            assert (n_acc, token) == want[:2], (trial, t, k, p, mp, probs is None)
            np.testing.assert_allclose(alphas, want[2], rtol=1e-5, atol=1e-7)
            assert alphas.dtype == np.float64
            assert r.counter == used[0]


def test_verify_greedy_rules(isa):
    target = np.array([[0.0, 3.0, 1.0], [2.0, 0.0, 2.0]], np.float32)
    rng = _core.Rng(0, 1)
    assert _core.verify(target, np.array([1], np.int32), None, 0.0, 0, 1.0, 0.0, rng)[:2] == (1, 0)
    n, tok, alphas = _core.verify(target, np.array([2], np.int32), None, 0.0, 0, 1.0, 0.0, rng)
    assert (n, tok, list(alphas)) == (0, 1, [0.0])
    q = np.array([[0.2, 0.3, 0.5]], np.float32)
    n, tok, alphas = _core.verify(target, np.array([2], np.int32), q, 0.0, 0, 1.0, 0.0, rng)
    assert (n, tok) == (0, 1) and alphas[0] == pytest.approx(0.3)


def test_verify_pointer(isa):
    rng = np.random.default_rng(2)
    target = np.stack([make_logits(rng, 500, False) for _ in range(4)])
    tokens = np.array([1, 2, 3], np.int32)
    q = _core.distribution(target[:3] + 0.3, 1.0, 0, 1.0, 0.0)
    tokens = np.array([int(np.argmax(row)) for row in q], np.int32)
    a = _core.verify(target, tokens, q, 1.0, 0, 1.0, 0.0, _core.Rng(4, 1))
    b = _core.verify_ptr(target.ctypes.data, 4, 500, tokens, q, 1.0, 0, 1.0, 0.0, _core.Rng(4, 1))
    assert a[:2] == b[:2]
    np.testing.assert_array_equal(a[2], b[2])


# --- errors -------------------------------------------------------------------


def test_bad_logits_are_errors(isa):
    from specdec_cpu.errors import InvalidLogitsError

    for n in (1, 7, 40, 262_144):
        x = np.zeros(n, np.float32)
        x[n - 1] = np.nan
        with pytest.raises(InvalidLogitsError, match=f"NaN at token {n - 1}"):
            _core.distribution(x, 1.0, 0, 1.0, 0.0)
        x[n - 1] = np.inf
        with pytest.raises(ValueError, match=rf"\+inf at token {n - 1}"):
            _core.sample(x, 1.0, 0, 1.0, 0.0, _core.Rng(0))
        x[:] = -np.inf
        with pytest.raises(ValueError, match="entirely -inf"):
            _core.distribution(x, 0.0, 0, 1.0, 0.0)
    rows = np.zeros((4, 10), np.float32)
    rows[3, 5] = np.nan
    with pytest.raises(ValueError, match="logits row 3 contains NaN at token 5"):
        _core.distribution(rows, 1.0, 0, 1.0, 0.0)
    rng = _core.Rng(0)
    with pytest.raises(ValueError, match="target_logits row 3 contains NaN at token 5"):
        _core.verify(rows, np.zeros(3, np.int32), None, 0.0, 0, 1.0, 0.0, rng)


def test_argument_errors():
    x = np.zeros(10, np.float32)
    rng = _core.Rng(0)
    with pytest.raises(TypeError, match="logits must be a float32"):
        _core.distribution(x.astype(np.float64), 1.0, 0, 1.0, 0.0)
    with pytest.raises(TypeError, match="logits must be C-contiguous"):
        _core.distribution(np.zeros(20, np.float32)[::2], 1.0, 0, 1.0, 0.0)
    with pytest.raises(ValueError, match="logits must have shape"):
        _core.distribution(np.zeros((2, 2, 2), np.float32), 1.0, 0, 1.0, 0.0)
    with pytest.raises(ValueError, match="logits must have shape"):
        _core.sample(np.zeros((2, 5), np.float32), 1.0, 0, 1.0, 0.0, rng)
    with pytest.raises(ValueError, match="out must have shape"):
        _core.sample_into(x, 1.0, 0, 1.0, 0.0, rng, np.zeros(9, np.float32))
    with pytest.raises(TypeError, match="out must be a float32"):
        _core.sample_into(x, 1.0, 0, 1.0, 0.0, rng, np.zeros(10, np.float64))
    with pytest.raises(TypeError, match="q must be a float32"):
        _core.acceptance_rate(x, x.astype(np.float16))
    with pytest.raises(ValueError, match="q must have the shape of p"):
        _core.acceptance_rate(x, x[:5])
    for bad in [(-1.0, 0, 1.0, 0.0), (float("nan"), 0, 1.0, 0.0), (1.0, -2, 1.0, 0.0), (1.0, 0, 0.0, 0.0),
                (1.0, 0, 1.5, 0.0), (1.0, 0, 1.0, 1.0), (1.0, 0, 1.0, -0.1)]:
        with pytest.raises(ValueError):
            _core.distribution(x, *bad)
    assert rng.counter == 0


def test_verify_argument_errors():
    target = np.zeros((3, 10), np.float32)
    tokens = np.array([1, 2], np.int32)
    q = np.full((2, 10), 0.1, np.float32)
    rng = _core.Rng(0)
    args = (1.0, 0, 1.0, 0.0, rng)
    with pytest.raises(ValueError, match=r"draft_tokens\[1\] = 10 is outside"):
        _core.verify(target, np.array([1, 10], np.int32), q, *args)
    with pytest.raises(ValueError, match=r"draft_tokens\[0\] = -1"):
        _core.verify(target, np.array([-1, 0], np.int32), None, *args)
    q0 = q.copy()
    q0[1, 2] = 0.0
    with pytest.raises(ValueError, match=r"draft_probs\[1, 2\]"):
        _core.verify(target, tokens, q0, *args)
    with pytest.raises(ValueError, match=r"draft_probs must have shape \(γ, V\) = \(2, 10\)"):
        _core.verify(target, tokens, q[:1], *args)
    with pytest.raises(TypeError, match="draft_probs must be a float32"):
        _core.verify(target, tokens, q.astype(np.float64), *args)
    with pytest.raises(TypeError, match="draft_probs must be C-contiguous"):
        _core.verify(target, tokens, np.asfortranarray(q), *args)
    with pytest.raises(TypeError, match="target_logits must be a float32"):
        _core.verify(target.astype(np.float64), tokens, q, *args)
    with pytest.raises(TypeError, match="target_logits must be C-contiguous"):
        _core.verify(np.asfortranarray(target), tokens, q, *args)
    with pytest.raises(ValueError, match="draft_tokens must have shape"):
        _core.verify(target, np.array([1], np.int32), None, *args)
    with pytest.raises(TypeError, match="draft_tokens must be an int32"):
        _core.verify(target, tokens.astype(np.float32), None, *args)
    with pytest.raises(ValueError, match="target_logits must have shape"):
        _core.verify(np.zeros(10, np.float32), tokens, None, *args)
    with pytest.raises(ValueError, match="address"):
        _core.verify_ptr(0, 3, 10, tokens, q, *args)
    assert rng.counter == 0  # nothing was drawn


# --- Rng ----------------------------------------------------------------------


def test_rng_reproducible_and_matches_philox():
    a, b = _core.Rng(2**64 - 1, 7), _core.Rng(2**64 - 1, 7)
    xs = [a.uniform() for _ in range(50)]
    assert xs == [b.uniform() for _ in range(50)]
    assert xs == [ref.philox_uniform(2**64 - 1, 7, i) for i in range(50)]
    assert all(0.0 <= x < 1.0 for x in xs)
    assert (a.seed, a.stream, a.counter) == (2**64 - 1, 7, 50)
    assert repr(_core.Rng(3, 1)) == "Rng(seed=3, stream=1, counter=0)"
    # the published known-answer vector of Philox-4x32-10
    assert ref.philox4x32_10((0, 0, 0, 0), (0, 0)) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)


def test_rng_streams_are_independent():
    n = 20_000
    r0, r1 = _core.Rng(42, 0), _core.Rng(42, 1)
    s0 = np.array([r0.uniform() for _ in range(n)])
    s1 = np.array([r1.uniform() for _ in range(n)])
    assert not np.intersect1d(s0, s1).size
    assert abs(np.corrcoef(s0, s1)[0, 1]) < 0.03
    assert abs(s0.mean() - 0.5) < 0.01 and abs(s1.mean() - 0.5) < 0.01
    assert _core.Rng(43, 0).uniform() != _core.Rng(42, 0).uniform()


def test_rng_argument_errors():
    with pytest.raises(ValueError, match="seed must be in"):
        _core.Rng(-1)
    with pytest.raises(ValueError, match="seed must be in"):
        _core.Rng(2**64)
    with pytest.raises(ValueError, match="stream must be in"):
        _core.Rng(0, -1)
    with pytest.raises(TypeError):
        _core.Rng(1.5)
    assert _core.Rng(np.uint64(2**63)).seed == 2**63


# --- instruction-set selection ------------------------------------------------


def test_isa_api():
    assert ISAS[0] == "scalar"
    assert _core.active_isa() in ISAS
    with pytest.raises(ValueError, match="unknown instruction set 'avx9000'"):
        _core.set_isa("avx9000")


def _import_with(isa_value: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, SPECDEC_ISA=isa_value)
    code = "from specdec_cpu import _core; print(_core.active_isa())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("name", ISAS)
def test_env_var_selects_isa(name):
    done = _import_with(name)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == name


def test_env_var_rejects_unknown_isa():
    done = _import_with("avx9000")
    assert done.returncode != 0
    assert "SPECDEC_ISA=avx9000" in done.stderr
    assert "scalar" in done.stderr


def test_threads_get_their_own_scratch():
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(21)
    rows = [make_logits(rng, 20_000, ties=False) for _ in range(8)]
    settings = [(0.7, 40, 0.9, 0.0), (1.0, 0, 0.95, 0.02)]
    want = [[_core.distribution(x, *s) for s in settings] for x in rows]

    def work(i):
        x = rows[i % len(rows)]
        for _ in range(5):
            for s, w in zip(settings, want[i % len(rows)]):
                np.testing.assert_array_equal(_core.distribution(x, *s), w)
        return True

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert all(pool.map(work, range(16)))
