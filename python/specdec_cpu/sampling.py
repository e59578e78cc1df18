"""Vocabulary-wide sampling steps, each one call into the C++ extension.

Every function here releases the GIL inside the kernel and validates its
inputs with errors that name the argument and the expected shape.  The
distributions follow ``SamplingParams``: temperature -> top-k -> top-p ->
min-p -> normalise, ties broken towards the lower token id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import _core
from .params import SamplingParams

Rng = _core.Rng
"""Counter-based random generator: ``Rng(seed, stream=0)``.

Cheap to create; a (seed, stream) pair reproduces the same draws.  The decoder
uses stream 0 for drafting and stream 1 for verification so the two never
share draws.
"""

DRAFT_STREAM = 0
VERIFY_STREAM = 1


@dataclass(frozen=True)
class Changes:
    """What changes logits rows before the sampling chain (docs/math.md §11),
    row by row, in C++:

    - ``mask``: ``(rows, ceil(V/32))`` uint32 (or ``(ceil(V/32),)`` for one
      row); token t is allowed iff bit ``t % 32`` of word ``t // 32`` is set
      (a grammar's allowed set; the rest become −∞);
    - ``sparse``: ``(offsets, ids, scale_pos, scale_neg, add)``, row r's
      entries at ``offsets[r]:offsets[r+1]`` (int64 offsets, int32 ids,
      float32 values): the logit x of each id becomes
      ``(x > 0 ? x·scale_pos : x·scale_neg) + add`` (penalties and biases;
      ``add = −inf`` bans a token).

    The same changes apply to a position's target and draft rows, so the
    verification stays exact.
    """

    mask: Optional[np.ndarray] = None
    sparse: Optional[tuple] = None

    def row(self, r: int) -> "Changes":
        """Row ``r``'s changes alone (for sampling one row)."""
        mask = None if self.mask is None else self.mask[r]
        sparse = None
        if self.sparse is not None:
            offsets, ids, pos, neg, add = self.sparse
            a, b = int(offsets[r]), int(offsets[r + 1])
            sparse = (np.array([0, b - a], dtype=np.int64), ids[a:b], pos[a:b], neg[a:b], add[a:b])
        return Changes(mask, sparse)


NO_CHANGES = Changes()


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of verifying one step of γ draft tokens.

    Attributes:
        n_accepted: how many leading draft tokens were accepted (0..γ).
        token: the token emitted after them: a residual sample at the first
            rejection, or the bonus token from row γ when all were accepted.
        alphas: Σ min(p, q) for each verified row (length n_accepted + 1 when
            a rejection happened, γ when all were accepted).
    """

    n_accepted: int
    token: int
    alphas: np.ndarray


def active_isa() -> str:
    """The instruction set the kernels run on: ``scalar``, ``avx2``, ``avx512`` or ``neon``."""
    return _core.active_isa()


def supported_isas() -> list[str]:
    """Every kernel path this CPU can run, slowest first."""
    return list(_core.supported_isas())


def set_isa(name: str) -> None:
    """Force a kernel path (also settable at import with ``SPECDEC_ISA``)."""
    _core.set_isa(name)


def distribution(logits: np.ndarray, params: SamplingParams, changes: Changes = NO_CHANGES) -> np.ndarray:
    """The final sampling distribution of a row ``(V,)`` or rows ``(n, V)``
    (each row first changed by ``changes``).

    Returns float32 of the same shape: zeros outside the kept support, each
    row summing to 1.  Greedy parameters give a one-hot at the argmax.
    """
    return _core.distribution(logits, *_knobs(params), changes.mask, changes.sparse)


def sample(logits: np.ndarray, params: SamplingParams, rng: "_core.Rng", changes: Changes = NO_CHANGES) -> int:
    """Draw one token id from the distribution of a logits row ``(V,)``."""
    return _core.sample(logits, *_knobs(params), rng, changes.mask, changes.sparse)


def sample_into(logits: np.ndarray, params: SamplingParams, rng: "_core.Rng", out: np.ndarray,
                changes: Changes = NO_CHANGES) -> int:
    """Draw one token and keep the distribution it was drawn from.

    ``out`` is a preallocated float32 row at least as long as ``logits``; it
    receives the distribution, zero-padded past ``len(logits)`` (a draft with
    fewer vocabulary rows than the target gives q = 0 on the ids it lacks).
    """
    return _core.sample_into(logits, *_knobs(params), rng, out, changes.mask, changes.sparse)


def mask_tokens(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``logits`` with columns ``ids`` set to −∞ (probability 0 under every
    sampling pipeline): in place when the array is writeable, else a copy."""
    if not logits.flags.writeable:
        logits = logits.copy()
    logits[..., ids] = -np.inf
    return logits


def acceptance_rate(p: np.ndarray, q: np.ndarray) -> float:
    """Σ min(p, q) = 1 − TV(p, q): the probability a draft from q is accepted."""
    return _core.acceptance_rate(p, q)


def verify(
    target_logits: np.ndarray,
    draft_tokens: np.ndarray,
    draft_probs: Optional[np.ndarray],
    params: SamplingParams,
    rng: "_core.Rng",
    changes: Changes = NO_CHANGES,
) -> VerifyResult:
    """Exact speculative verification of one step.

    Args:
        target_logits: ``(γ+1, V)`` float32, C-contiguous; row i is the
            target's logits for the position of draft token i, row γ the bonus.
        draft_tokens: ``(γ,)`` integer token ids.
        draft_probs: ``(γ, V)`` float32, the q rows the tokens were drawn
            from, or ``None`` for a deterministic drafter (q is one-hot).
        params: sampling parameters applied to the target rows.
        rng: the verification stream.
        changes: the γ + 1 rows' changes before sampling (a grammar's mask,
            penalties), each for the prefix its row continues.

    Rows after the first rejection are not processed.
    """
    n, token, alphas = _core.verify(target_logits, _tokens(draft_tokens), draft_probs, *_knobs(params), rng,
                                    changes.mask, changes.sparse)
    return VerifyResult(n, token, alphas)


def verify_pointer(
    logits_address: int,
    n_rows: int,
    n_vocab: int,
    draft_tokens: np.ndarray,
    draft_probs: Optional[np.ndarray],
    params: SamplingParams,
    rng: "_core.Rng",
) -> VerifyResult:
    """``verify`` over a logits buffer owned by someone else (llama.cpp).

    ``logits_address`` points to ``n_rows * n_vocab`` contiguous float32 values
    that stay valid for the duration of the call; nothing is copied.
    """
    n, token, alphas = _core.verify_ptr(
        logits_address, n_rows, n_vocab, _tokens(draft_tokens), draft_probs, *_knobs(params), rng
    )
    return VerifyResult(n, token, alphas)


def _knobs(params: SamplingParams) -> tuple[float, int, float, float]:
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    return (float(params.temperature), int(params.top_k), float(params.top_p), float(params.min_p))


def _tokens(draft_tokens: np.ndarray) -> np.ndarray:
    # int32/int64 pass through (the kernel range-checks every id); other
    # integer types widen to int64 so an out-of-range id is never wrapped
    # into a valid one by a narrowing cast.
    arr = np.asarray(draft_tokens)
    if arr.size == 0:
        return np.zeros(arr.shape, dtype=np.int32)
    if arr.dtype == np.int32 or arr.dtype == np.int64:
        return np.ascontiguousarray(arr)
    if arr.dtype.kind in "iu":
        return np.ascontiguousarray(arr, dtype=np.int64)
    raise TypeError(f"draft_tokens must be integer token ids, got dtype {arr.dtype}")
