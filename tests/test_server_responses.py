"""OpenAI's Responses API (``POST /v1/responses``) through the ``openai`` SDK:
``responses.create``, ``responses.stream`` (its own assembly of the typed
events) and ``responses.parse``; tools and their calls sent back as input;
``text.format``; a bad field named in the request's own terms.  Each answer
is checked against the chat completion the request amounts to, decoded by
the same server (γ = 3), so the two paths cannot drift apart."""

from __future__ import annotations

import json
from typing import List, Literal

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
jsonschema = pytest.importorskip("jsonschema")
from pydantic import BaseModel, Field  # noqa: E402
from server_thread import ThreadServer  # noqa: E402

ADD = {"type": "function", "name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99},
                                     "b": {"type": "integer", "minimum": -99, "maximum": 99}},
    "required": ["a", "b"], "additionalProperties": False}}
WEATHER = {"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"], "additionalProperties": False}}
TOOLS = [ADD, WEATHER]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in TOOLS]
PARAMS = {t["name"]: t["parameters"] for t in TOOLS}


class Pet(BaseModel):
    name: str = Field(max_length=10)
    kind: Literal["cat", "dog"]
    tags: List[Literal["red", "blue"]] = Field(max_length=2)


def start(target: str, draft: str, **options) -> ThreadServer:
    from specdec_cpu import BatchedDecoder
    from specdec_cpu.server.openai_app import ServerOptions

    def load():
        return BatchedDecoder.from_gguf(target, draft, max_sequences=2, n_ctx=4096, n_threads=1, gamma=3)

    return ThreadServer(load, ServerOptions(model_name="tiny", **options))


@pytest.fixture(scope="module")
def server(tools_target, tiny_draft):
    with start(tools_target, tiny_draft) as s:
        yield s


def client(server) -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def chat(server, **body) -> dict:
    r = server.post("/v1/chat/completions", {"model": "tiny", **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_response_is_the_chat_completion_it_amounts_to(server) -> None:
    """Text in, text out: the same tokens as the chat completion with the same messages and seed, the
    settings echoed, usage in the Responses API's names; cut by max_output_tokens, it is incomplete."""
    from specdec_cpu.server.openapi import ResponseObject

    c = client(server)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]
    # A seed repeats draws with the same cached prefix, in the draft too: a warm-up that drafts caches both.
    chat(server, messages=messages, max_completion_tokens=8)
    for seed in range(3):
        r = c.responses.create(model="tiny", input="hello there", instructions="Be brief.", temperature=1.0,
                               max_output_tokens=40, extra_body={"seed": seed})
        same = chat(server, messages=messages, temperature=1.0, max_completion_tokens=40, seed=seed)
        assert r.object == "response" and r.id.startswith("resp_") and r.model == "tiny"
        assert r.output_text == same["choices"][0]["message"]["content"]
        assert r.usage.input_tokens == same["usage"]["prompt_tokens"]
        assert r.usage.output_tokens == same["usage"]["completion_tokens"]
        assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
        assert r.instructions == "Be brief." and r.max_output_tokens == 40 and r.temperature == 1.0
        (item,) = r.output
        assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
        if same["choices"][0]["finish_reason"] == "length":
            assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
            assert item.status == "incomplete"
        else:
            assert r.status == "completed" and r.incomplete_details is None and item.status == "completed"
    raw = server.post("/v1/responses", {"model": "tiny", "input": "hello", "max_output_tokens": 3}).json()
    ResponseObject.model_validate(raw)  # the answer /openapi.json documents
    assert raw["status"] == "incomplete" and raw["usage"]["output_tokens"] == 3
    assert raw["usage"]["speculation"]["drafted"] > 0  # γ = 3 ran: the draft proposed tokens


def test_a_streamed_response_assembles_to_the_whole_one(server) -> None:
    """The typed events, in order and numbered, add up (by the SDK's own stream helper) to the response that
    the last event carries, and to the text the same request gets whole.  Cut by max_output_tokens, the last
    event is response.incomplete, as OpenAI's (the helper's get_final_response wants response.completed:
    the tool-call test below gets that one)."""
    c = client(server)
    c.responses.create(model="tiny", input="hello there", max_output_tokens=8)  # cached for both (and drafted)
    whole = c.responses.create(model="tiny", input="hello there", temperature=1.0, max_output_tokens=60,
                               extra_body={"seed": 5})
    with c.responses.stream(model="tiny", input="hello there", temperature=1.0, max_output_tokens=60,
                            extra_body={"seed": 5}) as stream:
        events = list(stream)
    final = events[-1].response
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert whole.status == "incomplete"
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == whole.output_text and len(deltas) > 0
    assert final.id == events[0].response.id and final.usage.output_tokens == whole.usage.output_tokens
    # raw HTTP: each event names its type, and no [DONE] follows (OpenAI's Responses stream)
    import httpx

    with httpx.stream("POST", server.url + "/v1/responses", timeout=60,
                      json={"model": "tiny", "input": "hi", "max_output_tokens": 5, "stream": True}) as r:
        lines = [line for line in r.iter_lines() if line]
    names = [line[len("event: "):] for line in lines if line.startswith("event: ")]
    datas = [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ")]
    assert names == [d["type"] for d in datas] and names[-1] == "response.incomplete"


def test_logprobs_are_chat_s_whole_and_streamed(server) -> None:
    """include ["message.output_text.logprobs"] with top_logprobs: the entries the chat completion reports for
    the same tokens, on the output_text whole, and spread over the text deltas streamed."""
    c = client(server)
    body = dict(model="tiny", input="hello there", temperature=1.0, max_output_tokens=12,
                include=["message.output_text.logprobs"], top_logprobs=2, extra_body={"seed": 4})
    c.responses.create(**{**body, "max_output_tokens": 8})  # the prompt cached for all three, in both models
    whole = c.responses.create(**body)
    same = chat(server, messages=[{"role": "user", "content": "hello there"}], temperature=1.0,
                max_completion_tokens=12, seed=4, logprobs=True, top_logprobs=2)
    entries = [e.model_dump() for e in whole.output[0].content[0].logprobs]
    assert entries == same["choices"][0]["logprobs"]["content"] and len(entries) == 12
    assert all(len(e["top_logprobs"]) == 2 for e in entries)
    with c.responses.stream(**body) as stream:
        events = list(stream)
    streamed = [e.model_dump() for ev in events if ev.type == "response.output_text.delta" for e in ev.logprobs]
    assert streamed == entries
    plain = c.responses.create(model="tiny", input="hello there", max_output_tokens=3)
    assert plain.output[0].content[0].logprobs == []  # none asked


def test_tool_calls_and_their_outputs_round_trip(server) -> None:
    """Forced calls come out as function_call items valid against their tool's schema (whole and streamed);
    sent back as input with their outputs, they are read as the chat's calls and tool results."""
    c = client(server)
    for seed in range(3):
        r = c.responses.create(model="tiny", input="2 + 3?", tools=TOOLS, tool_choice="required",
                               temperature=1.0, max_output_tokens=200, extra_body={"seed": seed})
        calls = [item for item in r.output if item.type == "function_call"]
        assert calls and r.status == "completed", r
        for call in calls:
            assert call.call_id.startswith("call_") and call.id.startswith("fc_")
            jsonschema.validate(json.loads(call.arguments), PARAMS[call.name])
    with c.responses.stream(model="tiny", input="2 + 3?", tools=TOOLS, tool_choice={"type": "function", "name": "add"},
                            parallel_tool_calls=False, temperature=1.0, max_output_tokens=200,
                            extra_body={"seed": 1}) as stream:
        events = list(stream)
        final = stream.get_final_response()
    (call,) = final.output
    assert call.type == "function_call" and call.name == "add"
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert args == call.arguments and json.loads(args).keys() == {"a", "b"}
    # the call and its output sent back: the same prompt as the chat history they stand for
    # (the SDK's output objects themselves, as OpenAI's guide sends them back)
    follow = [{"role": "user", "content": "2 + 3?"}, *final.output,
              {"type": "function_call_output", "call_id": call.call_id, "output": "5"}]
    r = c.responses.create(model="tiny", input=follow, tools=TOOLS, max_output_tokens=1, temperature=0)
    dumped = c.responses.create(model="tiny", input=[follow[0], *[o.model_dump() for o in final.output], follow[-1]],
                                tools=TOOLS, max_output_tokens=1, temperature=0)  # the SDK's null fields too
    assert dumped.usage.input_tokens == r.usage.input_tokens
    history = [{"role": "user", "content": "2 + 3?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": call.call_id, "type": "function", "function": {"name": "add", "arguments": call.arguments}}]},
               {"role": "tool", "tool_call_id": call.call_id, "content": "5"}]
    same = chat(server, messages=history, tools=CHAT_TOOLS, max_completion_tokens=1, temperature=0)
    assert r.usage.input_tokens == same["usage"]["prompt_tokens"]
    # an assistant's text and the calls right after it are one turn
    said = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Adding."}]}
    r = c.responses.create(model="tiny", input=[follow[0], said, *follow[1:]], tools=TOOLS, max_output_tokens=1,
                           temperature=0)
    history[1]["content"] = "Adding."
    same = chat(server, messages=history, tools=CHAT_TOOLS, max_completion_tokens=1, temperature=0)
    assert r.usage.input_tokens == same["usage"]["prompt_tokens"]


def test_text_format_shapes_the_output(server) -> None:
    c = client(server)
    for seed in range(3):
        parsed = c.responses.parse(model="tiny", input="a pet", text_format=Pet, temperature=1.0,
                                   max_output_tokens=200, extra_body={"seed": seed})
        assert isinstance(parsed.output_parsed, Pet)
    r = c.responses.create(model="tiny", input="an object", text={"format": {"type": "json_object"}},
                           temperature=1.0, max_output_tokens=200, extra_body={"seed": 0})
    assert isinstance(json.loads(r.output_text), dict)


def test_a_failure_mid_stream_is_a_failed_response(tools_target, tiny_draft) -> None:
    """Decoding that fails after the stream started (here: the server's time limit) ends the stream with
    response.failed: the text written so far left incomplete, the error's code and message in the response;
    whole, the same request is a 504."""
    with start(tools_target, tiny_draft, request_timeout=0.3) as slow:
        c = client(slow)
        body = dict(model="tiny", input="go on", max_output_tokens=4000, extra_body={"ignore_eos": True})
        with c.responses.stream(**body) as stream:
            events = list(stream)
        last = events[-1]
        assert last.type == "response.failed" and last.response.status == "failed", [e.type for e in events[-3:]]
        assert last.response.error.code == "timeout" and "limit" in last.response.error.message
        if any(e.type == "response.output_text.delta" for e in events):  # (none if the machine is that slow)
            assert last.response.output[0].status == "incomplete" and last.response.output_text
        assert [e.sequence_number for e in events] == list(range(len(events)))
        with pytest.raises(openai.APIStatusError) as info:
            c.responses.create(**body)
        assert info.value.status_code == 504


BAD = [
    ({"previous_response_id": "resp_1"}, "previous_response_id", "previous_response_not_found", "not found"),
    ({"conversation": "conv_1"}, "conversation", "unsupported_parameter", "previous_response_id"),
    ({"reasoning": {"effort": "low"}}, "reasoning", "unsupported_parameter", "not supported"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]", None, "hosted tools"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name", "invalid_tools",
     "'nope'"),
    ({"tools": [dict(ADD, parameters={"type": "array"})]}, "tools[0].parameters", "invalid_tools",
     "tools[0].parameters must describe an object"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "foo"}}}}, "text.format.schema",
     "invalid_grammar", "foo"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input[0].content[0].type", None, "input_text"),
    ({"input": [{"type": "function_call", "name": "add", "arguments": "{}"}]}, "input[0].call_id", None,
     "required"),
    ({"input": []}, "input", None, "at least 1"),
    ({"max_output_tokens": 0}, "max_output_tokens", None, "greater than or equal to 1"),
    ({"include": ["file_search_call.everything"]}, "include[0]", None, "message.output_text.logprobs"),
    ({"top_logprobs": 2, "tools": TOOLS}, "top_logprobs", None, "with tools"),
    ({"include": ["message.output_text.logprobs"], "tools": TOOLS}, "include", None, "with tools"),
    ({"input": 5}, "input", None, "must be a string or a list"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "add", "x": 1}}, "tool_choice.x", None,
     "unknown field"),
    ({"input": [{"type": [[]], "role": "user", "content": "x"}]}, "input[0]", None, "an input item is"),
    ({"text": {"format": {"type": "json_schema", "name": 5, "schema": {}}}}, "text.format.name", None, "string"),
    ({"text": {"format": {"type": "xml"}}}, "text.format", None, "json_schema"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]", None, "item references are not taken"),
    ({"temprature": 0.5}, "temprature", "unknown_parameter", "unknown field"),
    ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}]}, "input[0].encrypted_content",
     None, "no encrypted reasoning"),
    ({"reasoning_format": "hidden"}, "reasoning_format", None, "'auto'"),
    ({"instructions": "x" * 20000}, "input", "context_length_exceeded", "context"),
]


@pytest.mark.parametrize("extra, param, code, words", BAD, ids=[b[1] + ":" + b[3] for b in BAD])
def test_bad_requests_name_the_responses_field(server, extra, param, code, words) -> None:
    body = {"model": "tiny", "input": "hello", "max_output_tokens": 4, **extra}
    r = server.post("/v1/responses", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err
    if code is not None:
        assert err["code"] == code, err
    with pytest.raises(openai.BadRequestError) as info:
        client(server).responses.create(**{k: v for k, v in body.items() if k in ("model", "input")},
                                        extra_body={k: v for k, v in body.items() if k not in ("model", "input")})
    assert info.value.param == param


def test_langchain_over_the_responses_api(server) -> None:
    """LangChain's ``ChatOpenAI(use_responses_api=True)``: plain text, a structured answer, tool calls whole and
    streamed, and a tool's result sent back."""
    lc = pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    llm = lc.ChatOpenAI(base_url=server.url + "/v1", api_key="unused", model="tiny", temperature=1.0,
                        max_tokens=200, max_retries=0, use_responses_api=True, extra_body={"seed": 3})
    assert llm.invoke("hello").text
    assert isinstance(llm.with_structured_output(Pet, method="json_schema").invoke("a pet"), Pet)

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    bound = llm.bind_tools([add], tool_choice="add", strict=True)  # strict: no arguments beyond a and b
    msg = bound.invoke("Add 2 and 3.")
    (call,) = msg.tool_calls
    assert call["name"] == "add" and set(call["args"]) == {"a", "b"}
    chunks = list(bound.stream("Add 2 and 3."))
    merged = chunks[0]
    for ch in chunks[1:]:
        merged = merged + ch
    assert [c["name"] for c in merged.tool_calls] == ["add"]
    history = [HumanMessage("Add 2 and 3."), msg, ToolMessage(str(add.invoke(call["args"])), tool_call_id=call["id"])]
    assert llm.invoke(history).text is not None
