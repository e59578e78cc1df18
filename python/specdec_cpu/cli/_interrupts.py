"""What Ctrl-C does in the interactive commands.

Two situations need care:

* During a reply, the first Ctrl-C asks the decoder to stop at the next step
  boundary (its caches stay consistent); see :func:`interruptible`.
* At ``chat``'s input prompt, Ctrl-C must abandon the line being typed.  Two
  things can lose that Ctrl-C if the program simply relies on Python's
  default handler, and :class:`PromptInterrupts` deals with both:

  1. A process started with SIGINT *ignored* keeps it ignored: Python only
     installs its KeyboardInterrupt handler when SIGINT is at its default
     disposition.  Non-interactive shells start background jobs that way
     (``cmd &`` in a script), and children inherit it, so a chat started from
     such a job (or a test suite run from one) would ignore Ctrl-C at the
     prompt while obeying it during replies.  The session therefore installs
     its own handler.
  2. Python's readline loop draws the prompt, then blocks in ``select()`` and
     runs Python signal handlers only when that call fails with EINTR.  A
     SIGINT delivered after the prompt is drawn but before ``select()`` starts
     (the process preempted in between, e.g. on a loaded machine) is recorded
     and then waits for the next key press.  The plain ``fgets`` path without
     readline has the same window.  While the prompt is up, a helper thread
     watches for SIGINT through the signal wake-up fd and, until the prompt
     ends, pokes the main thread with a signal whose handler does nothing:
     each poke interrupts the blocking call, which makes Python run the
     pending SIGINT handler.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from types import FrameType, TracebackType
from typing import Any, Callable, Iterator, Optional, Union

__all__ = ["PromptInterrupts", "interruptible"]

# The poke: default action "ignore", unused by Python and by this program, so a
# poke that arrives after the prompt ended (or after the session restored the
# previous handlers) is harmless.
_POKE: Optional[int] = getattr(signal, "SIGURG", None)
# How long a recorded SIGINT may wait before the main thread is poked (it
# usually runs at once: the signal interrupts select() itself).
_POKE_INTERVAL = 0.02

#: What ``signal.signal`` returns and takes: a handler, SIG_DFL/SIG_IGN, or None (not set from Python).
_Handler = Union[Callable[[int, Optional[FrameType]], Any], int, signal.Handlers, None]


@contextmanager
def interruptible() -> Iterator[threading.Event]:
    """While active, the first Ctrl-C sets the yielded event (the decoder stops
    after the step in progress, its caches consistent); a second one raises
    KeyboardInterrupt as usual."""
    cancel = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield cancel  # signals only reach the main thread
        return

    def on_sigint(signum, frame):  # noqa: ARG001
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield cancel
    finally:
        signal.signal(signal.SIGINT, previous)


class PromptInterrupts:
    """Ctrl-C for an interactive session: delivered reliably at the prompt,
    ignored between prompts.

    Use as ``with PromptInterrupts() as interrupts:`` around the session and
    ``with interrupts.reading(): input(...)`` around each read.  Inside
    ``reading()`` a Ctrl-C raises KeyboardInterrupt out of ``input()``.
    Outside it (a command running, the status line being printed) Ctrl-C is
    ignored: those moments are short, and an exception there could leave the
    conversation half-updated; a reply installs its own handler
    (:func:`interruptible`).  Outside the main thread this does nothing.
    """

    def __init__(self) -> None:
        self._active = False
        self._reading = False
        self._can_poke = False
        self._previous: dict[int, _Handler] = {}

    def __enter__(self) -> "PromptInterrupts":
        if threading.current_thread() is not threading.main_thread():
            return self
        self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_sigint)
        if _POKE is not None and hasattr(signal, "pthread_kill"):
            # The wake-up fd is process-wide: borrow it only if nobody else
            # (an event loop, say) has set one.
            other = signal.set_wakeup_fd(-1)
            signal.set_wakeup_fd(other)
            if other == -1:
                self._previous[_POKE] = signal.signal(_POKE, _ignore)
                self._can_poke = True
        self._active = True
        return self

    def __exit__(self, exc_type: Optional[type], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self._active = self._can_poke = False
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    @contextmanager
    def reading(self) -> Iterator[None]:
        """Around an ``input()`` call: Ctrl-C raises KeyboardInterrupt."""
        if not self._active:
            yield
            return
        watcher = None
        if self._can_poke:
            main, poke = threading.main_thread().ident, _POKE
            assert main is not None and poke is not None  # the main thread runs this; _can_poke needs a poke
            watcher = _SigintWatcher(main, poke)
        try:
            # Every SIGINT the watcher sees therefore finds _reading set: its
            # handler either ends this read or runs after it, so the pokes
            # always stop with the read.
            self._reading = True
            if watcher is not None:
                signal.set_wakeup_fd(watcher.write_fd, warn_on_full_buffer=False)
            yield
        finally:
            self._reading = False
            if watcher is not None:
                signal.set_wakeup_fd(-1)  # checked free in __enter__
                watcher.stop()

    def _on_sigint(self, signum: int, frame: object) -> None:  # noqa: ARG002
        if self._reading:
            raise KeyboardInterrupt


def _ignore(signum: int, frame: object) -> None:  # noqa: ARG001
    """The poke's handler: its only job is to interrupt a blocking call."""


class _SigintWatcher:
    """A thread reading the signal wake-up fd while one prompt is up; after a
    SIGINT it pokes the main thread until :meth:`stop`."""

    def __init__(self, main_ident: int, poke: int) -> None:
        self._main, self._poke = main_ident, poke
        self._done = threading.Event()
        self._read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)  # set_wakeup_fd requires it
        self._thread = threading.Thread(target=self._run, name="sigint-watcher", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            try:
                data = os.read(self._read_fd, 512)
            except OSError:
                return
            if signal.SIGINT in data:
                while not self._done.wait(_POKE_INTERVAL):
                    signal.pthread_kill(self._main, self._poke)

    def stop(self) -> None:
        self._done.set()
        try:
            os.write(self.write_fd, b"\0")  # wakes the read; 0 is no signal number
        except BlockingIOError:  # the pipe is full, so the read is not blocked
            pass
        self._thread.join()
        os.close(self._read_fd)
        os.close(self.write_fd)
