"""LlamaContext: one llama.cpp context (KV cache) implementing ``CausalLM``."""

from __future__ import annotations

import ctypes
import os
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, cast

import numpy as np

from ..errors import ContextOverflowError, ModelLoadError, SpecDecError, UnsupportedModelError
from .backend import clear_log_errors, describe_failure, lib
from .lifetime import Closable

if TYPE_CHECKING:
    from .weights import LlamaWeights

__all__ = ["LlamaContext", "DecodeError"]

_SEQ = 0  # the one sequence every context holds

# Private prototypes of two hot functions, returning the address as an int
# (avoids building a ctypes pointer object per call).  They are made from the
# public functions' addresses, so llama_cpp's own prototypes stay untouched.
_get_logits_ith_addr = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)(
    cast(int, ctypes.cast(lib.llama_get_logits_ith, ctypes.c_void_p).value)  # a function's address: never NULL
)

_KV_TYPES = {"f32": 0, "f16": 1}  # ggml_type of the KV cache

_DECODE_ERRORS = {
    1: "no KV-cache slot for the batch (context full or fragmented)",
    2: "aborted",
    -1: "invalid input batch",
}


def free_context(ctx: Optional[int], batch: Any = None) -> None:
    """Free a llama.cpp context and its batch (either may be None; at interpreter shutdown, when
    llama.cpp may be gone already, nothing is done)."""
    try:
        if batch is not None:
            lib.llama_batch_free(batch)
        if ctx is not None:
            lib.llama_free(ctx)
    except Exception:  # interpreter shutdown
        pass


class DecodeError(SpecDecError):
    """llama_decode failed; ``code`` is its return value.  The cache is left
    as it was before the failing ``eval``."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _check_int(name: str, value: object, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


class LlamaContext(Closable):
    """A llama.cpp context over :class:`LlamaWeights`: one sequence, one KV cache.

    Implements :class:`specdec_cpu.core.protocols.CausalLM`.  Not thread-safe: use one
    context per thread (contexts may share weights).

    ``eval`` returns a zero-copy, read-only ``(n_logits, n_vocab)`` float32 view
    of llama.cpp's logits buffer.  It is valid until the next ``eval`` or
    ``close`` on this context (a later ``eval`` may overwrite or reallocate the
    buffer); copy it to keep it longer.  ``truncate`` does not touch it.

    ``flash_attn`` (default off) and ``kv_type`` (``"f16"`` or ``"f32"``) trade
    speed/memory against agreement between batched and one-by-one logits.
    """

    def __init__(self, weights: "LlamaWeights", *, n_ctx: int = 4096, n_batch: int = 512,
                 n_threads: Optional[int] = None, flash_attn: bool = False,
                 kv_type: str = "f16") -> None:
        self._ctx: Optional[int] = None
        self._batch = None
        n_ctx = _check_int("n_ctx", n_ctx)
        n_batch = _check_int("n_batch", n_batch)
        if n_threads is None:
            n_threads = os.cpu_count() or 1
        n_threads = _check_int("n_threads", n_threads)
        n_batch = min(n_batch, n_ctx)
        if kv_type not in _KV_TYPES:
            raise ValueError(f"kv_type must be one of {sorted(_KV_TYPES)}, got {kv_type!r}")

        self._weights = weights
        model = weights.model_ptr
        self._n_vocab = weights.n_vocab
        self._input_map, self._n_input = weights.input_map, weights.n_input_ids
        self._n_ctx = n_ctx
        self._n_batch = n_batch
        self._n_threads = n_threads
        self._can_truncate = weights.can_truncate

        params = lib.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = 1
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.no_perf = True
        # Flash attention off by default: a batched pass and one-token passes
        # then differ by ~1e-5 in the logits with an F32 KV cache and ~4e-3
        # with the default F16 one; with flash attention by ~3e-2 (measured
        # on the tiny test models; docs/audit.md has the table).
        params.flash_attn_type = 1 if flash_attn else 0
        params.type_k = _KV_TYPES[kv_type]
        params.type_v = _KV_TYPES[kv_type]
        if hasattr(params, "swa_full"):
            params.swa_full = True  # a sliding-window cache must be able to roll back
        if hasattr(params, "n_outputs_max"):
            params.n_outputs_max = 0  # = n_batch
        if hasattr(params, "n_outputs_max_per_seq"):
            params.n_outputs_max_per_seq = 0
        clear_log_errors()
        ctx = lib.llama_init_from_model(model, params)
        if not ctx:
            reason = describe_failure("llama.cpp could not create the context (out of memory?)")
            raise ModelLoadError(
                f"failed to create a context (n_ctx={n_ctx}, n_batch={n_batch}) for {weights.path}: {reason}"
            )
        self._ctx = ctx
        self._mem = lib.llama_get_memory(ctx)

        batch = lib.llama_batch_init(n_batch, 0, 1)
        self._batch = batch
        self._tok = np.ctypeslib.as_array(batch.token, shape=(n_batch,))
        self._pos = np.ctypeslib.as_array(batch.pos, shape=(n_batch,))
        self._out = np.ctypeslib.as_array(batch.logits, shape=(n_batch,))
        np.ctypeslib.as_array(batch.n_seq_id, shape=(n_batch,))[:] = 1
        for i in range(n_batch):
            batch.seq_id[i][0] = _SEQ
        self._out[:] = 0

        self._tokens: List[int] = []
        # True while the KV cache may hold cells past len(_tokens): set before
        # any change and cleared after it, so that an interruption in between
        # (KeyboardInterrupt lands between any two bytecodes) is repaired by
        # the next eval instead of failing it with "inconsistent positions".
        self._dirty = False
        self._logits_addr = 0
        self._logits_rows = 0
        self._row_bytes = self._n_vocab * 4
        weights._register(self)

    # -- CausalLM --------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    @property
    def n_ctx(self) -> int:
        """Maximum number of tokens this context holds (as requested)."""
        return self._n_ctx

    @property
    def n_past(self) -> int:
        return len(self._tokens)

    @property
    def n_batch(self) -> int:
        return self._n_batch

    @property
    def n_threads(self) -> int:
        return self._n_threads

    @property
    def can_truncate(self) -> bool:
        """False for recurrent/hybrid models (``truncate`` to a non-zero length fails)."""
        return self._can_truncate

    @property
    def weights(self) -> "LlamaWeights":
        return self._weights

    @property
    def tokens(self) -> List[int]:
        """A copy of the token ids currently in the cache, in order."""
        return list(self._tokens)

    @property
    def closed(self) -> bool:
        return self._ctx is None

    def eval(self, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        """Append ``tokens`` to the cache; return logits of the last ``n_logits``.

        Row i of the result predicts the token after
        ``tokens[len(tokens) - n_logits + i]``.  ``n_logits`` may be 0 (only
        extend the cache; an empty ``(0, n_vocab)`` array is returned) and at
        most ``min(len(tokens), n_batch)``.  Batches longer than ``n_batch``
        are decoded in chunks.  On any error the cache is left unchanged.
        """
        ctx = self._ctx
        if ctx is None:
            raise ValueError("LlamaContext is closed")
        arr = np.asarray(tokens)
        if arr.ndim != 1:
            raise ValueError(f"tokens must be a 1-D sequence of ints, got shape {arr.shape}")
        n = arr.shape[0]
        if n == 0:
            raise ValueError("tokens must not be empty")
        if arr.dtype.kind not in "iu":
            if arr.dtype == object and all(isinstance(t, (int, np.integer)) and not isinstance(t, bool)
                                           for t in arr):
                arr = arr.astype(np.int64)
            else:
                raise TypeError(f"tokens must be ints, got dtype {arr.dtype}")
        if isinstance(n_logits, bool) or not isinstance(n_logits, (int, np.integer)):
            raise TypeError(f"n_logits must be an int, got {n_logits!r}")
        n_logits = int(n_logits)
        if not 0 <= n_logits <= n:
            raise ValueError(f"n_logits must be in [0, len(tokens)={n}], got {n_logits}")
        if n_logits > self._n_batch:
            raise ValueError(f"n_logits={n_logits} exceeds n_batch={self._n_batch}")
        lo = int(arr.min())
        hi = int(arr.max())
        if lo < 0 or hi >= self._n_input:
            bad = lo if lo < 0 else hi
            raise ValueError(f"token id {bad} out of range [0, {self._n_input})")
        model_ids = arr if self._input_map is None else self._input_map[arr]
        n_past = len(self._tokens)
        if n_past + n > self._n_ctx:
            raise ContextOverflowError(
                f"context overflow: {n_past} cached + {n} new tokens = {n_past + n} > n_ctx={self._n_ctx}"
            )

        nb = self._n_batch
        # The final chunk holds the last min(n, n_batch) tokens, so all the
        # requested rows come out of one llama_decode call, contiguous.
        tail_start = max(0, n - nb)
        self._logits_addr = 0
        self._logits_rows = 0
        if self._dirty:
            if not self._forget_from(n_past):
                self._dirty = False
                raise SpecDecError(
                    f"the recurrent state of {self._weights.path} was left ahead of its {n_past} "
                    "tokens by an interrupted call and had to be cleared; decode the sequence again")
        self._dirty = True
        try:
            start = 0
            while start < tail_start:
                stop = min(start + nb, tail_start)
                self._decode(ctx, model_ids, start, stop, n_past, 0)
                start = stop
            self._decode(ctx, model_ids, tail_start, n, n_past, n_logits)
        except BaseException:
            self._forget_from(n_past)
            self._dirty = False
            raise
        self._tokens.extend(arr.tolist())
        self._dirty = False

        if n_logits == 0:
            return np.empty((0, self._n_vocab), dtype=np.float32)
        m = n - tail_start
        first = m - n_logits
        addr = _get_logits_ith_addr(ctx, first)
        if not addr:
            raise SpecDecError(f"llama.cpp returned no logits for batch row {first}")
        if n_logits > 1:
            last = _get_logits_ith_addr(ctx, m - 1)
            if last != addr + (n_logits - 1) * self._row_bytes:  # pragma: no cover - defensive
                return self._copy_rows(ctx, first, m)
        self._logits_addr = addr
        self._logits_rows = n_logits
        buf = (ctypes.c_float * (n_logits * self._n_vocab)).from_address(addr)
        # numpy's stubs do not see a ctypes array's buffer protocol
        view = np.frombuffer(buf, dtype=np.float32).reshape(n_logits, self._n_vocab)  # type: ignore[call-overload]
        view.flags.writeable = False
        return view

    def _forget_from(self, n: int) -> bool:
        """Drop the cells from position ``n`` on, after a failed or
        interrupted change.  A recurrent state that has absorbed tokens past
        ``n`` cannot give them back: then the whole sequence is dropped (the
        token list too, so ``n_past`` is 0 and callers mirroring it re-decode
        from scratch) and False is returned."""
        if lib.llama_memory_seq_rm(self._mem, _SEQ, n, -1):
            return True
        lib.llama_memory_seq_rm(self._mem, _SEQ, 0, -1)
        del self._tokens[:]
        return False

    def _copy_rows(self, ctx: int, first: int, stop: int) -> np.ndarray:
        out = np.empty((stop - first, self._n_vocab), dtype=np.float32)
        for i in range(first, stop):
            addr = _get_logits_ith_addr(ctx, i)
            row = (ctypes.c_float * self._n_vocab).from_address(addr)
            out[i - first] = np.frombuffer(row, dtype=np.float32)  # type: ignore[call-overload]  # as above
        return out

    def _decode(self, ctx: int, arr: np.ndarray, start: int, stop: int, n_past: int, n_logits: int) -> None:
        m = stop - start
        self._tok[:m] = arr[start:stop]
        p0 = n_past + start
        self._pos[:m] = np.arange(p0, p0 + m, dtype=np.int32)
        out = self._out
        out[:m] = 0
        if n_logits:
            out[m - n_logits:m] = 1
        batch = self._batch
        assert batch is not None  # made by __init__, freed by close
        batch.n_tokens = m
        rc = int(lib.llama_decode(ctx, batch))
        if rc != 0:
            what = _DECODE_ERRORS.get(rc, "fatal error" if rc < 0 else "warning")
            raise DecodeError(
                f"llama_decode failed with code {rc} ({what}) on {m} tokens at position {p0} "
                f"of {self._weights.path}",
                rc,
            )

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` cached tokens and forget the rest."""
        if self._ctx is None:
            raise ValueError("LlamaContext is closed")
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"n must be an int, got {n!r}")
        n = int(n)
        n_past = len(self._tokens)
        if not 0 <= n <= n_past:
            raise ValueError(f"truncate length must be in [0, n_past={n_past}], got {n}")
        if n == n_past:
            return
        # Forget the ids first: interrupted before the cells are freed, the
        # cache is one the next eval repairs (see _dirty).
        self._dirty = True
        dropped = self._tokens[n:]
        del self._tokens[n:]
        if not lib.llama_memory_seq_rm(self._mem, _SEQ, n, -1):
            self._tokens.extend(dropped)
            self._dirty = False
            raise UnsupportedModelError(
                f"cannot truncate the cache of {self._weights.path} ({self._weights.architecture}) "
                f"from {n_past} to {n} tokens: recurrent/hybrid models cannot drop a suffix"
            )
        self._dirty = False

    # -- extras ----------------------------------------------------------

    def reset(self) -> None:
        """Empty the cache."""
        self.truncate(0)

    def common_prefix(self, tokens: Sequence[int]) -> int:
        """Length of the longest common prefix of ``tokens`` and the cache."""
        cached = self._tokens
        k = min(len(cached), len(tokens))
        i = 0
        while i < k and cached[i] == tokens[i]:
            i += 1
        return i

    def sync(self, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        """Make the cache hold exactly ``tokens``, reusing the common prefix,
        and return the logits of the last ``n_logits`` positions."""
        tokens = list(tokens)
        if not tokens:
            raise ValueError("tokens must not be empty")
        keep = min(self.common_prefix(tokens), len(tokens) - max(n_logits, 1))
        if keep < len(self._tokens):
            self.truncate(keep)
        return self.eval(tokens[keep:], n_logits)

    def logits_address(self) -> int:
        """Address of the first row returned by the last ``eval`` (0 if none)."""
        return self._logits_addr

    def close(self) -> None:
        """Free the context and its batch (idempotent)."""
        ctx, self._ctx = self._ctx, None
        batch, self._batch = self._batch, None
        self._logits_addr = 0
        free_context(ctx, batch)

    def __repr__(self) -> str:
        state = "closed" if self._ctx is None else f"n_past={len(self._tokens)}/{self._n_ctx}"
        return f"LlamaContext({self._weights.path!r}, {state})"
