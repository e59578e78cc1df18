"""Background responses of the Responses API (``background: true``): answered
at once, polled by GET to the same text a foreground response gives, cancelled
by POST .../cancel or DELETE, streamed (by their request, or again by GET
?stream=true) whether or not a client reads them; and GET of a response
still streaming answers it as it stands.  The decoder's passes are held at a gate where a test needs
a response to be still running, so nothing depends on timing."""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
from batched_helpers import wait_idle  # noqa: E402
from test_server_responses import client, start  # noqa: E402


@pytest.fixture(scope="module")
def server(tools_target, tiny_draft):
    with start(tools_target, tiny_draft) as s:
        yield s


@contextmanager
def gated(server) -> Iterator[threading.Event]:
    """Every target pass waits for the gate (set it to let them go)."""
    dec = server.app.state.specdec.decoder
    gate = threading.Event()
    real = dec.target.decode

    def decode(parts):
        assert gate.wait(60), "the gate was never opened"
        return real(parts)

    dec.target.decode = decode
    try:
        yield gate
    finally:
        gate.set()
        del dec.target.decode
        wait_idle(dec)


def running(server) -> int:
    return server.app.state.response_store.running_count()


def poll(c: "openai.OpenAI", response_id: str, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while True:
        response = c.responses.retrieve(response_id)
        if response.status != "in_progress" or time.monotonic() > end:
            return response
        time.sleep(0.05)


def test_a_background_response_is_polled_to_the_foreground_text(server) -> None:
    c = client(server)
    ask = dict(model="tiny", input="Tell me about the sea.", max_output_tokens=16, temperature=0)
    started = c.responses.create(**ask, background=True)
    assert started.background is True and started.status == "in_progress" and started.output == []
    done = poll(c, started.id)
    alone = c.responses.create(**ask, store=False)
    assert done.status == alone.status and done.output_text == alone.output_text and done.background is True
    assert done.usage.output_tokens == alone.usage.output_tokens
    again = c.responses.create(model="tiny", previous_response_id=done.id, input="More.", max_output_tokens=4)
    assert again.status in ("completed", "incomplete")
    assert running(server) == 0


def test_a_cancelled_background_response_stays_cancelled(server) -> None:
    c = client(server)
    with gated(server) as gate:
        started = c.responses.create(model="tiny", input="Count to fifty.", max_output_tokens=40, temperature=0,
                                     background=True)
        assert c.responses.retrieve(started.id).status == "in_progress"
        early = server.post("/v1/responses", {"model": "tiny", "input": "and?", "previous_response_id": started.id})
        assert early.status_code == 400 and "still running" in early.json()["error"]["message"]
        cancelled = c.responses.cancel(started.id)
        assert cancelled.status == "cancelled" and cancelled.id == started.id
        gate.set()
    assert c.responses.retrieve(started.id).status == "cancelled"  # not overwritten by the decoder's end
    assert c.responses.cancel(started.id).status == "cancelled"  # cancelling again changes nothing
    after = c.responses.create(model="tiny", input="hello", max_output_tokens=4)  # the decoder goes on
    assert after.status in ("completed", "incomplete") and running(server) == 0


def test_deleting_a_running_background_response_stops_and_forgets_it(tools_target, tiny_draft) -> None:
    """Its request ends cancelled (not run to its end), and, the store full, no stored response is pushed
    out for it."""
    with start(tools_target, tiny_draft, stored_responses=2) as small:
        c = client(small)
        dec = small.app.state.specdec.decoder
        kept = [c.responses.create(model="tiny", input=f"hi {i}", max_output_tokens=2).id for i in range(2)]
        with gated(small):
            started = c.responses.create(model="tiny", input="Count to fifty.", max_output_tokens=40,
                                         background=True)
            assert c.responses.delete(started.id) is None
            with pytest.raises(openai.NotFoundError):
                c.responses.retrieve(started.id)
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(started.id)
        assert dec.metrics().requests.get("cancelled", 0) == 1 and running(small) == 0
        assert [c.responses.retrieve(i).id for i in kept] == kept


def test_a_streaming_response_is_found_while_it_streams(server) -> None:
    """GET answers a stored response still being streamed as it stands; it cannot be cancelled or deleted
    (it ends with its request)."""
    with gated(server) as gate:
        with httpx.stream("POST", server.url + "/v1/responses", timeout=60,
                          json={"model": "tiny", "input": "hi", "max_output_tokens": 8, "stream": True}) as r:
            lines = r.iter_lines()
            response_id = None
            for line in lines:
                if line.startswith("data: "):
                    response_id = json.loads(line[6:])["response"]["id"]
                    break
            got = httpx.get(f"{server.url}/v1/responses/{response_id}").json()
            assert got["status"] == "in_progress" and got["background"] is False
            assert server.post(f"/v1/responses/{response_id}/cancel").status_code == 400
            assert httpx.delete(f"{server.url}/v1/responses/{response_id}").status_code == 400
            gate.set()
            for _ in lines:
                pass
    assert httpx.get(f"{server.url}/v1/responses/{response_id}").json()["status"] in ("completed", "incomplete")
    assert running(server) == 0


def test_a_response_whose_client_left_or_that_failed_is_not_left_running(server, tools_target, tiny_draft) -> None:
    with gated(server):
        with httpx.stream("POST", server.url + "/v1/responses", timeout=60,
                          json={"model": "tiny", "input": "hi", "max_output_tokens": 8, "stream": True}) as r:
            next(line for line in r.iter_lines() if line.startswith("data: "))
        # the connection is closed mid-stream
    end = time.monotonic() + 30
    while running(server) and time.monotonic() < end:
        time.sleep(0.05)
    assert running(server) == 0
    with start(tools_target, tiny_draft, request_timeout=0.2) as hasty:
        c = client(hasty)
        with gated(hasty) as gate:
            started = c.responses.create(model="tiny", input="hi", max_output_tokens=40, background=True)
            time.sleep(0.5)  # past the time limit: the request ends, timed out, at the next step
            gate.set()
        failed = poll(c, started.id)
        assert failed.status == "failed" and failed.error.code == "timeout", failed
        assert running(hasty) == 0


def _wait_for(condition, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "waited in vain"
        time.sleep(0.02)


def _text_of(events) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def test_a_streamed_background_response_outlives_its_client_and_streams_again(server) -> None:
    """Its client leaves after the first event; it runs to the foreground's text all the same, and
    GET ?stream=true gives its events again (after ``starting_after`` when given), as the SDK reads them."""
    c = client(server)
    ask = dict(model="tiny", input="Tell me about the sea.", max_output_tokens=16, temperature=0)
    with gated(server):
        with c.responses.create(**ask, background=True, stream=True) as stream:
            first = next(iter(stream))
        assert first.type == "response.created" and first.sequence_number == 0
        response_id = first.response.id
        assert c.responses.retrieve(response_id).status == "in_progress"  # its client has left: it goes on
    done = poll(c, response_id)
    alone = c.responses.create(**ask, store=False)
    assert done.status == alone.status and done.output_text == alone.output_text != ""
    events = list(c.responses.retrieve(response_id, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == f"response.{done.status}"
    assert _text_of(events) == done.output_text and events[-1].response.output_text == done.output_text
    later = list(c.responses.retrieve(response_id, stream=True, starting_after=3))
    assert [e.sequence_number for e in later] == list(range(4, len(events)))
    assert running(server) == 0


def test_a_running_background_response_is_followed_to_its_end(server) -> None:
    """GET ?stream=true of a running background response sends the events so far, then the rest as they
    come; a cancel ends the streams that follow it."""
    c = client(server)
    ask = dict(model="tiny", input="Tell me about the sea.", max_output_tokens=16, temperature=0)
    followed: list = []
    with gated(server) as gate:
        started = c.responses.create(**ask, background=True)
        follower = threading.Thread(target=lambda: followed.extend(c.responses.retrieve(started.id, stream=True)))
        follower.start()
        _wait_for(lambda: len(followed) >= 2)
        time.sleep(0.2)  # held at the gate: nothing more comes
        assert follower.is_alive() and [e.type for e in followed] == ["response.created", "response.in_progress"]
        gate.set()
        follower.join(60)
    assert not follower.is_alive()
    done = c.responses.retrieve(started.id)
    assert followed[-1].type == f"response.{done.status}" and _text_of(followed) == done.output_text != ""

    with gated(server):
        started = c.responses.create(**{**ask, "max_output_tokens": 40}, background=True)
        followed.clear()
        follower = threading.Thread(target=lambda: followed.extend(c.responses.retrieve(started.id, stream=True)))
        follower.start()
        _wait_for(lambda: len(followed) >= 2)
        assert c.responses.cancel(started.id).status == "cancelled"
        follower.join(60)
        assert not follower.is_alive() and followed[0].type == "response.created"
    assert running(server) == 0


def test_background_needs_a_store(server, tools_target, tiny_draft) -> None:
    def refused(r: httpx.Response, param: str) -> None:
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text

    ask = {"model": "tiny", "input": "hi", "max_output_tokens": 2, "background": True}
    refused(server.post("/v1/responses", {**ask, "store": False}), "background")
    plain = client(server).responses.create(model="tiny", input="hi", max_output_tokens=2)
    refused(server.post(f"/v1/responses/{plain.id}/cancel"), "response_id")
    refused(httpx.get(f"{server.url}/v1/responses/{plain.id}?stream=true"), "stream")  # only background's kept
    assert httpx.get(f"{server.url}/v1/responses/{plain.id}?starting_after=2").json()["id"] == plain.id  # ignored
    assert httpx.get(f"{server.url}/v1/responses/{plain.id}?stream=true&starting_after=-1").status_code == 400
    assert httpx.get(f"{server.url}/v1/responses/resp_nothing?stream=true").status_code == 404
    assert server.post("/v1/responses/resp_nothing/cancel").status_code == 404
    with start(tools_target, tiny_draft, stored_responses=0) as keeps_none:
        r = keeps_none.post("/v1/responses", ask)
        refused(r, "background")
        assert "--stored-responses 0" in r.json()["error"]["message"]
