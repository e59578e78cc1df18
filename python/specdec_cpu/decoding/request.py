"""One request of a batched decoder: a ``Sequence`` that hands its text to the
caller's thread, and what the caller holds (a stream of text pieces that
ends with a Generation).

The caller's thread and the scheduler's thread meet in two places only: the
request's output queue (pieces, then one final item) and two flags the
caller may set (``closed`` when a stream is dropped; the caller's own
``cancel`` event).  Everything else is the scheduler's.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, Callable, Optional

from ..core.sequence import Sequence
from ..core.stats import Generation

__all__ = ["AsyncRequestStream", "Request", "RequestStream"]

_END = object()  # the scheduler's last item on a request's queue comes after this marker


class Request(Sequence):
    """A generation request of a batched decoder: a :class:`Sequence` whose
    text pieces and end go to the caller's thread through ``outbox``."""

    def __init__(self, prompt: list[int], **kwargs: Any) -> None:
        super().__init__(prompt, **kwargs)
        self.outbox: "queue.SimpleQueue[object]" = queue.SimpleQueue()
        self.wakeup: Optional[Callable[[], object]] = None  # an async reader's doorbell (thread-safe)
        self.done = threading.Event()

    def deliver(self, piece: str) -> None:
        """Queue a text piece for the caller; ``ring()`` wakes an async reader.

        The scheduler rings once per step, not per piece: a speculative step
        emits several tokens at once, and an asyncio server then reads them
        all on one wake-up (and can send them as one event)."""
        if piece:
            self.outbox.put(piece)

    def ring(self) -> None:
        """Wake an async reader, if one waits (a blocking reader needs no ring)."""
        wakeup = self.wakeup
        if wakeup is not None:
            try:
                wakeup()
            except RuntimeError:  # the reader's event loop is closed: nobody is listening
                self.closed = True

    def finish(self, reason: Optional[str], error: Optional[BaseException] = None) -> None:
        """End the request (see ``Sequence.finish``) and wake the caller."""
        if self.finished:
            return
        super().finish(reason, error)
        self.done.set()  # before the marker: a reader that saw the marker sees the result
        self.outbox.put(_END)
        self.ring()


class RequestStream:
    """What ``BatchedDecoder.stream`` returns: an iterator of text pieces;
    ``result`` is the Generation once the stream has ended or been closed.

    Closing it (``close()``, a ``with`` block, or dropping the last
    reference) ends the request at the scheduler's next step and frees its
    sequence.  An error of this request alone (e.g. NaN logits) is raised
    by the iteration.
    """

    def __init__(self, request: Request) -> None:
        self._request = request
        self._ended = False

    def __iter__(self) -> "RequestStream":
        return self

    def __next__(self) -> str:
        if self._ended:
            raise StopIteration
        req = self._request
        item = req.outbox.get()
        if item is _END:
            self._ended = True
            if req.error is not None:
                raise req.error
            raise StopIteration
        return item  # type: ignore[return-value]

    @property
    def id(self) -> int:
        """The request's id (as the decoder's logs and metrics name it)."""
        return self._request.id

    @property
    def result(self) -> Optional[Generation]:
        """The Generation once the stream has ended or been closed."""
        req = self._request
        return req.result if req.done.is_set() else None

    def close(self) -> None:
        """Stop the request (if it is still running) and wait until it has ended."""
        req = self._request
        if not req.done.is_set():
            req.closed = True
            req.done.wait()
        self._ended = True

    def __enter__(self) -> "RequestStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        req = getattr(self, "_request", None)
        if req is not None and not req.done.is_set():
            req.closed = True  # the scheduler ends it; nobody waits here


class AsyncRequestStream:
    """What ``BatchedDecoder.astream`` returns: an async iterator of text
    pieces for asyncio servers, with ``result`` as for :class:`RequestStream`.

    No thread waits on the request: the scheduler rings the event loop when
    a piece is ready.  ``aclose()`` (or leaving ``async with``) ends the
    request at the scheduler's next step without waiting for it, so a
    server can drop a disconnected client at once.
    """

    def __init__(self, request: Request, loop: asyncio.AbstractEventLoop) -> None:
        self._request = request
        self._ended = False
        self._end_read = False  # read_ready() took the end marker off the queue
        self._ready = ready = asyncio.Event()
        # The doorbell holds the event, not the stream: a dropped stream is collected, and closes its request.
        request.wakeup = lambda: loop.call_soon_threadsafe(ready.set)
        self._ready.set()  # pieces may have been delivered before the doorbell was hung

    def __aiter__(self) -> "AsyncRequestStream":
        return self

    async def __anext__(self) -> str:
        if self._ended:
            raise StopAsyncIteration
        req = self._request
        while not self._end_read:
            try:
                item = req.outbox.get_nowait()
                break
            except queue.Empty:
                self._ready.clear()
                if not req.outbox.empty():  # rung between the two calls
                    continue
                await self._ready.wait()
        else:
            item = _END
        if item is _END:
            self._ended = True
            if req.error is not None:
                raise req.error
            raise StopAsyncIteration
        return item  # type: ignore[return-value]

    def read_ready(self) -> str:
        """The text of every piece already delivered and not yet read, joined,
        without waiting ("" if none).  A server calls it after each piece so
        that one speculative step's tokens go out as one event; the end of
        the request, if reached, is left for the next ``__anext__``."""
        req = self._request
        parts = []
        while not (self._ended or self._end_read):
            try:
                item = req.outbox.get_nowait()
            except queue.Empty:
                break
            if item is _END:
                self._end_read = True
            else:
                parts.append(item)
        return "".join(parts)  # type: ignore[arg-type]

    def logprobs_since(self, start: int) -> list:
        """The log-probabilities (``TokenLogprob``) of output tokens ``start``
        on that the scheduler has emitted so far (of a request asking for
        them; the text of the last ones may still be held back): a server
        streams them beside the text, ``result.logprobs`` is the whole list."""
        return self._request.token_logprobs[start:]

    async def wait(self) -> None:
        """Until the request has ended (pieces are kept for ``result``)."""
        while not self._request.done.is_set():
            self._ready.clear()
            if self._request.done.is_set():
                break
            await self._ready.wait()

    @property
    def id(self) -> int:
        return self._request.id

    @property
    def prompt_tokens(self) -> int:
        return len(self._request.prompt)

    @property
    def prompt_ids(self) -> list[int]:
        """The prompt's token ids (do not modify)."""
        return self._request.prompt

    def prompt_logprobs(self) -> list:
        """The prompt's log-probabilities computed so far (``TokenLogprob`` per
        token after the first) of a request asking for them: all of them
        once its first piece has come."""
        return list(self._request.prompt_entries)

    @property
    def tokens_emitted(self) -> int:
        """Output tokens so far (their text may still be held back)."""
        return len(self._request.out)

    @property
    def result(self) -> Optional[Generation]:
        req = self._request
        return req.result if req.done.is_set() else None

    @property
    def error(self) -> Optional[BaseException]:
        return self._request.error

    async def aclose(self) -> None:
        """Stop the request (if still running); returns at once."""
        if not self._request.done.is_set():
            self._request.closed = True
        self._ended = True

    async def __aenter__(self) -> "AsyncRequestStream":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __del__(self) -> None:
        req = getattr(self, "_request", None)
        if req is not None and not req.done.is_set():
            req.closed = True
