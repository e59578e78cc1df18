"""Stored responses of the Responses API: ``previous_response_id`` continues a
response (its conversation and answer before the new input, its instructions
not), whole and streamed, after text and after function calls; a stored
response is read back, its input items listed a page at a time, and deleted;
``store: false`` and a server keeping none store nothing.  Each continuation
is checked against the chat completion with the whole history, on the same
server (γ = 3), and through the ``openai`` SDK and LangChain's
``use_previous_response_id``."""

from __future__ import annotations

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
from test_server_responses import CHAT_TOOLS, TOOLS, client, start  # noqa: E402

from specdec_cpu.server.response_store import ResponseStore, StoredResponse  # noqa: E402


@pytest.fixture(scope="module")
def server(tools_target, tiny_draft):
    with start(tools_target, tiny_draft) as s:
        yield s


def prompt_tokens(server, messages, **body) -> int:
    r = server.post("/v1/chat/completions", {"model": "tiny", "messages": messages, "max_completion_tokens": 1,
                                             "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens"]


def test_a_response_is_continued_by_its_id(server) -> None:
    """Each turn sends only its new input: the prompt is the chat history of every turn so far (the answers
    included, each turn's own instructions only), and the continuation of a continuation works too."""
    c = client(server)
    first = c.responses.create(model="tiny", input="hello there", instructions="Be brief.", max_output_tokens=6,
                               temperature=0)
    assert first.store is True and first.previous_response_id is None
    second = c.responses.create(model="tiny", previous_response_id=first.id, input="and again",
                                instructions="Be kind.", max_output_tokens=6, temperature=0)
    assert second.previous_response_id == first.id and second.store is True
    turns = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": first.output_text},
             {"role": "user", "content": "and again"}]
    assert second.usage.input_tokens == prompt_tokens(server, [{"role": "system", "content": "Be kind."}, *turns])
    third = c.responses.create(model="tiny", previous_response_id=second.id, max_output_tokens=6, temperature=0,
                               input=[{"role": "user", "content": [{"type": "input_text", "text": "once more"}]}])
    turns += [{"role": "assistant", "content": second.output_text}, {"role": "user", "content": "once more"}]
    assert third.usage.input_tokens == prompt_tokens(server, turns)
    # the same as sending the whole conversation, the earlier outputs as they came
    whole = c.responses.create(model="tiny", input=[turns[0], *first.output, turns[2], *second.output, turns[4]],
                               max_output_tokens=6, temperature=0, store=False)
    assert whole.usage.input_tokens == third.usage.input_tokens
    # ... but not both: an item the continued conversation holds is OpenAI's 400 "Duplicate item found"
    with pytest.raises(openai.BadRequestError) as info:
        c.responses.create(model="tiny", previous_response_id=second.id, input=[*second.output, turns[4]],
                           max_output_tokens=1)
    assert info.value.param == "input[0].id" and "Duplicate item" in info.value.message


def test_a_continuation_after_calls_sends_only_their_outputs(server) -> None:
    """The agent's loop: a response calls a tool; the next request continues it with the call's output
    alone.  Streamed, the response stored is the one the last event carries."""
    c = client(server)
    called = c.responses.create(model="tiny", input="2 + 3?", tools=TOOLS, parallel_tool_calls=False,
                                tool_choice={"type": "function", "name": "add"}, temperature=1.0,
                                max_output_tokens=200, extra_body={"seed": 1})
    (call,) = called.output
    assert call.type == "function_call"
    result = [{"type": "function_call_output", "call_id": call.call_id, "output": "5"}]
    with c.responses.stream(model="tiny", previous_response_id=called.id, input=result, tools=TOOLS,
                            max_output_tokens=4, temperature=0) as stream:
        events = list(stream)
    final = events[-1].response
    history = [{"role": "user", "content": "2 + 3?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": call.call_id, "type": "function", "function": {"name": "add", "arguments": call.arguments}}]},
               {"role": "tool", "tool_call_id": call.call_id, "content": "5"}]
    assert final.usage.input_tokens == prompt_tokens(server, history, tools=CHAT_TOOLS)
    assert final.previous_response_id == called.id
    assert c.responses.retrieve(final.id).model_dump() == final.model_dump()


def test_a_stored_response_is_read_listed_and_deleted(server) -> None:
    c = client(server)
    said = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "three"}]}]
    r = c.responses.create(model="tiny", input=said, max_output_tokens=3)
    assert c.responses.retrieve(r.id).model_dump() == r.model_dump()
    items = c.responses.input_items.list(r.id).data  # newest first, by default
    assert [(i.role, i.content[0].type, i.content[0].text) for i in items] == [
        ("user", "input_text", "three"), ("assistant", "output_text", "two"), ("user", "input_text", "one")]
    assert all(i.type == "message" and i.id.startswith("msg_") for i in items)
    page = c.responses.input_items.list(r.id, order="asc", limit=2)
    assert [i.content[0].text for i in page.data] == ["one", "two"] and page.has_more
    rest = c.responses.input_items.list(r.id, order="asc", after=page.data[-1].id)
    assert [i.content[0].text for i in rest.data] == ["three"] and not rest.has_more
    for path, param in (("/input_items?limit=0", "limit"), ("/input_items?order=sideways", "order"),
                        ("/input_items?after=msg_nope", "after"), ("/input_items?include=everything", "include[0]"),
                        ("?stream=true", "stream"), ("?stream=true&starting_after=-1", "starting_after")):
        bad = httpx.get(f"{server.url}/v1/responses/{r.id}{path}", timeout=60)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param, bad.text
    # ids repeated within one input would make the pages ambiguous: refused
    dup = [{"id": "msg_a", "role": "user", "content": "x"}, {"id": "msg_a", "role": "user", "content": "y"}]
    bad = server.post("/v1/responses", {"model": "tiny", "input": dup, "max_output_tokens": 1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input[1].id", bad.text
    c.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.delete(r.id)
    with pytest.raises(openai.BadRequestError) as info:
        c.responses.create(model="tiny", previous_response_id=r.id, input="four", max_output_tokens=3)
    assert info.value.code == "previous_response_not_found" and info.value.param == "previous_response_id"
    unstored = c.responses.create(model="tiny", input="hi", max_output_tokens=3, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(unstored.id)


def test_a_deleted_response_leaves_its_continuations_whole(server) -> None:
    """A continuation holds its chain's messages itself: deleting (or evicting) an earlier response does not
    change what continuing the later one means."""
    c = client(server)
    first = c.responses.create(model="tiny", input="hello", max_output_tokens=4, temperature=0)
    second = c.responses.create(model="tiny", previous_response_id=first.id, input="next", max_output_tokens=4,
                                temperature=0)
    before = c.responses.create(model="tiny", previous_response_id=second.id, input="last", max_output_tokens=1,
                                temperature=0, store=False)
    c.responses.delete(first.id)
    after = c.responses.create(model="tiny", previous_response_id=second.id, input="last", max_output_tokens=1,
                               temperature=0, store=False)
    assert after.usage.input_tokens == before.usage.input_tokens


def test_the_store_drops_the_least_recently_used() -> None:
    store = ResponseStore(2)
    for rid in ("a", "b"):
        store.put(StoredResponse({"id": rid}, [], [], frozenset()))
    assert store.get("a") is not None  # used: b is now the oldest
    store.put(StoredResponse({"id": "c"}, [], [], frozenset()))
    assert [rid for rid in "abc" if store.get(rid) is not None] == ["a", "c"] and len(store) == 2
    none = ResponseStore(0)
    none.put(StoredResponse({"id": "a"}, [], [], frozenset()))
    assert none.get("a") is None
    from specdec_cpu.server.openai_app import ServerOptions

    with pytest.raises(ValueError, match="stored_responses"):
        ServerOptions(model_name="x", stored_responses=-1)
    with pytest.raises(ValueError, match="reasoning_format"):
        ServerOptions(model_name="x", reasoning_format="off")


def test_a_server_keeping_none_says_so(tools_target, tiny_draft) -> None:
    with start(tools_target, tiny_draft, stored_responses=0) as keeping_none:
        c = client(keeping_none)
        r = c.responses.create(model="tiny", input="hi", max_output_tokens=2)
        assert r.store is False
        with pytest.raises(openai.BadRequestError) as info:
            c.responses.create(model="tiny", previous_response_id=r.id, input="again", max_output_tokens=2)
        assert info.value.code == "previous_response_not_found"


def test_langchain_continues_by_previous_response_id(server) -> None:
    """LangChain's ``ChatOpenAI(use_previous_response_id=True)`` sends only the messages after its last answer,
    naming that answer's response."""
    lc = pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage

    llm = lc.ChatOpenAI(base_url=server.url + "/v1", api_key="unused", model="tiny", temperature=0, max_tokens=6,
                        max_retries=0, use_responses_api=True, use_previous_response_id=True)
    first = llm.invoke("hello there")
    second = llm.invoke([HumanMessage("hello there"), first, HumanMessage("and again")])
    stored = client(server).responses.retrieve(second.response_metadata["id"])
    assert stored.previous_response_id == first.response_metadata["id"]
    turns = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": first.text},
             {"role": "user", "content": "and again"}]
    assert stored.usage.input_tokens == prompt_tokens(server, turns)
