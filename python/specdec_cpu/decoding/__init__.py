"""Decoding: the decoders, and the step loop they share.

- :mod:`.single` — :class:`SpeculativeDecoder`, one conversation decoded on
  the caller's thread;
- :mod:`.batched` — :class:`BatchedDecoder`, every request's rows in one
  llama.cpp pass per step, on a scheduler thread (:mod:`.scheduler`);
- :mod:`.loop` — :class:`StepLoop`, what both run: admission into slots
  (:mod:`.slots`, prompt-prefix reuse), prompt chunks, the draft policy's
  plan, and the step core (``core/step.py``);
- :mod:`.front` — what the two public faces share (arguments into a checked
  sequence, chat prompts, the end of ``generate``);
- :mod:`.request` — a batched request and the streams its caller reads;
- :mod:`.embeddings` — a decoder's :class:`Embedder` (vectors beside generation);
- :mod:`.metrics`, :mod:`.step_trace` — counters, and one step as planned
  and as it ran.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_LAZY = {
    "SpeculativeDecoder": "single",
    "BatchedDecoder": "batched",
    "MetricsSnapshot": "metrics",
    "StepRecord": "step_trace",
    "RequestStream": "request",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'specdec_cpu.decoding' has no attribute {name!r}")


__all__ = list(_LAZY)
