"""Serving: many requests at once.

- :mod:`.batched` — :class:`BatchedDecoder`, every request's rows in one
  llama.cpp pass per step (the engine a server wants);
- :mod:`.scheduler` — the thread that runs those steps: admission, prompt
  chunks, drafting, the one target pass, per-request verify and delivery;
- :mod:`.slots` — sequence slots and prompt-prefix reuse between them;
- :mod:`.request` — one request's state, and the stream its caller reads;
- :mod:`.metrics` — counters for logs, ``/metrics`` and benchmarks;
- :mod:`.step_trace` — one step as the planner predicted it and as it ran
  (a decoder's ``step_trace`` callback receives them);
- :mod:`.pool` — :class:`DecoderPool`, isolated decoders (one context each)
  for users who want requests fully apart.

The HTTP server and the Ray Serve deployment build on :class:`BatchedDecoder`
and live in their own modules, imported only with their optional extras.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_LAZY = {
    "BatchedDecoder": "batched",
    "DecoderClosedError": "scheduler",
    "MetricsSnapshot": "metrics",
    "StepRecord": "step_trace",
    "RequestStream": "request",
    "DecoderPool": "pool",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'specdec_cpu.serving' has no attribute {name!r}")


__all__ = list(_LAZY)
