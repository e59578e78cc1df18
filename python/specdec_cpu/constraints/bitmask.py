"""The token bitmask: which token ids a constraint allows at one position.

Layout (what ``ConstraintState.fill_mask`` writes and what the C++ kernels
will read as ``const uint32_t*``): one row per position of
``n_words(V) = ceil(V / 32)`` 32-bit words; token ``t`` is allowed iff bit
``t % 32`` of word ``t // 32`` is set::

    allowed(t) = (row[t >> 5] >> (t & 31)) & 1

Words are native (little-endian on every supported CPU), so viewed as bytes
token ``t`` is bit ``t % 8`` of byte ``t // 8`` (numpy's
``unpackbits(..., bitorder="little")``).  Bits of ids ``>= V`` in the last
word are never set.  Rows are numpy ``int32`` (llguidance's type) or
``uint32`` (the kernels'); the bits are the same.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

__all__ = ["n_words", "allocate", "allowed_ids", "to_bool", "from_ids", "check_row", "set_ids", "allows_only"]


def n_words(n_vocab: int) -> int:
    """Words in one row for a vocabulary of ``n_vocab`` ids."""
    if n_vocab <= 0:
        raise ValueError(f"n_vocab must be positive, got {n_vocab}")
    return (n_vocab + 31) // 32


def allocate(n_rows: int, n_vocab: int, dtype: "np.dtype | type" = np.int32) -> np.ndarray:
    """A zeroed ``(n_rows, n_words(n_vocab))`` C-contiguous bitmask."""
    if np.dtype(dtype) not in (np.dtype(np.int32), np.dtype(np.uint32)):
        raise TypeError(f"a bitmask is int32 or uint32 words, got {np.dtype(dtype)}")
    return np.zeros((n_rows, n_words(n_vocab)), dtype=dtype)


def check_row(row: np.ndarray, n_vocab: int) -> None:
    """Raise unless ``row`` is a writable, C-contiguous, 1-D int32/uint32
    array of ``n_words(n_vocab)`` words."""
    if not isinstance(row, np.ndarray):
        raise TypeError(f"a bitmask row must be a numpy array, got {type(row).__name__}")
    if row.dtype not in (np.dtype(np.int32), np.dtype(np.uint32)):
        raise TypeError(f"a bitmask row holds int32 or uint32 words, got {row.dtype}")
    if row.ndim != 1 or row.shape[0] != n_words(n_vocab):
        raise ValueError(f"a bitmask row for {n_vocab} tokens has shape ({n_words(n_vocab)},), got {row.shape}")
    if not row.flags.c_contiguous or not row.flags.writeable:
        raise ValueError("a bitmask row must be C-contiguous and writable")


def to_bool(row: np.ndarray, n_vocab: int) -> np.ndarray:
    """The row as ``n_vocab`` booleans."""
    bits = np.unpackbits(np.ascontiguousarray(row).view(np.uint8), bitorder="little")
    return bits[:n_vocab].astype(bool)


def allowed_ids(row: np.ndarray, n_vocab: int) -> np.ndarray:
    """The allowed token ids, increasing."""
    return np.flatnonzero(to_bool(row, n_vocab))


def from_ids(ids: Iterable[int], n_vocab: int, dtype: "np.dtype | type" = np.int32) -> np.ndarray:
    """A row allowing exactly ``ids``."""
    flags = np.zeros(n_words(n_vocab) * 32, dtype=np.uint8)
    idx = np.fromiter((int(t) for t in ids), dtype=np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= n_vocab):
        raise ValueError(f"token ids must be in [0, {n_vocab})")
    flags[idx] = 1
    return np.packbits(flags, bitorder="little").view(dtype).copy()


def set_ids(row: np.ndarray, ids: Iterable[int], allowed: bool) -> None:
    """Allow (``allowed``) or forbid each of ``ids`` in ``row``, in place."""
    words = row.view(np.uint32)
    for t in ids:
        bit = np.uint32(1 << (int(t) & 31))
        if allowed:
            words[int(t) >> 5] |= bit
        else:
            words[int(t) >> 5] &= ~bit


def allows_only(row: np.ndarray, ids_row: np.ndarray) -> bool:
    """Whether every id ``row`` allows is one ``ids_row`` allows (same layout)."""
    return not np.any(row.view(np.uint32) & ~ids_row.view(np.uint32))
