"""The exceptions specdec-cpu raises. Every message names the culprit."""

from __future__ import annotations


class SpecDecError(Exception):
    """Base class of every specdec-cpu error."""


class ModelLoadError(SpecDecError):
    """A GGUF file is missing, unreadable, corrupt or unsupported by llama.cpp."""


class VocabMismatchError(SpecDecError):
    """Target and draft models do not share a vocabulary."""


class ContextOverflowError(SpecDecError):
    """A prompt (or a prompt plus its generation) does not fit the context."""


class InvalidLogitsError(SpecDecError, ValueError):
    """A model produced NaN or infinite logits."""


class GenerationCancelled(SpecDecError):
    """Generation was stopped by a cancel event or a timeout."""


class UnsupportedModelError(ModelLoadError):
    """The model loads but cannot be used here (e.g. its cache cannot be truncated)."""
