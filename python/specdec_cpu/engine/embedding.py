"""LlamaEmbedder: one vector per text, from a context of its own over the weights.

llama.cpp pools a sequence's hidden states into one vector when its context
is made with ``embeddings = true``: as the GGUF says (an embedding model
declares mean, CLS or last-token pooling), else the mean over the tokens, as
llama-server does for a generative model.  Pooling needs a sequence whole in
one micro-batch, so the micro-batch's size bounds the longest text; several
texts go in one decode as sequences of their own.  The context is
separate from the decoder's, so embedding never touches a generation's
cache; it shares the weights' memory.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence

import numpy as np

from ..errors import InvalidPromptError, ModelLoadError
from .backend import clear_log_errors, describe_failure, lib
from .context import _DECODE_ERRORS, DecodeError, _check_int, free_context
from .lifetime import Closable

if TYPE_CHECKING:
    from .weights import LlamaWeights

__all__ = ["LlamaEmbedder", "POOLING_NAMES"]

#: llama.cpp's pooling types by number, as ``pooling`` names them
POOLING_NAMES = {1: "mean", 2: "cls", 3: "last"}
_POOLING_NONE, _POOLING_MEAN, _POOLING_RANK = 0, 1, 4


class LlamaEmbedder(Closable):
    """Pooled, L2-normalised embeddings of token sequences.

    A sequence may hold up to ``n_batch`` tokens; one decode takes up to
    ``n_seq`` sequences and ``n_batch`` (rounded up to a multiple of
    ``n_seq``) tokens.  Thread-safe: one call embeds at a time.
    """

    def __init__(self, weights: "LlamaWeights", *, n_batch: int = 512, n_seq: int = 16,
                 n_threads: Optional[int] = None) -> None:
        self._ctx: Optional[int] = None
        n_batch = _check_int("n_batch", n_batch)
        n_seq = _check_int("n_seq", n_seq)
        if n_seq > 256:
            raise ValueError(f"n_seq must be <= 256 (llama.cpp's limit), got {n_seq}")
        n_threads = _check_int("n_threads", (os.cpu_count() or 1) if n_threads is None else n_threads)
        self._weights = weights
        self._n_batch, self._n_seq = n_batch, n_seq
        # llama.cpp sizes its graph for n_ubatch rows split evenly over n_seq_max sequences, and
        # aborts (GGML_ASSERT) unless they divide: the pass holds a multiple of n_seq rows
        self._rows = -(-n_batch // n_seq) * n_seq
        self._lock = threading.Lock()

        params = lib.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = self._rows
        params.n_seq_max = n_seq
        params.kv_unified = True  # the sequences share the cells: n_ctx is the whole batch, not a per-sequence cut
        params.n_threads = params.n_threads_batch = n_threads
        params.no_perf = True
        params.embeddings = True
        params.pooling_type = -1  # the GGUF's own pooling
        ctx = self._create(params)
        if int(lib.llama_pooling_type(ctx)) == _POOLING_NONE:  # a generative model: mean, as llama-server
            lib.llama_free(ctx)
            params.pooling_type = _POOLING_MEAN
            ctx = self._create(params)
        self._pooling = int(lib.llama_pooling_type(ctx))
        if self._pooling == _POOLING_RANK:
            lib.llama_free(ctx)
            raise ModelLoadError(f"{weights.path} is a reranking model: what it pools is relevance scores, "
                                 "not embeddings")
        self._ctx = ctx
        self._mem = lib.llama_get_memory(ctx)
        self._dim = weights.n_embd
        self._batch = lib.llama_batch_init(self._rows, 0, 1)
        weights._register(self)

    def _create(self, params: object) -> int:
        clear_log_errors()
        ctx = lib.llama_init_from_model(self._weights.model_ptr, params)
        if not ctx:
            reason = describe_failure("llama.cpp could not create the context (out of memory?)")
            raise ModelLoadError(f"failed to create an embedding context (n_batch={self._n_batch}) for "
                                 f"{self._weights.path}: {reason}")
        return int(ctx)

    # -- properties ------------------------------------------------------

    @property
    def dimensions(self) -> int:
        """Values per embedding."""
        return self._dim

    @property
    def pooling(self) -> str:
        """How a sequence's states become one vector: "mean", "cls" or "last"."""
        return POOLING_NAMES.get(self._pooling, str(self._pooling))

    @property
    def n_batch(self) -> int:
        """The most tokens one sequence (and one decode) may hold."""
        return self._n_batch

    @property
    def weights(self) -> "LlamaWeights":
        return self._weights

    @property
    def closed(self) -> bool:
        return self._ctx is None

    # -- embedding -------------------------------------------------------

    def embed(self, sequences: Sequence[Sequence[int]], before_pass: Optional[Callable[[], None]] = None
              ) -> np.ndarray:
        """One L2-normalised float32 row per token sequence, in order.

        Raises ``InvalidPromptError`` (naming the sequence's index) for an
        empty sequence, one longer than :attr:`n_batch`, or a token id
        outside the vocabulary; nothing is decoded then.  ``before_pass`` is
        called before each pass; what it raises ends the call (a cancel or
        a deadline), leaving nothing behind: each pass starts from empty memory.
        """
        n_vocab = self._weights.n_input_ids
        arrays: List[np.ndarray] = []
        for i, seq in enumerate(sequences):
            arr = np.asarray(seq, dtype=np.int64).reshape(-1)
            if arr.size == 0:
                raise InvalidPromptError(f"input {i} has no tokens")
            if arr.size > self._n_batch:
                raise InvalidPromptError(f"input {i} has {arr.size} tokens; at most {self._n_batch} can be "
                                         "embedded at once")
            if int(arr.min()) < 0 or int(arr.max()) >= n_vocab:
                bad = int(arr.min()) if int(arr.min()) < 0 else int(arr.max())
                raise InvalidPromptError(f"input {i}: token id {bad} out of range [0, {n_vocab})")
            arrays.append(arr)
        out = np.empty((len(arrays), self._dim), dtype=np.float32)
        with self._lock:
            ctx = self._require()
            start = 0
            while start < len(arrays):
                stop, rows = start, 0
                while stop < len(arrays) and stop - start < self._n_seq and rows + arrays[stop].size <= self._rows:
                    rows += arrays[stop].size
                    stop += 1
                if before_pass is not None:
                    before_pass()
                self._decode(ctx, arrays[start:stop], out[start:stop])
                start = stop
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return np.divide(out, norms, out=out, where=norms > 0)

    def _decode(self, ctx: int, arrays: Sequence[np.ndarray], out: np.ndarray) -> None:
        lib.llama_memory_clear(self._mem, True)
        batch, row = self._batch, 0
        input_map = self._weights.input_map
        for seq, arr in enumerate(arrays):
            ids = arr if input_map is None else input_map[arr]
            for pos, token in enumerate(ids.tolist()):
                batch.token[row] = token
                batch.pos[row] = pos
                batch.n_seq_id[row] = 1
                batch.seq_id[row][0] = seq
                batch.logits[row] = 1
                row += 1
        batch.n_tokens = row
        rc = int(lib.llama_decode(ctx, batch))
        if rc != 0:
            what = _DECODE_ERRORS.get(rc, "fatal error" if rc < 0 else "warning")
            raise DecodeError(f"llama_decode failed with code {rc} ({what}) embedding {len(arrays)} inputs "
                              f"({row} tokens) with {self._weights.path}", rc)
        for seq in range(len(arrays)):
            ptr = lib.llama_get_embeddings_seq(ctx, seq)
            if not ptr:
                raise DecodeError(f"llama.cpp returned no pooled embedding for sequence {seq}", -1)
            out[seq] = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), (self._dim,))

    def _require(self) -> int:
        if self._ctx is None:
            raise ValueError("LlamaEmbedder is closed")
        return self._ctx

    def close(self) -> None:
        """Free the context and its batch (idempotent; waits for an embedding in progress)."""
        with self._lock:
            ctx, self._ctx = self._ctx, None
            batch, self._batch = getattr(self, "_batch", None), None
            free_context(ctx, batch)

    def __repr__(self) -> str:
        state = "closed" if self._ctx is None else f"{self.pooling} pooling, {self._dim} dims"
        return f"LlamaEmbedder({self._weights.path!r}, n_batch={self._n_batch}, {state})"
