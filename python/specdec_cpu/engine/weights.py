"""LlamaWeights: one GGUF model loaded (memory-mapped) once, shared by contexts."""

from __future__ import annotations

import ctypes
import os
import threading
import weakref
from typing import TYPE_CHECKING, Optional, Union

import numpy as np

from ..errors import ModelLoadError
from .backend import clear_log_errors, describe_failure, ensure_backend, lib, use_extra_buffers
from .gguf_meta import SOURCE_IDS_KEY, SOURCE_N_VOCAB_KEY, STAND_IN_KEY, check_gguf_file, parse_runs
from .lifetime import Closable

if TYPE_CHECKING:
    from .lifetime import Closable as _Context

__all__ = ["LlamaWeights"]

class LlamaWeights(Closable):
    """A GGUF model's weights and vocabulary, loaded once (mmap) and shared.

    Several contexts (``LlamaContext(weights, ...)``, ``LlamaMultiContext``),
    each with its own KV cache, may share one ``LlamaWeights``.  Closing the
    weights closes those contexts first.  Use as a context manager or call
    :meth:`close`; it is also freed when garbage collected.
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"], *, n_gpu_layers: int = 0) -> None:
        self._model: Optional[int] = None
        self._contexts: "weakref.WeakSet[_Context]" = weakref.WeakSet()
        self._lock = threading.Lock()
        self._token_texts: Optional[list[bytes]] = None  # filled lazily by vocab.token_texts
        if isinstance(n_gpu_layers, bool) or not isinstance(n_gpu_layers, int):
            raise TypeError(f"n_gpu_layers must be an int, got {n_gpu_layers!r}")
        self._path = check_gguf_file(path)
        ensure_backend()

        params = lib.llama_model_default_params()
        params.n_gpu_layers = n_gpu_layers
        if not use_extra_buffers():
            params.use_extra_bufts = False
        clear_log_errors()
        model = lib.llama_model_load_from_file(self._path.encode("utf-8"), params)
        if not model:
            reason = describe_failure("llama.cpp could not load it (truncated, corrupt or unsupported)")
            raise ModelLoadError(f"failed to load model {self._path}: {reason}")
        self._model = model
        self._vocab = lib.llama_model_get_vocab(model)
        if not self._vocab:
            self.close()
            raise ModelLoadError(f"model has no vocabulary: {self._path}")

        self._n_vocab = int(lib.llama_vocab_n_tokens(self._vocab))
        self._n_ctx_train = int(lib.llama_model_n_ctx_train(model))
        self._n_embd = int(lib.llama_model_n_embd(model))
        self._n_layer = int(lib.llama_model_n_layer(model))
        self._size = int(lib.llama_model_size(model))
        self._n_params = int(lib.llama_model_n_params(model))
        self._description = self._read_str(lambda buf, n: lib.llama_model_desc(model, buf, n))
        self._architecture = self.metadata("general.architecture") or ""
        self._name = self.metadata("general.name")
        self._source_ids, self._input_map = self._read_cut()
        self._is_recurrent = bool(_optional_call("llama_model_is_recurrent", model))
        self._is_hybrid = bool(_optional_call("llama_model_is_hybrid", model))
        if self._n_vocab <= 0:
            self.close()
            raise ModelLoadError(f"model has an empty vocabulary: {self._path}")

    # -- helpers ---------------------------------------------------------

    @staticmethod
    def _read_str(fill, size: int = 256) -> str:
        while True:
            buf = ctypes.create_string_buffer(size)
            n = int(fill(buf, size))
            if n < 0:
                return ""
            if n < size:
                return buf.value.decode("utf-8", "replace")
            size = n + 1

    def metadata(self, key: str) -> Optional[str]:
        """A GGUF metadata value rendered as a string, or None if absent."""
        model = self._require()
        kb = key.encode("utf-8")
        size = 256
        while True:
            buf = ctypes.create_string_buffer(size)
            n = int(lib.llama_model_meta_val_str(model, kb, buf, size))
            if n < 0:
                return None
            if n < size:
                return buf.value.decode("utf-8", "replace")
            size = n + 1

    def _require(self) -> int:
        model = self._model
        if model is None:
            raise ValueError(f"LlamaWeights for {self._path} is closed")
        return model

    def _read_cut(self) -> "tuple[Optional[np.ndarray], Optional[np.ndarray]]":
        """For a cut vocabulary (engine/vocab_cut.py): each id's source id, and
        the map from source ids to this model's (a lacking id to the stand-in)."""
        runs = self.metadata(SOURCE_IDS_KEY)
        if runs is None:
            return None, None
        try:
            ids = parse_runs(runs)
            n_source = int(self.metadata(SOURCE_N_VOCAB_KEY) or 0)
            stand_in = int(self.metadata(STAND_IN_KEY) or 0)
            if len(ids) != self._n_vocab or ids.min() < 0 or ids.max() >= n_source or stand_in not in ids:
                raise ValueError(f"{len(ids)} source ids in [0, {n_source}) for {self._n_vocab} tokens, "
                                 f"stand-in {stand_in}")
        except ValueError as exc:
            self.close()
            raise ModelLoadError(f"{self._path} carries an inconsistent vocabulary cut: {exc}") from None
        input_map = np.full(n_source, int(np.searchsorted(ids, stand_in)), dtype=np.int32)
        input_map[ids] = np.arange(len(ids), dtype=np.int32)
        return ids, input_map

    # -- properties ------------------------------------------------------

    @property
    def source_ids(self) -> Optional[np.ndarray]:
        """For a draft cut to part of a vocabulary (engine/vocab_cut.py): the
        source vocabulary's id of each of its ids, increasing; else None."""
        return self._source_ids

    @property
    def input_map(self) -> Optional[np.ndarray]:
        """For a cut vocabulary: this model's id for each source id (an id it
        lacks reads as the stand-in, a space); contexts feed tokens through
        it, so callers speak source ids.  None for a whole vocabulary."""
        return self._input_map

    @property
    def n_input_ids(self) -> int:
        """The ids a context of this model accepts: the source vocabulary's
        size for a cut, else ``n_vocab``."""
        return self._n_vocab if self._input_map is None else len(self._input_map)

    @property
    def path(self) -> str:
        """The GGUF file's path as given (a str)."""
        return self._path

    @property
    def n_vocab(self) -> int:
        """Number of tokens in the vocabulary (= rows of a logits vector)."""
        return self._n_vocab

    @property
    def n_ctx_train(self) -> int:
        """The context length the model was trained with."""
        return self._n_ctx_train

    @property
    def n_embd(self) -> int:
        return self._n_embd

    @property
    def n_layer(self) -> int:
        return self._n_layer

    @property
    def architecture(self) -> str:
        """``general.architecture`` from the GGUF metadata, e.g. ``"qwen2"``."""
        return self._architecture

    @property
    def name(self) -> Optional[str]:
        """``general.name`` from the GGUF metadata, if present."""
        return self._name

    @property
    def description(self) -> str:
        """llama.cpp's one-line description, e.g. ``"qwen2 1B Q4_K - Medium"``."""
        return self._description

    @property
    def size(self) -> int:
        """Total size of the weight tensors in bytes."""
        return self._size

    @property
    def n_params(self) -> int:
        """Total number of parameters."""
        return self._n_params

    @property
    def is_recurrent(self) -> bool:
        return self._is_recurrent

    @property
    def is_hybrid(self) -> bool:
        return self._is_hybrid

    @property
    def can_truncate(self) -> bool:
        """False for recurrent/hybrid models whose state cannot drop a suffix."""
        return not (self._is_recurrent or self._is_hybrid)

    @property
    def closed(self) -> bool:
        return self._model is None

    @property
    def model_ptr(self) -> int:
        """The raw ``llama_model *`` (for engine modules only)."""
        return self._require()

    @property
    def vocab_ptr(self) -> int:
        """The raw ``const llama_vocab *`` (for engine modules only)."""
        self._require()
        return self._vocab

    def __repr__(self) -> str:
        state = "closed" if self._model is None else f"{self._description}, n_vocab={self._n_vocab}"
        return f"LlamaWeights({self._path!r}: {state})"

    # -- contexts --------------------------------------------------------

    def _register(self, ctx: "_Context") -> None:
        with self._lock:
            self._contexts.add(ctx)

    # -- lifetime --------------------------------------------------------

    def close(self) -> None:
        """Close every context made from these weights, then free the model."""
        with self._lock:
            contexts = list(self._contexts)
            self._contexts = weakref.WeakSet()
        for ctx in contexts:
            ctx.close()
        model, self._model = self._model, None
        if model is not None:
            try:
                lib.llama_model_free(model)
            except Exception:  # interpreter shutdown
                pass


def _optional_call(name: str, *args: object) -> object:
    fn = getattr(lib, name, None)
    if fn is None:
        return False
    try:
        return fn(*args)
    except (AttributeError, OSError):
        return False
