"""Where a draft model's logits columns sit in the target's vocabulary."""

from __future__ import annotations

from typing import Optional

import numpy as np

from .. import sampling
from ..params import SamplingParams

__all__ = ["DraftVocab"]


class DraftVocab:
    """Samples a draft token and lays its q row out over the target's ids.

    A draft of the target's vocabulary uses its first ``min(V_draft,
    V_target)`` columns as they are (a draft with fewer rows has q = 0 on the
    ids it lacks; one with more only ever sees the target's ids).  A draft
    cut to part of the vocabulary (engine/vocab_cut.py) gives, for each of
    its columns, the target id it stands for (``source_ids``, increasing):
    q is sampled over its columns and scattered to those ids, run by run,
    and q = 0 elsewhere, which the exact verify needs and nothing more
    (docs/math.md §10).  A q row handed to :meth:`sample_into` must be zero
    outside those ids, as a row written only by this map stays.
    """

    def __init__(self, draft_n_vocab: int, target_n_vocab: int, source_ids: Optional[np.ndarray] = None) -> None:
        if source_ids is None:
            self.ids = np.arange(min(draft_n_vocab, target_n_vocab), dtype=np.int64)
        else:
            self.ids = np.asarray(source_ids, dtype=np.int64)
            if len(self.ids) != draft_n_vocab or (len(self.ids) and int(self.ids[-1]) >= target_n_vocab):
                raise ValueError(f"source_ids must give each of the draft's {draft_n_vocab} ids an id below "
                                 f"the target's {target_n_vocab}")
        self.n_columns = len(self.ids)
        breaks = np.flatnonzero(np.diff(self.ids) != 1) + 1
        starts = np.concatenate([[0], breaks]).astype(int)
        ends = np.concatenate([breaks, [self.n_columns]]).astype(int)
        #: (first target id, first column, length) of each run of consecutive ids
        self.runs = [(int(self.ids[a]), int(a), int(b - a)) for a, b in zip(starts, ends)]
        self._direct = self.runs == [(0, 0, self.n_columns)]
        self._scratch = None if self._direct else np.empty(self.n_columns, dtype=np.float32)

    def sample_into(self, logits: np.ndarray, params: SamplingParams, rng: sampling.Rng, q_row: np.ndarray,
                    changes: sampling.Changes = sampling.NO_CHANGES) -> int:
        """Sample from the draft's ``logits`` row under ``params``, first
        changed as the target's row of the same position (``changes``, one
        row over the target's ids); write q over the target's ids into
        ``q_row``; return the target id drawn, or -1 when the changes leave
        none of the draft's ids possible (a grammar forcing a token a cut
        draft lacks: nothing can be drafted there)."""
        n = self.n_columns
        draft_changes = self.columns(changes)
        if draft_changes is None:
            return -1
        if self._direct:  # no copy: q goes straight into the row
            return sampling.sample_into(logits[:n], params, rng, q_row[:n], draft_changes)
        scratch = self._scratch
        assert scratch is not None  # a cut draft's q is sampled into it
        column = sampling.sample_into(logits[:n], params, rng, scratch, draft_changes)
        for first_id, first_col, length in self.runs:
            q_row[first_id:first_id + length] = scratch[first_col:first_col + length]
        return int(self.ids[column])

    def columns(self, changes: sampling.Changes) -> "sampling.Changes | None":
        """``changes`` over the target's ids as changes over the draft's
        columns (None when its mask allows none of them)."""
        if changes.mask is None and changes.sparse is None:
            return changes
        n = self.n_columns
        mask, sparse = changes.mask, changes.sparse
        if mask is not None:
            if self._direct:
                mask = mask[:(n + 31) // 32]
            else:  # a column is allowed where the target id it stands for is
                bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[self.ids]
                mask = np.packbits(np.pad(bits, (0, -n % 32)), bitorder="little").view(np.uint32)
            if not mask.any():
                return None
        if sparse is not None:
            offsets, ids, pos, neg, add = sparse
            if self._direct:
                keep = ids < n
                cols = ids[keep]
            else:
                at = np.searchsorted(self.ids, ids)
                keep = (at < n) & (self.ids[np.minimum(at, n - 1)] == ids)
                cols = at[keep].astype(np.int32)
            sparse = (np.array([0, int(keep.sum())], dtype=np.int64), np.ascontiguousarray(cols, dtype=np.int32),
                      pos[keep], neg[keep], add[keep])
        return sampling.Changes(mask, sparse)
