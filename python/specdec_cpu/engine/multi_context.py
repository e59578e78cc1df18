"""LlamaMultiContext: one llama.cpp context holding many sequences, decoded together.

A server speculating for several requests wants every request's rows in ONE
``llama_decode``: on a memory-bound CPU target the weights are read once per
pass, so rows are nearly free until the pass turns compute-bound (see
docs/serving.md).  llama.cpp supports this directly: every row of a batch
carries its sequence id and position, and ``llama_memory_seq_rm`` cuts one
sequence back without touching the others.

The KV cache is *unified* (``kv_unified = true``): all sequences share one
pool of cells.  Without it llama.cpp gives each sequence a stream of its own
and splits a batch whose sequences contribute different numbers of rows into
several micro-batches (``split_equal``), i.e. several passes over the
weights, exactly what batching is meant to avoid.  A unified cache also lets
sequences share prompt-prefix cells (``copy_prefix``).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, NamedTuple, Optional, Sequence

import numpy as np

from ..errors import ContextOverflowError, ModelLoadError, UnsupportedModelError
from .backend import clear_log_errors, describe_failure, lib
from .context import _DECODE_ERRORS, _KV_TYPES, DecodeError, _check_int, _get_logits_ith_addr
from .lifetime import Closable

if TYPE_CHECKING:
    from .weights import LlamaWeights

__all__ = ["LlamaMultiContext", "LogitRows", "SequenceView"]


class _Part(NamedTuple):
    """Rows for one sequence, as ``decode`` reads them (``core.protocols.Rows``
    or anything with these three attributes)."""

    seq: int
    tokens: Sequence[int]
    n_logits: int = 0


@dataclass(frozen=True)
class LogitRows:
    """Where one sequence's logits rows are after a batched decode.

    ``address`` points to ``n_rows`` contiguous float32 rows of ``n_vocab``
    values in llama.cpp's buffer, valid until the context's next ``decode``.
    """

    address: int
    n_rows: int
    n_vocab: int

    def view(self) -> np.ndarray:
        """A read-only ``(n_rows, n_vocab)`` zero-copy array over the rows."""
        arr = self._rows()
        arr.flags.writeable = False
        return arr

    def mask_columns(self, ids: np.ndarray, rows: Optional[Sequence[int]] = None) -> None:
        """Set columns ``ids`` of ``rows`` (default: every row) to −∞ in
        llama.cpp's buffer (a token banned before sampling; the rows are
        rewritten by the next ``decode``)."""
        if rows is None:
            self._rows()[:, ids] = -np.inf
        else:
            self._rows()[np.ix_(np.asarray(rows, dtype=np.int64), ids)] = -np.inf

    def _rows(self) -> np.ndarray:
        buf = (ctypes.c_float * (self.n_rows * self.n_vocab)).from_address(self.address)
        # numpy's stubs do not see a ctypes array's buffer protocol
        return np.frombuffer(buf, dtype=np.float32).reshape(self.n_rows, self.n_vocab)  # type: ignore[call-overload]


class LlamaMultiContext(Closable):
    """A llama.cpp context over :class:`LlamaWeights` holding ``n_seq`` sequences.

    Each sequence may hold up to ``n_ctx`` tokens; the unified KV cache has
    ``n_ctx * n_seq`` cells, so every sequence can always reach its limit.
    :meth:`decode` appends rows to any number of sequences in one
    ``llama_decode`` call (at most ``n_batch`` rows in all, so that they form
    a single micro-batch: one pass over the weights).

    The context keeps a mirror of the token ids each sequence holds, updated
    only after llama.cpp succeeded; a failed decode leaves every sequence as
    it was.  Not thread-safe: one thread drives it (the scheduler).

    ``flash_attn`` defaults to on here, for two reasons.  Isolation: without
    it, attention multiplies every cell of the unified cache by its weight,
    0 for other sequences' cells, and 0 × NaN is NaN, so one request whose
    input drives the model to NaN poisons every other sequence's rows and
    caches (measured; the flash-attention kernel skips masked cells).
    Memory: without it llama.cpp materialises an attention matrix of
    n_batch × (all cells) floats, about a gigabyte for eight 4096-token
    sequences.  Logits differ from a one-sequence context by up to ~3e-2;
    exactness does not depend on it (the target distribution is whatever
    the target's pass computes).
    """

    def __init__(self, weights: "LlamaWeights", *, n_seq: int, n_ctx: int = 4096, n_batch: int = 512,
                 n_threads: Optional[int] = None, flash_attn: bool = True, kv_type: str = "f16") -> None:
        self._ctx: Optional[int] = None
        n_seq = _check_int("n_seq", n_seq)
        if n_seq > 256:
            raise ValueError(f"n_seq must be <= 256 (llama.cpp's limit), got {n_seq}")
        n_ctx = _check_int("n_ctx", n_ctx)
        n_batch = _check_int("n_batch", n_batch)
        n_threads = _check_int("n_threads", (os.cpu_count() or 1) if n_threads is None else n_threads)
        if kv_type not in _KV_TYPES:
            raise ValueError(f"kv_type must be one of {sorted(_KV_TYPES)}, got {kv_type!r}")
        if not weights.can_truncate:
            raise UnsupportedModelError(
                f"{weights.path} ({weights.architecture}) is a recurrent/hybrid model: its cache cannot "
                "drop rejected draft tokens, so it cannot be batched for speculative decoding")
        self._weights = weights
        self._n_seq, self._n_ctx, self._n_batch, self._n_threads = n_seq, n_ctx, n_batch, n_threads
        self._n_vocab = weights.n_vocab
        self._input_map, self._n_input = weights.input_map, weights.n_input_ids

        params = lib.llama_context_default_params()
        params.n_ctx = n_ctx * n_seq
        params.n_batch = n_batch
        params.n_ubatch = n_batch  # one micro-batch per decode: one pass over the weights
        params.n_seq_max = n_seq
        params.kv_unified = True
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.no_perf = True
        params.flash_attn_type = 1 if flash_attn else 0
        params.type_k = params.type_v = _KV_TYPES[kv_type]
        if hasattr(params, "swa_full"):
            params.swa_full = True  # a sliding-window cache must be able to roll back
        if hasattr(params, "n_outputs_max"):
            params.n_outputs_max = 0  # = n_batch
        clear_log_errors()
        ctx = lib.llama_init_from_model(weights.model_ptr, params)
        if not ctx:
            reason = describe_failure("llama.cpp could not create the context (out of memory?)")
            raise ModelLoadError(f"failed to create a {n_seq}-sequence context (n_ctx={n_ctx} each, "
                                 f"n_batch={n_batch}) for {weights.path}: {reason}")
        self._ctx = ctx
        self._mem = lib.llama_get_memory(ctx)

        # The batch lives in numpy arrays we own; each row's seq_id pointer is
        # aimed once at its slot of _seq, so a step writes sequence ids with
        # one vectorised assignment instead of a ctypes write per row.
        self._tok = np.zeros(n_batch, dtype=np.int32)
        self._pos = np.zeros(n_batch, dtype=np.int32)
        self._seq = np.zeros(n_batch, dtype=np.int32)
        self._n_seq_id = np.ones(n_batch, dtype=np.int32)
        self._out = np.zeros(n_batch, dtype=np.int8)
        seq_ptrs = (ctypes.POINTER(ctypes.c_int32) * n_batch)()
        base = self._seq.ctypes.data
        for i in range(n_batch):
            seq_ptrs[i] = ctypes.cast(base + 4 * i, ctypes.POINTER(ctypes.c_int32))
        self._seq_ptrs = seq_ptrs
        batch = lib.llama_batch()
        batch.embd = None
        batch.token = self._tok.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        batch.pos = self._pos.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        batch.n_seq_id = self._n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        batch.seq_id = ctypes.cast(seq_ptrs, type(batch.seq_id))
        batch.logits = self._out.ctypes.data_as(type(batch.logits))
        self._batch = batch

        self._tokens: List[List[int]] = [[] for _ in range(n_seq)]
        self._row_bytes = self._n_vocab * 4
        weights._register(self)

    # -- properties ------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    @property
    def n_seq(self) -> int:
        """Number of sequences (slots) the context holds."""
        return self._n_seq

    @property
    def n_ctx(self) -> int:
        """Most tokens one sequence may hold."""
        return self._n_ctx

    @property
    def n_batch(self) -> int:
        """Most rows one :meth:`decode` may carry."""
        return self._n_batch

    @property
    def n_threads(self) -> int:
        return self._n_threads

    @property
    def weights(self) -> "LlamaWeights":
        return self._weights

    @property
    def closed(self) -> bool:
        return self._ctx is None

    def n_past(self, seq: int) -> int:
        """Tokens sequence ``seq`` holds."""
        return len(self._tokens[self._check_seq(seq)])

    def tokens(self, seq: int) -> List[int]:
        """The token ids sequence ``seq`` holds (the mirror itself: do not modify)."""
        return self._tokens[self._check_seq(seq)]

    # -- cache edits -----------------------------------------------------

    def decode(self, parts: Sequence[_Part]) -> List[Optional[LogitRows]]:
        """Append every part's tokens to its sequence in one ``llama_decode``.

        Returns, per part, where its ``n_logits`` rows of logits are (None
        for parts that asked for none).  Each sequence may appear at most
        once.  On any error no sequence changes.
        """
        ctx = self._require()
        n_total = 0
        seen = set()
        for part in parts:
            seq = self._check_seq(part.seq)
            if seq in seen:
                raise ValueError(f"sequence {seq} appears twice in one decode")
            seen.add(seq)
            n = len(part.tokens)
            if n == 0:
                raise ValueError(f"no tokens for sequence {seq}")
            if not 0 <= part.n_logits <= n:
                raise ValueError(f"n_logits must be in [0, {n}] for sequence {seq}, got {part.n_logits}")
            if len(self._tokens[seq]) + n > self._n_ctx:
                raise ContextOverflowError(
                    f"sequence {seq}: {len(self._tokens[seq])} cached + {n} new tokens > n_ctx={self._n_ctx}")
            n_total += n
        if n_total == 0:
            return []
        if n_total > self._n_batch:
            raise ValueError(f"{n_total} rows in one decode exceed n_batch={self._n_batch}")

        tok, pos, seqs, out = self._tok, self._pos, self._seq, self._out
        row = 0
        firsts: List[int] = []
        for part in parts:
            n = len(part.tokens)
            arr = np.asarray(part.tokens, dtype=np.int64)
            lo, hi = int(arr.min()), int(arr.max())
            if lo < 0 or hi >= self._n_input:
                raise ValueError(f"token id {lo if lo < 0 else hi} out of range [0, {self._n_input}) "
                                 f"for sequence {part.seq}")
            tok[row:row + n] = arr if self._input_map is None else self._input_map[arr]
            p0 = len(self._tokens[part.seq])
            pos[row:row + n] = np.arange(p0, p0 + n, dtype=np.int32)
            seqs[row:row + n] = part.seq
            out[row:row + n] = 0
            out[row + n - part.n_logits:row + n] = 1
            firsts.append(row + n - part.n_logits)
            row += n
        self._batch.n_tokens = n_total
        try:
            rc = int(lib.llama_decode(ctx, self._batch))
        except BaseException:
            self._roll_back(parts)
            raise
        if rc != 0:
            self._roll_back(parts)
            what = _DECODE_ERRORS.get(rc, "fatal error" if rc < 0 else "warning")
            raise DecodeError(f"llama_decode failed with code {rc} ({what}) on {n_total} rows of "
                              f"{len(parts)} sequences of {self._weights.path}", rc)
        results: List[Optional[LogitRows]] = []
        for part, first in zip(parts, firsts):
            self._tokens[part.seq].extend(int(t) for t in part.tokens)
            results.append(self._rows(ctx, first, part.n_logits) if part.n_logits else None)
        return results

    def truncate(self, seq: int, n: int) -> None:
        """Keep the first ``n`` tokens of sequence ``seq``."""
        self._require()
        held = self._tokens[self._check_seq(seq)]
        if not 0 <= n <= len(held):
            raise ValueError(f"truncate length must be in [0, {len(held)}] for sequence {seq}, got {n}")
        if n == len(held):
            return
        if not lib.llama_memory_seq_rm(self._mem, seq, n, -1):
            raise UnsupportedModelError(f"llama.cpp refused to cut sequence {seq} of {self._weights.path} "
                                        f"back to {n} tokens")
        del held[n:]

    def clear(self, seq: int) -> None:
        """Empty sequence ``seq``."""
        self.truncate(seq, 0)

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Make empty sequence ``dst`` hold the first ``n`` tokens of ``src``.

        In a unified cache this only tags the cells with ``dst`` as well: the
        prefix is neither recomputed nor stored twice.
        """
        self._require()
        if self._check_seq(dst) == self._check_seq(src):
            raise ValueError("copy_prefix needs two different sequences")
        if self._tokens[dst]:
            raise ValueError(f"copy_prefix target sequence {dst} is not empty")
        if not 0 <= n <= len(self._tokens[src]):
            raise ValueError(f"copy_prefix length must be in [0, {len(self._tokens[src])}], got {n}")
        if n == 0:
            return
        lib.llama_memory_seq_cp(self._mem, src, dst, 0, n)
        self._tokens[dst] = self._tokens[src][:n]

    # -- internals -------------------------------------------------------

    def _rows(self, ctx: int, first: int, n: int) -> LogitRows:
        addr = _get_logits_ith_addr(ctx, first)
        if not addr:
            raise DecodeError(f"llama.cpp returned no logits for batch row {first}", -1)
        if n > 1 and _get_logits_ith_addr(ctx, first + n - 1) != addr + (n - 1) * self._row_bytes:
            raise DecodeError("llama.cpp's logits rows of one sequence are not contiguous", -1)  # pragma: no cover
        return LogitRows(addr, n, self._n_vocab)

    def _roll_back(self, parts: Sequence[_Part]) -> None:
        for part in parts:
            lib.llama_memory_seq_rm(self._mem, part.seq, len(self._tokens[part.seq]), -1)

    def _check_seq(self, seq: int) -> int:
        if isinstance(seq, bool) or not isinstance(seq, (int, np.integer)) or not 0 <= seq < self._n_seq:
            raise ValueError(f"sequence id must be an int in [0, {self._n_seq}), got {seq!r}")
        return int(seq)

    def _require(self) -> int:
        if self._ctx is None:
            raise ValueError("LlamaMultiContext is closed")
        return self._ctx

    def close(self) -> None:
        """Free the context (idempotent)."""
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            try:
                lib.llama_free(ctx)
            except Exception:  # interpreter shutdown
                pass

    def __repr__(self) -> str:
        state = "closed" if self._ctx is None else f"{self._n_seq} sequences of {self._n_ctx}"
        return f"LlamaMultiContext({self._weights.path!r}, {state})"


class SequenceView:
    """One sequence of a :class:`LlamaMultiContext` as a ``CausalLM``
    (what calibration times passes with)."""

    def __init__(self, ctx: LlamaMultiContext, seq: int) -> None:
        self._ctx, self._seq = ctx, ctx._check_seq(seq)

    @property
    def n_vocab(self) -> int:
        return self._ctx.n_vocab

    @property
    def n_ctx(self) -> int:
        return self._ctx.n_ctx

    @property
    def n_past(self) -> int:
        return self._ctx.n_past(self._seq)

    def eval(self, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        """Append ``tokens`` to the sequence; the last ``n_logits`` rows' logits."""
        rows = self._ctx.decode([_Part(self._seq, list(tokens), n_logits)])[0]
        return rows.view() if rows is not None else np.empty((0, self.n_vocab), dtype=np.float32)

    def truncate(self, n: int) -> None:
        self._ctx.truncate(self._seq, n)
