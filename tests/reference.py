"""Plain numpy references of the vocabulary kernels (float64, full sorts).

Slow and obvious on purpose: the C++ kernels are tested against these.
Token order is by descending probability, ties broken by the lower id.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

MASK64 = (1 << 64) - 1


def _check_row(x: np.ndarray) -> None:
    bad = np.isnan(x) | (x == np.inf)
    if bad.any():
        raise ValueError(f"bad logits at token {int(np.argmax(bad))}")
    if not (x > -np.inf).any():
        raise ValueError("all logits are -inf")


def order(p: np.ndarray) -> np.ndarray:
    """Token ids by descending probability, ties by ascending id."""
    return np.lexsort((np.arange(p.size), -p))


def distribution(
    logits: np.ndarray,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
) -> np.ndarray:
    """temperature -> top-k -> top-p -> min-p -> normalise, in float64."""
    x = np.asarray(logits, dtype=np.float64)
    if x.ndim == 2:
        return np.stack([distribution(row, temperature, top_k, top_p, min_p) for row in x])
    _check_row(x)
    n = x.size
    out = np.zeros(n)
    if temperature == 0 or top_k == 1:
        out[int(np.argmax(x))] = 1.0  # np.argmax returns the first maximum
        return out
    e = np.exp((x - x.max()) / temperature)
    p = e / e.sum()
    ranked = order(p)
    n_keep = n
    if 0 < top_k < n:
        n_keep = top_k
    if top_p < 1.0:
        kept = p[ranked[:n_keep]]
        cum = np.cumsum(kept / kept.sum())
        reached = np.nonzero(cum >= top_p)[0]
        n_keep = int(reached[0]) + 1 if reached.size else n_keep
    chosen = ranked[:n_keep]
    if min_p > 0.0:
        chosen = chosen[p[chosen] >= min_p * p.max()]
    out[chosen] = p[chosen]
    return out / out.sum()


def top_p_ambiguous(
    logits: np.ndarray, temperature: float, top_k: int, top_p: float, tol: float = 1e-6
) -> bool:
    """True when a top-p cut sits within `tol` of a cumulative-mass boundary,
    where float32 and float64 arithmetic may legitimately disagree."""
    x = np.asarray(logits, dtype=np.float64)
    if top_p >= 1.0 or temperature == 0 or top_k == 1:
        return False
    e = np.exp((x - x.max()) / temperature)
    p = e / e.sum()
    kept = p[order(p)]
    if 0 < top_k < x.size:
        kept = kept[:top_k]
    cum = np.cumsum(kept / kept.sum())
    return bool(np.any(np.abs(cum - top_p) < tol))


def acceptance_rate(p: np.ndarray, q: np.ndarray) -> float:
    """Σ min(p, q) = 1 − TV(p, q)."""
    return float(np.minimum(np.asarray(p, np.float64), np.asarray(q, np.float64)).sum())


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """max(0, p − q), unnormalised."""
    return np.maximum(np.asarray(p, np.float64) - np.asarray(q, np.float64), 0.0)


def sample_inverse_cdf(w: np.ndarray, u: float) -> int:
    """First index whose running sum exceeds u · Σw."""
    w = np.asarray(w, dtype=np.float64)
    cum = np.cumsum(w)
    idx = int(np.searchsorted(cum, u * cum[-1], side="right"))
    if idx >= w.size:
        idx = int(np.nonzero(w > 0)[0][-1])
    return idx


def verify(
    target_logits: np.ndarray,
    draft_tokens: np.ndarray,
    draft_probs: Optional[np.ndarray],
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    uniform: Callable[[], float],
) -> tuple[int, int, list[float]]:
    """Speculative verification of one step, one uniform per test and per sample."""
    logits = np.asarray(target_logits, dtype=np.float64)
    gamma = logits.shape[0] - 1
    alphas: list[float] = []
    for i in range(gamma):
        p = distribution(logits[i], temperature, top_k, top_p, min_p)
        x = int(draft_tokens[i])
        if draft_probs is None:
            q = np.zeros_like(p)
            q[x] = 1.0
        else:
            q = np.asarray(draft_probs[i], dtype=np.float64)
        alphas.append(acceptance_rate(p, q))
        u = uniform()
        if u * q[x] < p[x]:
            continue
        r = residual(p, q)
        if r.sum() <= 1e-9:
            r = p
        return i, sample_inverse_cdf(r, uniform()), alphas
    p = distribution(logits[gamma], temperature, top_k, top_p, min_p)
    return gamma, sample_inverse_cdf(p, uniform()), alphas


# --- Philox-4x32-10, written out in Python to check the C++ generator ---------

_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK32 = 0xFFFFFFFF


def philox4x32_10(counter: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, int, int, int]:
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0 = _M0 * c0
        p1 = _M1 * c2
        c0, c1, c2, c3 = (
            (p1 >> 32) ^ c1 ^ k0,
            p1 & _MASK32,
            (p0 >> 32) ^ c3 ^ k1,
            p0 & _MASK32,
        )
        k0 = (k0 + _W0) & _MASK32
        k1 = (k1 + _W1) & _MASK32
    return c0, c1, c2, c3


def philox_uniform(seed: int, stream: int, n: int) -> float:
    """Draw n (0-based) of (seed, stream), as the C++ Rng computes it."""
    block = philox4x32_10(
        (n & _MASK32, (n >> 32) & _MASK32, stream & _MASK32, (stream >> 32) & _MASK32),
        (seed & _MASK32, (seed >> 32) & _MASK32),
    )
    bits = (block[1] << 32) | block[0]
    return (bits >> 11) * 2.0**-53
