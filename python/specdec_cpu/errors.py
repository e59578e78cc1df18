"""The exceptions specdec-cpu raises. Every message names the culprit.

All of them derive from :class:`SpecDecError`, so a server can catch that
one class around a request.  Errors that are really bad arguments also
derive from ``ValueError`` (``InvalidPromptError``, ``InvalidLogitsError``,
``InvalidGrammarError``, ``InvalidToolsError``, ``ChatTemplateRefusal``);
invalid parameters (``SamplingParams``, γ, ``n_threads``, ...) raise plain
``ValueError``/``TypeError`` naming the parameter and the expected range.
"""

from __future__ import annotations

from typing import Any, Optional


class SpecDecError(Exception):
    """Base class of every specdec-cpu error."""


class ModelLoadError(SpecDecError):
    """A GGUF file is missing, unreadable, corrupt or unsupported by llama.cpp."""


class VocabMismatchError(SpecDecError):
    """Target and draft models do not share a vocabulary."""


class ContextOverflowError(SpecDecError):
    """A prompt (or a prompt plus its generation) does not fit the context."""


class InvalidPromptError(SpecDecError, ValueError):
    """A prompt that cannot be decoded: empty, not valid UTF-8 / Unicode, of
    the wrong type, or holding token ids outside the vocabulary."""


class InvalidLogitsError(SpecDecError, ValueError):
    """A model produced NaN or infinite logits (the message names the model,
    the row and the token)."""


class GenerationCancelled(SpecDecError):
    """``generate()`` was stopped by its cancel event or its timeout.

    Attributes:
        partial: the :class:`~specdec_cpu.Generation` produced before the stop
            (its ``finish_reason`` is ``"cancelled"`` or ``"timeout"``), or
            None when nothing ran.
        reason: ``"cancelled"`` or ``"timeout"``.
    """

    def __init__(self, message: str, partial: Optional[Any] = None, reason: str = "cancelled") -> None:
        super().__init__(message)
        self.partial = partial
        self.reason = reason

    def __reduce__(self):  # keep partial and reason across pickling (process pools)
        return (type(self), (str(self), self.partial, self.reason))


class UnsupportedModelError(ModelLoadError):
    """The model loads but cannot be used here (e.g. its cache cannot be truncated)."""


class ModelNotFoundError(ModelLoadError):
    """A model name or path matches no file and no model found on this machine
    (the message lists close matches and where it looked)."""


class AmbiguousModelError(ModelLoadError):
    """A model name matches several models (the message lists them)."""


class PullError(SpecDecError):
    """A model could not be downloaded (no such repository or file, offline,
    the hub unreachable, or the optional ``huggingface_hub`` missing)."""


class InsufficientMemoryError(ModelLoadError):
    """The models (and their KV caches) would not fit in the memory available
    now: refused before loading instead of being killed while loading."""


class QueueFullError(SpecDecError):
    """A batched decoder's waiting queue is full: the request was not queued.

    Attributes:
        waiting: requests waiting when this one arrived (= ``max_queue``).
    """

    def __init__(self, message: str, waiting: int = 0) -> None:
        super().__init__(message)
        self.waiting = waiting

    def __reduce__(self):
        return (type(self), (str(self), self.waiting))


class DecoderClosedError(SpecDecError):
    """The decoder was closed before or while the request ran.

    ``partial`` is the Generation produced before the close (possibly empty).
    """

    def __init__(self, message: str, partial: Optional[object] = None) -> None:
        super().__init__(message)
        self.partial = partial


class _ParamError(SpecDecError, ValueError):
    """A bad request argument; ``param`` names it as OpenAI's error field
    does (e.g. ``"tools[1].function.name"``), or is None."""

    def __init__(self, message: str, param: Optional[str] = None) -> None:
        super().__init__(message)
        self.param = param

    def __reduce__(self):
        return (type(self), (str(self), self.param))


class InvalidGrammarError(_ParamError):
    """A JSON schema, Lark grammar, regex or GBNF grammar that cannot be
    compiled; raised before anything is queued (an HTTP 400)."""


class InvalidToolsError(_ParamError):
    """A ``tools`` entry or a ``tool_choice`` that is malformed or names a
    function that does not exist (an HTTP 400)."""


class InfillUnsupportedError(_ParamError):
    """A fill-in-the-middle request for a model without FIM tokens (an HTTP 400)."""


class ConstraintError(SpecDecError):
    """A grammar matcher failed while decoding (llguidance's message, e.g. a
    parser resource limit); the constrained sequence cannot go on."""


class ChatTemplateError(SpecDecError):
    """A chat template that cannot be compiled, or that failed while
    rendering (a bug of the template, or input it cannot handle).

    Attributes:
        template: what the template is (a GGUF path, a file, "inline").
    """

    def __init__(self, message: str, template: str = "") -> None:
        super().__init__(message)
        self.template = template

    def __reduce__(self):
        return (type(self), (str(self), self.template))


class ChatTemplateRefusal(ChatTemplateError, ValueError):
    """The template itself refused the messages (its ``raise_exception``,
    e.g. "roles must alternate"): the client's fault, an HTTP 400."""
