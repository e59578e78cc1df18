"""Embeddings: texts (or token ids) to vectors, beside a decoder's generation.

A decoder embeds with its target's weights, or with an embedding model of
its own (``embedding_model``); either way in a llama.cpp context apart from
the decoder's (:class:`~specdec_cpu.engine.embedding.LlamaEmbedder`), made
at the first call, so a server that never embeds never pays its memory.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, List, NamedTuple, Optional, Sequence, Union

import numpy as np

from ..core.protocols import Tokenizer
from ..errors import GenerationCancelled

if TYPE_CHECKING:
    from ..engine import LlamaWeights
    from ..engine.embedding import LlamaEmbedder
    from .front import CallerCalls

__all__ = ["Embedder", "EmbeddingCounts"]


class EmbeddingCounts(NamedTuple):
    """What an Embedder has done since it was made (``/metrics``)."""

    inputs: int  # texts and token-id lists embedded
    tokens: int  # their tokens
    seconds: float  # time in embedding passes


class Embedder:
    """One L2-normalised vector per text or token-id list.

    ``weights`` (with ``tokenizer``, its vocabulary) computes them, at most
    ``max_tokens`` tokens per text, on ``n_threads`` threads.  ``calls``
    (the decoder's ``CallerCalls``) keeps the decoder from freeing the
    weights under a running call.  ``owned`` weights are closed by
    :meth:`close`; a decoder's target weights are closed by the decoder.
    """

    def __init__(self, weights: "LlamaWeights", tokenizer: Tokenizer, calls: "CallerCalls", *,
                 max_tokens: int = 512, n_threads: Optional[int] = None, owned: bool = False) -> None:
        self._weights, self._tokenizer, self._calls = weights, tokenizer, calls
        self._max_tokens, self._n_threads, self._owned = max_tokens, n_threads, owned
        self._context: Optional["LlamaEmbedder"] = None
        self._lock = threading.Lock()
        self._counts = EmbeddingCounts(0, 0, 0.0)

    @property
    def model_path(self) -> str:
        """The GGUF file the vectors come from."""
        return self._weights.path

    @property
    def dimensions(self) -> int:
        """Values per vector (the model's hidden size)."""
        return self._weights.n_embd

    @property
    def n_vocab(self) -> int:
        """Token ids an input may hold: 0 to n_vocab - 1."""
        return self._weights.n_input_ids

    @property
    def max_tokens(self) -> int:
        """The most tokens one text may have (no more than the model was trained on)."""
        return min(self._max_tokens, self._weights.n_ctx_train or self._max_tokens)

    def tokens(self, text: str) -> List[int]:
        """``text`` as the embedding model's tokens (its BOS/EOS where it wants them; control tokens'
        texts stay text)."""
        with self._calls.open():
            return self._tokenizer.tokenize(text, add_special=True, parse_special=False)

    def embed(self, inputs: Sequence[Union[str, Sequence[int]]], *, cancel: Optional[threading.Event] = None,
              timeout: Optional[float] = None) -> np.ndarray:
        """One float32 row of length :attr:`dimensions` per input, L2-normalised, in order.

        Raises ``InvalidPromptError`` naming the input for an empty one, one
        longer than :attr:`max_tokens`, or a token id outside the vocabulary;
        ``GenerationCancelled`` (``reason`` "cancelled" or "timeout", no
        ``partial``) when ``cancel`` is set or ``timeout`` seconds have passed
        before one of its passes (a pass, at most :attr:`max_tokens` tokens a
        sequence, is not cut short).
        """
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be a number of seconds >= 0 or None, got {timeout!r}")
        deadline = None if timeout is None else time.monotonic() + timeout

        def before_pass() -> None:
            if cancel is not None and cancel.is_set():
                raise GenerationCancelled("the embedding was cancelled")
            if deadline is not None and time.monotonic() >= deadline:
                raise GenerationCancelled(f"the embedding took longer than {timeout:g} s", reason="timeout")

        with self._calls.open():
            seqs = [self.tokens(x) if isinstance(x, str) else list(x) for x in inputs]
            start = time.perf_counter()
            vectors = self._embedder().embed(seqs, before_pass)
            seconds = time.perf_counter() - start
        with self._lock:
            c = self._counts
            self._counts = EmbeddingCounts(c.inputs + len(seqs), c.tokens + sum(map(len, seqs)), c.seconds + seconds)
        return vectors

    def counts(self) -> EmbeddingCounts:
        """Inputs, tokens and seconds embedded so far."""
        return self._counts

    @property
    def pooling(self) -> str:
        """How a text's states become one vector ("mean" for a generative model; an embedding model's own)."""
        with self._calls.open():
            return self._embedder().pooling

    def prepare(self) -> None:
        """Make the context now rather than at the first call (a model that cannot embed fails here)."""
        with self._calls.open():
            self._embedder()

    def close(self) -> None:
        """Free the context (and owned weights); the decoder calls it once its callers are out."""
        with self._lock:
            context, self._context = self._context, None
        if context is not None:
            context.close()
        if self._owned:
            self._weights.close()

    def _embedder(self) -> "LlamaEmbedder":
        with self._lock:
            if self._context is None:
                from ..engine.embedding import LlamaEmbedder

                self._context = LlamaEmbedder(self._weights, n_batch=self.max_tokens, n_threads=self._n_threads)
            return self._context

    def __repr__(self) -> str:
        return f"Embedder({self.model_path!r}, {self.dimensions} dims, up to {self.max_tokens} tokens)"

