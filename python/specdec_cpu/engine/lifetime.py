"""Closing what holds llama.cpp memory: explicitly, by ``with``, or when collected."""

from __future__ import annotations

from typing import TypeVar

__all__ = ["Closable"]

T = TypeVar("T", bound="Closable")


class Closable:
    """``with`` support and a best-effort ``close()`` at garbage collection.

    Subclasses implement an idempotent :meth:`close`; at interpreter shutdown
    llama.cpp may already be unloaded, so a failing close is swallowed there.
    """

    def close(self) -> None:  # pragma: no cover - every subclass overrides it
        raise NotImplementedError

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
