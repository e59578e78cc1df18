"""Probability-rank bins: which ranks the chi-square groups together.

A token's rank at a position is its place in that position's distribution
(0 = the most likely outcome; ties go to the lower id).  Ranks are grouped
geometrically — 0, 1, 2, 3–4, 5–7, 8–15, 16–31, ..., 2048–4095 — so that the
head, where the mass is, keeps fine bins and the long tail needs few; every
rank from 4096 on is one last bin (resolving it would need a full sort of
each row, and real distributions hold little mass there).  After all positions
are pooled, bins whose expected count is too small for the normal
approximation are merged with their neighbours (see :func:`merge_plan`).
"""

from __future__ import annotations

from typing import List, Sequence

import numpy as np

__all__ = ["RANK_EDGES", "N_FIXED_BINS", "TOP_RANKS", "bin_label", "merge_plan", "merge_matrix"]


#: Ranks below this are binned finely; all ranks from it on share the last bin.
TOP_RANKS = 4096


def _edges() -> np.ndarray:
    edges = [0, 1, 2, 3, 5, 8]
    while edges[-1] < TOP_RANKS:
        edges.append(edges[-1] * 2)
    return np.asarray(edges, dtype=np.int64)


#: Lower rank of every fixed bin: bin i holds ranks [RANK_EDGES[i], RANK_EDGES[i+1]),
#: the last one every rank from RANK_EDGES[-1] = TOP_RANKS on.
RANK_EDGES: np.ndarray = _edges()
N_FIXED_BINS = len(RANK_EDGES)


def bin_label(first_bin: int, last_bin: int, n_vocab: int = 0) -> str:
    """``"0"``, ``"3-4"``, ``"16-63"``, ``"4096+"``: the ranks fixed bins
    ``first_bin..last_bin`` hold together (capped at ``n_vocab - 1`` when given)."""
    first = int(RANK_EDGES[first_bin])
    if last_bin >= N_FIXED_BINS - 1 and not 0 < n_vocab <= TOP_RANKS:
        return f"{first}+"
    last = int(RANK_EDGES[min(last_bin + 1, N_FIXED_BINS - 1)]) - 1
    if n_vocab > 0:
        last = min(last, n_vocab - 1)
    return str(first) if first >= last else f"{first}-{last}"


def merge_plan(expected: "Sequence[float] | np.ndarray", min_expected: float) -> List[List[int]]:
    """Groups of consecutive fixed bins, each expecting >= ``min_expected`` counts.

    Bins are taken in rank order and a group is closed as soon as it expects
    enough; a short last group joins the one before it.  Bins expecting
    nothing at all (ranks beyond every support) are dropped.  Returns at
    least one group when anything is expected.
    """
    live = [i for i, e in enumerate(expected) if e > 0]
    groups: List[List[int]] = []
    current: List[int] = []
    mass = 0.0
    for i in live:
        current.append(i)
        mass += expected[i]
        if mass >= min_expected:
            groups.append(current)
            current, mass = [], 0.0
    if current:
        if groups:
            groups[-1].extend(current)
        else:
            groups.append(current)
    return groups


def merge_matrix(groups: List[List[int]], n_fixed: int) -> np.ndarray:
    """The 0/1 matrix M with ``merged = M @ fixed`` for counts (and M C Mᵀ for covariances)."""
    m = np.zeros((len(groups), n_fixed))
    for g, members in enumerate(groups):
        m[g, members] = 1.0
    return m
