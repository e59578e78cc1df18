"""The models already on this machine, and choosing among them.

Nothing here imports llama.cpp: GGUF files are read with the ``gguf``
package (``gguf_info``, header only), so listing and matching models is
cheap and works without loading any.

* stores: ``ollama`` (ollama's manifests and blobs), ``hf_cache`` (the
  Hugging Face hub cache), ``lmstudio`` (LM Studio's folders), ``folders``
  (``--model-dir`` and ``$SPECDEC_MODEL_DIRS``); ``shards`` folds split GGUF
  files into one model;
* ``catalog``: :func:`discover` searches them all (:class:`Catalog` of
  :class:`ModelEntry`, from ``entry``);
* ``resolve``: :func:`resolve_model`, a name (``qwen2.5-coder:7b``,
  ``org/repo:file.gguf``) or a path to a file, with errors naming close matches;
* ``gguf_info``, ``store``, ``fingerprint``: a file's metadata
  (:class:`ModelInfo`: quantisation, parameters, architecture, vocabulary)
  and vocabulary fingerprint, cached on disk by path, size and mtime;
* ``draft``: :func:`choose_draft`, the cheapest model on disk sharing the
  target's vocabulary;
* ``memory``: :func:`check_memory`, refusing models that would not fit;
* ``pull``: downloading from the Hugging Face hub (the optional ``hub`` extra);
* ``units``: sizes for people.

See docs/models.md.
"""

from __future__ import annotations

from .catalog import Catalog, discover
from .draft import DraftChoice, choose_draft
from .entry import SOURCES, ModelEntry
from .fingerprint import VocabPrint, mismatch
from .memory import available_memory, check_memory, memory_need
from .resolve import find_model, resolve_model
from .store import ModelInfo, describe, vocabulary

__all__ = [
    "Catalog",
    "DraftChoice",
    "ModelEntry",
    "ModelInfo",
    "SOURCES",
    "VocabPrint",
    "available_memory",
    "check_memory",
    "choose_draft",
    "describe",
    "discover",
    "find_model",
    "memory_need",
    "mismatch",
    "resolve_model",
    "vocabulary",
]
