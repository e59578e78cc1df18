"""Fuzzing of every kernel binding of the C++ extension (``specdec_cpu._core``).

Hypothesis throws arbitrary inputs at the raw bindings: arrays of every
dtype (float64, float16, int32, bool, complex, object), shape (0-d to 3-d,
empty) and layout (Fortran order, strided and reversed views, unaligned,
read-only), values with NaN, ±inf, float32 extremes and subnormals;
temperatures from 1e-300 to 1e300, top_k far past V; and non-array
arguments.  Each call must either raise TypeError/ValueError or return a
correct answer -- and must succeed whenever the input is valid.  A crash
fails the whole run.

``verify_ptr`` reads a raw address by design, so only its shape arguments
are fuzzed, against a valid buffer: sizes that fit the buffer, non-positive
ones and ones whose byte count overflows.

SPECDEC_FUZZ_EXAMPLES=20000 for a long hunt; the default keeps the file fast.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from specdec_cpu import _core

FUZZ = settings(
    max_examples=int(os.environ.get("SPECDEC_FUZZ_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                           HealthCheck.data_too_large],
)
CLEAN = (TypeError, ValueError)


# ---------------------------------------------------------------------------
# strategies
# ---------------------------------------------------------------------------

F32_MAX = float(np.finfo(np.float32).max)
SPECIAL = [0.0, -0.0, 1.0, -1.0, F32_MAX, -F32_MAX, 1e-45, -1e-45, 1e-38, 88.0, -88.0, 1e4, -1e4]
finite = st.one_of(st.floats(-30, 30, width=32), st.sampled_from(SPECIAL))

DTYPES = ["float32"] * 6 + ["float64", "float16", "int32", "int64", "bool", "complex64", "object"]
LAYOUTS = ["c"] * 6 + ["fortran", "strided", "reversed", "unaligned", "readonly"]


@st.composite
def values(draw, shape, poison=True):
    """float64 values of ``shape``; sometimes with -inf, NaN or +inf planted."""
    size = int(np.prod(shape)) if shape else 1
    x = np.array(draw(st.lists(finite, min_size=size, max_size=size)), dtype=np.float64).reshape(shape)
    if poison and size and draw(st.booleans()):
        kind = draw(st.sampled_from(["-inf", "-inf", "-inf row", "nan", "+inf"]))
        flat = x.reshape(-1)
        if kind == "-inf row" and x.ndim >= 1:
            flat[:] = -np.inf
        else:
            n = draw(st.integers(1, size))
            idx = draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=n))
            flat[idx] = {"-inf": -np.inf, "nan": np.nan, "+inf": np.inf}.get(kind, -np.inf)
    return x


def layout(x: np.ndarray, how: str) -> np.ndarray:
    """``x`` (any dtype) in the memory layout ``how`` (same values)."""
    if how == "fortran":
        return np.asfortranarray(x)
    if how == "strided" and x.ndim >= 1:
        big = np.empty(x.shape[:-1] + (2 * x.shape[-1],), dtype=x.dtype)
        view = big[..., ::2]
        view[...] = x
        return view
    if how == "reversed" and x.ndim >= 1:
        return x[..., ::-1].copy()[..., ::-1]
    if how == "unaligned" and x.dtype != object and x.itemsize > 1:
        raw = np.zeros(x.nbytes + 1, dtype=np.uint8)
        view = raw[1:].view(x.dtype).reshape(x.shape)
        view[...] = x
        return view
    if how == "readonly":
        y = x.copy()
        y.flags.writeable = False
        return y
    return np.ascontiguousarray(x)


def cast(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype in ("int32", "int64", "bool"):
        x = np.nan_to_num(x, nan=0.0, posinf=1e9, neginf=-1e9).clip(-1e9, 1e9)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(np.asarray(x).astype(dtype))


@st.composite
def any_array(draw, ndims=(0, 1, 1, 1, 2, 2, 3), max_side=24, poison=True):
    ndim = draw(st.sampled_from(ndims))
    side = {0: 1, 1: max_side * 4, 2: max_side, 3: 5}[ndim]
    shape = tuple(draw(st.integers(0 if draw(st.booleans()) else 1, side)) for _ in range(ndim))
    x = draw(values(shape, poison))
    return layout(cast(x, draw(st.sampled_from(DTYPES))), draw(st.sampled_from(LAYOUTS)))


@st.composite
def float_rows(draw, ndims=(1, 2), poison=True):
    """Well-formed float32 rows (V >= 1), sometimes holding -inf, NaN or +inf."""
    ndim = draw(st.sampled_from(ndims))
    shape = (draw(st.integers(1, 200)),) if ndim == 1 else (draw(st.integers(0, 5)), draw(st.integers(1, 60)))
    return np.ascontiguousarray(draw(values(shape, poison)), dtype=np.float32)


not_an_array = st.sampled_from([None, 1.5, "logits", [1.0, 2.0], [[1.0], [2.0]], (), {"a": 1}])


def arrays(ndims=(1, 2)):
    """Half well-formed rows of rank ``ndims``, half anything."""
    good = float_rows(ndims)
    return st.one_of(good, good, good, any_array(), any_array(), not_an_array)

temperature = st.one_of(
    st.sampled_from([0.0, 1e-300, 1e-30, 1e-8, 1e-3, 0.7, 1.0, 2.0, 1e8, 1e30, 1e300]),
    st.floats(0.0, 10.0),
    st.sampled_from([-1e-9, -1.0, math.nan, math.inf, -math.inf]),
    st.sampled_from([None, "1.0", True, np.float32(0.5), 3]),
)
top_k = st.one_of(
    st.integers(0, 40), st.sampled_from([0, 1, 2**31, 2**40, 2**63 - 1]),
    st.sampled_from([-1, -(2**63), 2**63, 2**70, 1.5, None, "3", True, np.int64(5)]),
)
top_p = st.one_of(
    st.floats(0.0, 1.0, exclude_min=True), st.sampled_from([1.0, 1e-12, 0.5, 0.999999]),
    st.sampled_from([0.0, -0.1, 1.0000001, 2.0, math.nan, math.inf, None, "0.9"]),
)
min_p = st.one_of(
    st.floats(0.0, 1.0, exclude_max=True), st.sampled_from([0.0, 1e-12, 0.5, 0.999999]),
    st.sampled_from([1.0, -0.1, 2.0, math.nan, -math.inf, None, "0.1"]),
)


@st.composite
def knobs(draw):
    """Sampling parameters: mostly in range, else anything."""
    if draw(st.integers(0, 9)) < 6:
        return (draw(st.one_of(st.sampled_from([0.0, 1e-300, 1e-30, 1e-8, 0.7, 1.0, 1e8, 1e300]),
                               st.floats(0.0, 10.0))),
                draw(st.one_of(st.just(0), st.integers(0, 300), st.sampled_from([2**40, 2**63 - 1]))),
                draw(st.one_of(st.just(1.0), st.floats(0.0, 1.0, exclude_min=True))),
                draw(st.one_of(st.just(0.0), st.floats(0.0, 1.0, exclude_max=True))))
    return (draw(temperature), draw(top_k), draw(top_p), draw(min_p))


def rng_arg(draw):
    return draw(st.one_of(st.builds(_core.Rng, st.integers(0, 2**64 - 1)), st.just(_core.Rng(5)),
                          st.sampled_from([None, 5, "rng"])))


# ---------------------------------------------------------------------------
# what is valid, and what a correct answer looks like
# ---------------------------------------------------------------------------


def plain_number(v) -> bool:
    return type(v) in (int, float)


def knobs_valid(t, k, p, m) -> bool:
    """Exactly-typed parameters in range (the contract)."""
    if not all(plain_number(v) for v in (t, k, p, m)) or type(k) is not int:
        return False
    return (math.isfinite(t) and t >= 0 and -(2**63) <= k < 2**63 and k >= 0
            and 0 < p <= 1 and 0 <= m < 1)


def knobs_invalid(t, k, p, m) -> bool:
    """Certainly rejected: a value out of range or a type no binding takes.
    (Coercible types such as bool or numpy scalars may go either way.)"""
    for v in (t, p, m):
        if v is None or isinstance(v, str):
            return True
    if k is None or isinstance(k, (str, float)):
        return True
    if isinstance(t, (int, float)) and not (math.isfinite(float(t)) and float(t) >= 0):
        return True
    if isinstance(k, int) and not isinstance(k, bool) and not 0 <= k < 2**63:
        return True
    if isinstance(p, (int, float)) and not 0 < float(p) <= 1:
        return True
    if isinstance(m, (int, float)) and not 0 <= float(m) < 1:
        return True
    return False


def well_formed(a, ndims) -> bool:
    """A float32, C-contiguous, aligned array of an accepted rank."""
    return (isinstance(a, np.ndarray) and a.dtype == np.float32 and a.flags.c_contiguous
            and a.flags.aligned and a.ndim in ndims)


def badly_formed(a, ndims) -> bool:
    return not well_formed(a, ndims)


def rows_ok(x: np.ndarray) -> bool:
    """No NaN, no +inf, every row with a finite entry."""
    x2 = x.reshape(-1, x.shape[-1])
    return not (np.isnan(x2).any() or np.isposinf(x2).any() or (~np.isfinite(x2)).all(axis=1).any())


def greedy(t, k) -> bool:
    return t == 0 or k == 1


def check_distribution(p: np.ndarray, x: np.ndarray, t, k) -> None:
    assert p.dtype == np.float32 and p.shape == x.shape
    for prow, xrow in zip(p.reshape(-1, x.shape[-1]), x.reshape(-1, x.shape[-1])):
        assert np.isfinite(prow).all() and (prow >= 0).all()
        assert abs(float(prow.astype(np.float64).sum()) - 1.0) < 1e-4, prow.sum()
        assert (prow[np.isneginf(xrow)] == 0).all()
        top = int(np.argmax(xrow))  # the first maximum
        if greedy(t, k):
            assert prow[top] == 1.0 and np.count_nonzero(prow) == 1
            continue
        # The most likely token is kept -- up to float32: where T is so large
        # that exp((x - max) / T) rounds to 1, distinct logits tie, and ties
        # go to the lower id (as the property tests' `ambiguous` allows).
        with np.errstate(over="ignore", invalid="ignore"):
            scaled = (xrow.astype(np.float64) - float(xrow[top])) / t
        tied = np.flatnonzero(scaled > -1e-6)
        assert prow[tied].max() > 0 and prow[tied].max() == prow.max()
        if k > 0:
            assert np.count_nonzero(prow) <= k


def call(fn, *args):
    """(result, None) or (None, exception) -- only TypeError/ValueError may escape."""
    try:
        out = fn(*args), None
        event("answered")
    except CLEAN as exc:
        event(f"refused: {type(exc).__name__}")
        return None, exc
    return out


# ---------------------------------------------------------------------------
# the bindings
# ---------------------------------------------------------------------------


@FUZZ
@given(x=arrays((1, 2)), kn=knobs())
def test_fuzz_distribution(isa, x, kn) -> None:
    out, err = call(_core.distribution, x, *kn)
    if badly_formed(x, (1, 2)) or knobs_invalid(*kn) or x.shape[-1] == 0:
        assert err is not None
        return
    valid_rows = rows_ok(x) if x.size else True
    if not valid_rows:
        assert isinstance(err, ValueError) and "logits" in str(err)
        return
    if knobs_valid(*kn):
        assert err is None, err
    if err is None:
        check_distribution(out, x, kn[0], kn[1])


@FUZZ
@given(x=arrays((1,)), kn=knobs(), data=st.data())
def test_fuzz_sample(isa, x, kn, data) -> None:
    rng = rng_arg(data.draw)
    tok, err = call(_core.sample, x, *kn, rng)
    if badly_formed(x, (1,)) or knobs_invalid(*kn) or not isinstance(rng, _core.Rng) or x.size == 0:
        assert err is not None
        return
    if not rows_ok(x):
        assert isinstance(err, ValueError)
        return
    if knobs_valid(*kn):
        assert err is None, err
    if err is None:
        assert isinstance(tok, int) and 0 <= tok < x.size
        dist = _core.distribution(x, *kn)
        assert dist[tok] > 0
        if greedy(kn[0], kn[1]):
            assert tok == int(np.argmax(x))


@FUZZ
@given(x=arrays((1,)), kn=knobs(), data=st.data())
def test_fuzz_sample_into(isa, x, kn, data) -> None:
    rng = rng_arg(data.draw)
    if isinstance(x, np.ndarray) and data.draw(st.booleans()):  # an out buffer that fits
        out = np.full(x.size + data.draw(st.integers(0, 5)), 7.0, dtype=np.float32)
    else:
        out = data.draw(arrays((1,)))
    before = out.copy() if isinstance(out, np.ndarray) else None
    tok, err = call(_core.sample_into, x, *kn, rng, out)
    if (badly_formed(x, (1,)) or badly_formed(out, (1,)) or knobs_invalid(*kn)
            or not isinstance(rng, _core.Rng) or x.size == 0 or out.size < x.size
            or not out.flags.writeable):
        assert err is not None
        if isinstance(out, np.ndarray) and out.dtype != object:
            assert np.array_equal(out, before, equal_nan=True) or err is not None
        return
    if not rows_ok(x):
        assert isinstance(err, ValueError)
        return
    if knobs_valid(*kn):
        assert err is None, err
    if err is None:
        v = x.size
        assert 0 <= tok < v
        np.testing.assert_array_equal(out[:v], _core.distribution(x, *kn))
        assert (out[v:] == 0).all() and out[tok] > 0


@FUZZ
@given(p=arrays((1,)), q=arrays((1,)))
def test_fuzz_acceptance_rate(isa, p, q) -> None:
    a, err = call(_core.acceptance_rate, p, q)
    if badly_formed(p, (1,)) or badly_formed(q, (1,)) or p.shape != q.shape:
        assert err is not None
        return
    assert err is None, err
    assert isinstance(a, float)
    # Partial sums are float32 over chunks of 64 per lane, then double: exact
    # to ~64 float32 roundings of the magnitudes, and able to overflow only
    # for values near the float32 limit (then inf is the float32 answer).
    if (np.abs(p) <= 1e30).all() and (np.abs(q) <= 1e30).all():
        m = np.minimum(p.astype(np.float64), q.astype(np.float64))
        assert a == pytest.approx(float(m.sum()), rel=0, abs=1e-5 * float(np.abs(m).sum()) + 1e-30)


@st.composite
def verify_inputs(draw):
    """Mostly well-formed verify arguments, each part sometimes wrong."""
    v = draw(st.integers(1, 40))
    gamma = draw(st.integers(0, 5))
    x = draw(values((gamma + 1, v)))
    if draw(st.integers(0, 4)) == 0:
        logits = draw(any_array(ndims=(1, 2, 3)))
    else:
        logits = layout(x.astype(np.float32), draw(st.sampled_from(LAYOUTS)))
    toks = np.array(draw(st.lists(st.integers(0, v - 1), min_size=gamma, max_size=gamma)), dtype=np.int64)
    wrong = draw(st.sampled_from([None] * 6 + ["value", "dtype", "shape", "layout", "list"]))
    if wrong == "value" and gamma:
        toks[draw(st.integers(0, gamma - 1))] = draw(st.sampled_from([-1, v, 2**31, 2**40, -(2**40)]))
    toks = toks.astype(draw(st.sampled_from(["int32", "int64"])))
    if wrong == "dtype":
        toks = cast(toks.astype(np.float64), draw(st.sampled_from(["float64", "int16", "uint64", "object"])))
    elif wrong == "shape":
        toks = draw(st.sampled_from([toks.reshape(1, -1), np.zeros(gamma + 1, np.int32), np.int32(0)]))
    elif wrong == "layout" and gamma:
        toks = layout(toks, "strided")
    elif wrong == "list":
        toks = toks.tolist()
    mode = draw(st.sampled_from(["none", "dist", "dist", "dist", "garbage", "any"]))
    if mode == "none":
        q = None
    elif mode == "any":
        q = draw(arrays((2,)))
    else:
        qv = draw(values((gamma, v), poison=False))
        q = np.abs(qv) if mode == "garbage" else np.exp(qv.clip(-30, 30))
        if mode == "dist":
            q /= q.sum(axis=1, keepdims=True) if q.size else 1
        q = q.astype(np.float32)
        if gamma and draw(st.booleans()):
            i = draw(st.integers(0, gamma - 1))
            q[i, draw(st.integers(0, v - 1))] = draw(st.sampled_from([0.0, np.nan, np.inf, -1.0]))
        q = layout(q, draw(st.sampled_from(LAYOUTS)))
    return logits, toks, q


def verify_must_fail(logits, toks, q, kn, rng) -> bool:
    if badly_formed(logits, (2,)) or logits.shape[0] < 1 or logits.shape[1] < 1:
        return True
    gamma, v = logits.shape[0] - 1, logits.shape[1]
    if not (isinstance(toks, np.ndarray) and toks.dtype in (np.int32, np.int64)
            and toks.flags.c_contiguous and toks.flags.aligned and toks.shape == (gamma,)):
        return True
    if knobs_invalid(*kn) or not isinstance(rng, _core.Rng):
        return True
    if ((toks < 0) | (toks >= v)).any():
        return True
    if q is not None:
        if badly_formed(q, (2,)) or q.shape != (gamma, v):
            return True
        qx = q[np.arange(gamma), toks]
        if not ((qx > 0) & np.isfinite(qx)).all():
            return True
    return not rows_ok(logits[:1])  # row 0 is always read


def check_verify(res, logits, toks, q, kn) -> None:
    n, tok, alphas = res
    gamma, v = logits.shape[0] - 1, logits.shape[1]
    assert 0 <= n <= gamma and 0 <= tok < v
    assert alphas.dtype == np.float64 and alphas.shape == ((n + 1,) if n < gamma else (gamma,))
    if q is None or (np.isfinite(q).all() and (q >= 0).all()):
        assert np.isfinite(alphas).all() and (alphas >= -1e-6).all() and (alphas <= 1 + 1e-4).all()
    t, k = kn[0], kn[1]
    row = logits[n]
    assert _core.distribution(np.ascontiguousarray(row), *kn)[tok] > 0
    if greedy(t, k):
        assert tok == int(np.argmax(row))
        assert all(int(toks[i]) == int(np.argmax(logits[i])) for i in range(n))


@FUZZ
@given(inputs=verify_inputs(), kn=knobs(), data=st.data())
def test_fuzz_verify(isa, inputs, kn, data) -> None:
    logits, toks, q = inputs
    seed = data.draw(st.integers(0, 2**64 - 1))
    rng = data.draw(st.sampled_from([_core.Rng(seed), None]))
    res, err = call(_core.verify, logits, toks, q, *kn, rng)
    if verify_must_fail(logits, toks, q, kn, rng):
        assert err is not None
        return
    if err is not None:
        # allowed: a later row read after acceptances holds NaN/+inf, or coercible knobs refused
        assert not knobs_valid(*kn) or (isinstance(err, ValueError) and not rows_ok(logits))
        return
    check_verify(res, logits, toks, q, kn)
    again = _core.verify(logits, toks, q, *kn, _core.Rng(seed))
    assert again[0] == res[0] and again[1] == res[1]


@FUZZ
@given(data=st.data())
def test_fuzz_verify_ptr_shapes(isa, data) -> None:
    """Shape arguments against a valid buffer of ``size`` floats."""
    size = data.draw(st.integers(1, 200))
    buf = np.asarray(data.draw(values((size,), poison=False)), dtype=np.float32)
    addr = buf.ctypes.data
    choice = data.draw(st.sampled_from(["fits", "fits", "fits", "nonpositive", "overflow", "address"]))
    if choice == "fits":
        n_vocab = data.draw(st.integers(1, size))
        n_rows = data.draw(st.integers(1, size // n_vocab))
    elif choice == "nonpositive":
        n_rows = data.draw(st.integers(-(2**63), 0))
        n_vocab = data.draw(st.integers(-(2**63), 2**40))
        if data.draw(st.booleans()):
            n_rows, n_vocab = n_vocab, n_rows
    elif choice == "overflow":
        n_vocab = data.draw(st.integers(2**20, 2**63 - 1))
        n_rows = data.draw(st.integers(2**62 // n_vocab + 1, 2**63 - 1))
    else:
        n_rows, n_vocab = 1, 1
        addr = data.draw(st.sampled_from([0, addr + 1, addr + 2, -addr, 2**64, 2**70, None, 1.5, "0x10", True]))
    gamma = max(n_rows - 1, 0) if choice == "fits" else data.draw(st.integers(0, 3))
    if choice == "fits" and data.draw(st.integers(0, 5)) == 0:
        gamma = data.draw(st.integers(0, 5))  # a draft length that does not match n_rows
    toks = np.zeros(gamma, dtype=np.int32)
    if choice == "fits" and n_vocab > 1:
        toks[:] = data.draw(st.lists(st.integers(0, n_vocab - 1), min_size=gamma, max_size=gamma))
    kn = data.draw(st.sampled_from([(1.0, 0, 1.0, 0.0), (0.0, 0, 1.0, 0.0), (0.7, 3, 0.9, 0.05),
                                    (1e-8, 10**9, 1.0, 0.0)]))
    res, err = call(_core.verify_ptr, addr, n_rows, n_vocab, toks, None, *kn, _core.Rng(3))
    if choice != "fits" or gamma != n_rows - 1:
        assert err is not None
        return
    assert err is None, err
    logits = buf[: n_rows * n_vocab].reshape(n_rows, n_vocab)
    want = _core.verify(logits, toks, None, *kn, _core.Rng(3))
    assert res[0] == want[0] and res[1] == want[1]
    np.testing.assert_array_equal(res[2], want[2])
    check_verify(res, logits, toks, None, kn)


@FUZZ
@given(seed=st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([None, 1.5, "7", True, np.uint64(3)])),
       stream=st.one_of(st.integers(-5, 2**65), st.sampled_from([None, 2.0])))
def test_fuzz_rng(seed, stream) -> None:
    r, err = call(_core.Rng, seed, stream)
    ok = (type(seed) is int or isinstance(seed, np.integer)) and type(stream) is int
    if ok and 0 <= int(seed) < 2**64 and 0 <= stream < 2**64:
        assert err is None, err
        assert 0.0 <= r.uniform() < 1.0 and r.counter == 1
    elif not ok or not (0 <= int(seed) < 2**64 and 0 <= stream < 2**64):
        assert err is not None
