"""The batched decoder's scheduler: one thread running a :class:`StepLoop`.

Requests enter with :meth:`Scheduler.submit` (any thread) into a FIFO; the
scheduler thread admits them into free slots and runs the loop's steps
(decoding/loop.py) while anything is active, sleeping otherwise.  It owns
the models, the slots and every request's state from submission on.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable, List, Optional

from ..engine.openmp import release_threads
from ..errors import DecoderClosedError, QueueFullError, SpecDecError
from .loop import StepLoop, fail_all
from .request import Request

__all__ = ["Scheduler"]

log = logging.getLogger("specdec_cpu.decoding")


class Scheduler:
    """Runs the steps of a :class:`~specdec_cpu.BatchedDecoder` on a thread of its own.

    """

    def __init__(self, loop: StepLoop, *, max_queue: int) -> None:
        self.loop, self.max_queue = loop, max_queue
        self.metrics = loop.metrics
        self._cond = threading.Condition()
        self._waiting: "collections.deque[Request]" = collections.deque()
        self._closed = False  # no more submissions
        self._failed: Optional[str] = None  # why the scheduler stopped, if it failed
        self._abort = False  # end everything in flight now
        self._thread = threading.Thread(target=self._run, name="specdec-scheduler", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ any thread
    def submit(self, reqs: List[Request], on_accept: Optional[Callable[[Request], None]] = None) -> None:
        """Queue requests (FIFO), all or none: ``QueueFullError`` when they
        would make more than ``max_queue`` wait.

        ``on_accept(req)`` runs once they are accepted, before the scheduler
        can see them (a refused request draws no seed)."""
        with self._cond:
            if self._closed:
                raise DecoderClosedError(self._failed or "BatchedDecoder is closed")
            if len(self._waiting) + len(reqs) - self.loop.n_free > self.max_queue:
                self.metrics.count_request("rejected")
                raise QueueFullError(
                    f"{len(self._waiting)} requests are already waiting (max_queue={self.max_queue}); "
                    "retry later", waiting=len(self._waiting))
            for req in reqs:
                if on_accept is not None:
                    on_accept(req)
                self._waiting.append(req)
            self.metrics.queue_depth = len(self._waiting)
            self._cond.notify()

    def close(self, *, drain: bool, timeout: Optional[float]) -> None:
        """Stop taking requests; with ``drain`` let those in flight finish
        (up to ``timeout`` seconds), then end whatever is left and stop."""
        with self._cond:
            self._closed = True
            if not drain:
                self._abort = True
            self._cond.notify()
        if drain:
            self._thread.join(timeout)
            with self._cond:
                self._abort = True
                self._cond.notify()
        self._thread.join()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ------------------------------------------------------------ the thread
    def _run(self) -> None:
        loop = self.loop
        try:
            while True:
                with self._cond:
                    if self._abort:
                        break
                    idle = not loop.active and not self._waiting
                    if idle and self._closed:
                        break
                if idle:
                    # Idle, this thread keeps no OpenMP workers: they would slow every
                    # other decoder's passes in the process (engine/openmp.py).
                    release_threads()
                    with self._cond:
                        while not (loop.active or self._waiting or self._closed or self._abort):
                            self._cond.wait()
                    continue
                self._stop_waiting()
                self._admit()
                with self._cond:
                    joining = len(self._waiting)
                loop.step(joining)
                self._publish_gauges()
        except BaseException as exc:  # a bug or a dead model: nobody may hang on us
            log.exception("batched decoder scheduler failed")
            self._fail_all(f"the batched decoder's scheduler failed: {exc!r}")
            return
        self._fail_all(None)

    def _stop_waiting(self) -> None:
        """End waiting requests that were cancelled, closed or timed out."""
        now = time.perf_counter()
        with self._cond:
            due = [r for r in self._waiting if r.stop_reason(now) is not None]
            for req in due:
                self._waiting.remove(req)
        if not due:
            return
        self._publish_gauges()
        for req in due:  # counted before the caller wakes (StepLoop.end)
            reason = req.stop_reason(now)
            self.metrics.count_request(req.stats.finish_reason or reason or "cancelled")
            req.finish(reason)

    def _admit(self) -> None:
        loop = self.loop
        while loop.n_free:
            with self._cond:
                req = self._next_ready()
                if req is None:
                    break
            try:
                loop.admit(req)
            except Exception as exc:  # it alone fails; an uncaught error here would leave its caller waiting
                log.exception("admitting request %d failed", req.id)
                self.metrics.count_request("error")
                req.finish(None, SpecDecError(f"request {req.id} could not start: {exc!r}"))
        self._publish_gauges()

    def _next_ready(self) -> Optional[Request]:
        """The first waiting request that may start (FIFO), taken off the
        queue: a choice of an ``n`` request waits until the first choice's
        prompt is in (or it ended), so that it shares its cells."""
        for i, req in enumerate(self._waiting):
            lead = req.after
            if lead is None or lead.prefilled or lead.finished:
                del self._waiting[i]
                return req
        return None

    def _fail_all(self, failure: Optional[str]) -> None:
        """End every request in flight: with a SpecDecError carrying
        ``failure`` if the scheduler failed, else (a close) with a
        DecoderClosedError carrying what each request had produced."""
        with self._cond:  # closed in the same breath: no submission can slip in after
            self._closed = True
            self._failed = failure and f"{failure}; the decoder takes no more requests"
            pending = list(self._waiting) + list(self.loop.active)
            self._waiting.clear()
        fail_all(self.loop, pending, failure)
        self._publish_gauges()

    def _publish_gauges(self) -> None:
        with self.metrics.lock():
            self.metrics.queue_depth = len(self._waiting)
            self.metrics.active_sequences = len(self.loop.active)
