"""The sampling distribution a given engine's chain defines for a logits row.

Engines agree on what temperature, top-k, top-p and min-p mean but not on
the order they apply them in, and the order changes the distribution:

* ``"temperature-first"`` — temperature → top-k → top-p → min-p, the chain of
  specdec-cpu (``SamplingParams``), HF transformers and vLLM, and of llama.cpp
  tools run with ``--samplers "temperature;top_k;top_p;min_p"``.  The
  truncations see the tempered distribution.
* ``"temperature-last"`` — top-k → top-p → min-p → temperature, the chain of
  llama-cpp-python's ``Llama`` (and llama.cpp's default order, whose other
  samplers are off at their neutral settings).  The truncations are decided on
  the T = 1 distribution; temperature then reshapes the survivors.

Ties are broken towards the lower token id in both.  Temperature 0 (or
top_k = 1) is greedy in both chains: a point mass at the argmax.
"""

from __future__ import annotations

import numpy as np

from .. import sampling
from ..params import SamplingParams

__all__ = ["CHAINS", "TEMPERATURE_FIRST", "TEMPERATURE_LAST", "chain_distribution", "check_chain"]

TEMPERATURE_FIRST = "temperature-first"
TEMPERATURE_LAST = "temperature-last"
CHAINS = (TEMPERATURE_FIRST, TEMPERATURE_LAST)


def check_chain(chain: object) -> str:
    """``chain`` if it names a known chain, else a ValueError listing them."""
    if chain not in CHAINS:
        raise ValueError(f"chain must be one of {', '.join(repr(c) for c in CHAINS)}, got {chain!r}")
    return chain  # narrowed to str by the membership test


def chain_distribution(logits: np.ndarray, params: SamplingParams, chain: str = TEMPERATURE_FIRST) -> np.ndarray:
    """The final sampling distribution of logits rows ``(n, V)`` (or one row ``(V,)``).

    Returns float64 rows summing to 1, zero outside the kept support.
    """
    check_chain(chain)
    rows = np.asarray(logits, dtype=np.float32)
    if chain == TEMPERATURE_FIRST or params.greedy:
        p = sampling.distribution(np.ascontiguousarray(rows), params).astype(np.float64)
        return p / p.sum(axis=-1, keepdims=True)  # exactly normalised in float64
    # Temperature last: the support is what the truncations keep at T = 1 ...
    untempered = SamplingParams(temperature=1.0, top_k=params.top_k, top_p=params.top_p, min_p=params.min_p)
    keep = sampling.distribution(np.ascontiguousarray(rows), untempered) > 0
    # ... and the probabilities are the tempered softmax over that support.
    x = rows.astype(np.float64)
    top = np.max(np.where(keep, x, -np.inf), axis=-1, keepdims=True)
    w = np.where(keep, np.exp((x - top) / params.temperature), 0.0)
    return w / w.sum(axis=-1, keepdims=True)
