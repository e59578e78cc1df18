"""The responses the server keeps, so a client can continue one by its id.

OpenAI's Responses API is stateful by default: a response is stored
(``store``, default true) and a later request names it in
``previous_response_id`` instead of sending the conversation again; it can be
read back (``GET /v1/responses/{id}``, its input items under
``/input_items``) and deleted.  Here the store is the server process's
memory, bounded by a count (``ServerOptions.stored_responses``): the least
recently used response goes first, and with it every continuation's way
back through it (a continuation copies its chain's messages, so it does
not depend on its ancestors staying).  A restart forgets everything; under
Ray each replica keeps its own.  A response to be stored is found while it
runs too (``running``): GET answers it as it stands, and a background
response (``background: true``) can be cancelled.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Tuple

from .errors import RequestError

__all__ = ["StoredResponse", "ResponseStore", "Running", "page_of_items"]


@dataclass(frozen=True)
class StoredResponse:
    """A response as answered, and what a continuation of it starts from."""

    response: Dict[str, Any]  # the response object
    context: List[Dict[str, Any]]  # chat messages: the chain's, this input's and the answer (no instructions)
    input_items: List[Dict[str, Any]]  # this request's input, as items with ids
    item_ids: FrozenSet[str]  # the ids of every item of the chain, inputs and outputs
    events: Tuple[Dict[str, Any], ...] = ()  # a background response's stream, to be read again (GET ?stream=true)


@dataclass
class Running:
    """A response still being written: its builder (``response()`` as it stands, ``cancel()``), and the
    task writing it when nobody reads it (a background response)."""

    builder: Any
    task: Optional["asyncio.Task[None]"] = None


class ResponseStore:
    """At most ``capacity`` responses by id, least recently used dropped first (0 keeps none), and the
    responses to be stored that are still running (not counted: each ends soon, or is cancelled)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity  # checked with the server's options
        self._items: "OrderedDict[str, StoredResponse]" = OrderedDict()
        self._running: Dict[str, Running] = {}
        self._lock = threading.Lock()  # routes run on the event loop and in its thread pool

    def start(self, response_id: str, builder: Any) -> None:
        """``builder``'s response runs: found by :meth:`running` until :meth:`end`."""
        if self.capacity:
            with self._lock:
                self._running[response_id] = Running(builder)

    def run_in_background(self, response_id: str, task: "asyncio.Task[None]") -> None:
        """The task writing a background response (kept here, so it is neither collected nor lost)."""
        with self._lock:
            self._running[response_id].task = task

    def end(self, response_id: str) -> None:
        with self._lock:
            self._running.pop(response_id, None)

    def running(self, response_id: str) -> Optional[Running]:
        with self._lock:
            return self._running.get(response_id)

    def running_count(self) -> int:
        """Responses still running (every one ends: stored, or abandoned with its request)."""
        with self._lock:
            return len(self._running)

    def __len__(self) -> int:
        return len(self._items)

    def put(self, entry: StoredResponse) -> None:
        if self.capacity == 0:
            return
        with self._lock:
            self._items[entry.response["id"]] = entry
            self._items.move_to_end(entry.response["id"])
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def get(self, response_id: str) -> Optional[StoredResponse]:
        with self._lock:
            entry = self._items.get(response_id)
            if entry is not None:
                self._items.move_to_end(response_id)
            return entry

    def pop(self, response_id: str) -> Optional[StoredResponse]:
        with self._lock:
            return self._items.pop(response_id, None)

    def previous(self, response_id: str) -> StoredResponse:
        """The response a request continues (``previous_response_id``): a 400 in OpenAI's words when it is
        not here (never stored, deleted, dropped for newer ones, or made before a restart)."""
        entry = self.get(response_id)
        if entry is None and self.running(response_id) is not None:
            raise RequestError(400, f"Previous response with id '{response_id}' is still running: continue it "
                                    "once it has ended", param="previous_response_id",
                               code="previous_response_not_found")
        if entry is None:
            kept = (f"up to {self.capacity} stored responses in memory, the least recently used dropped "
                    "first, and none from before its restart" if self.capacity
                    else "no responses (--stored-responses 0)")
            raise RequestError(400, f"Previous response with id '{response_id}' not found; this server keeps "
                                    f"{kept}: send the whole input instead", param="previous_response_id",
                               code="previous_response_not_found")
        return entry

    def stored(self, response_id: str) -> StoredResponse:
        """A stored response, or OpenAI's 404."""
        entry = self.get(response_id)
        if entry is None:
            raise RequestError(404, f"No response with id '{response_id}' is stored here", param="response_id",
                               code="not_found")
        return entry


def page_of_items(items: Sequence[Dict[str, Any]], *, limit: int, order: str, after: Optional[str]
                  ) -> Dict[str, Any]:
    """A page of input items as OpenAI lists them: ``order`` "desc" (newest first) or "asc", the ``limit``
    items after the item ``after`` (a 400 when no item has that id)."""
    ordered = list(items) if order == "asc" else list(reversed(items))
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise RequestError(400, f"after: no input item of this response has the id '{after}'", param="after")
        ordered = ordered[ids.index(after) + 1:]
    page = ordered[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(ordered) > limit}
