"""Bytes of tokens -> text pieces, with stop strings that are never split."""

from __future__ import annotations

import codecs
from typing import Iterable, Union


def stop_strings(stop: Union[str, Iterable[str], None]) -> tuple[str, ...]:
    """A request's ``stop`` as a tuple: a str, any iterable of str (read
    once), or None (none, as OpenAI's API takes it).  TypeError/ValueError
    naming ``stop`` otherwise."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, (bytes, bytearray)) or not isinstance(stop, Iterable):
        raise TypeError(f"stop must be a str, a sequence of str or None, got {stop!r}")
    out = tuple(stop)
    for s in out:
        if not isinstance(s, str) or not s:
            raise ValueError(f"stop strings must be non-empty str, got {s!r}")
    return out


class TextAssembler:
    """Turns token bytes into text incrementally and watches for stop strings.

    Byte-level vocabularies split multi-byte characters across tokens, so
    bytes go through an incremental UTF-8 decoder.  Text that could still be
    the beginning of a stop string is held back until it is known not to be,
    so a consumer never sees a stop string, whole or in part.
    """

    def __init__(self, stop: Union[str, Iterable[str], None] = ()) -> None:
        self._stop = stop_strings(stop)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self.text = ""
        self.stopped = False

    def feed(self, data: bytes) -> str:
        """Add one token's bytes; return the text now safe to show."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(data)
        return self._release(final=False)

    def finish(self) -> str:
        """Flush what was held back (end of generation)."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(b"", final=True)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        cut = min((i for i in (self._pending.find(s) for s in self._stop) if i >= 0), default=-1)
        if cut >= 0:
            out, self._pending, self.stopped = self._pending[:cut], "", True
        elif final or self._hold == 0:
            out, self._pending = self._pending, ""
        else:
            keep = self._held_suffix()
            out, self._pending = self._pending[: len(self._pending) - keep], self._pending[len(self._pending) - keep:]
        self.text += out
        return out

    def _held_suffix(self) -> int:
        """Length of the longest suffix of pending text that starts a stop string."""
        pending = self._pending
        for n in range(min(self._hold, len(pending)), 0, -1):
            tail = pending[-n:]
            if any(s.startswith(tail) for s in self._stop):
                return n
        return 0
