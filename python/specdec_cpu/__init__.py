"""specdec-cpu: exact speculative decoding for GGUF language models on CPUs.

The emitted tokens are distributed exactly as the target model's sampling
distribution; a cheap drafter only makes them arrive sooner.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from .errors import (
    ContextOverflowError,
    DecoderClosedError,
    GenerationCancelled,
    InvalidLogitsError,
    InvalidPromptError,
    ModelLoadError,
    QueueFullError,
    SpecDecError,
    VocabMismatchError,
)
from .params import SamplingParams

__version__ = "0.1.0"

# Heavy pieces (the extension, llama.cpp) load on first use, so that
# `import specdec_cpu` stays cheap and SamplingParams works everywhere.
_LAZY = {
    "SpeculativeDecoder": "decoding.single",
    "Generation": "core.stats",
    "GenerationStats": "core.stats",
    "BatchedDecoder": "decoding.batched",
    "DecoderSettings": "settings",
    "BatchedSettings": "settings",
    "Grammar": "constraints.grammar",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'specdec_cpu' has no attribute {name!r}")


__all__ = [
    "SamplingParams",
    "SpeculativeDecoder",
    "Generation",
    "GenerationStats",
    "BatchedDecoder",
    "DecoderSettings",
    "BatchedSettings",
    "Grammar",
    "SpecDecError",
    "ModelLoadError",
    "VocabMismatchError",
    "ContextOverflowError",
    "InvalidLogitsError",
    "InvalidPromptError",
    "GenerationCancelled",
    "QueueFullError",
    "DecoderClosedError",
]
