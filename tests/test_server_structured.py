"""Structured output and tool calls through the HTTP server, driven by clients
no one here wrote: the ``openai`` SDK (``chat.completions.parse`` with a
pydantic model, tool calls whole and streamed) and LangChain's ``ChatOpenAI``
(``with_structured_output``, ``bind_tools``).  Outputs are checked with
``jsonschema``; prompts against the chat template rendered by plain jinja2.

A live server (uvicorn in a thread) over the tiny target with a chat
template that renders tools as Qwen2.5's does (server_thread.py)."""

from __future__ import annotations

import json
import re
from typing import List, Literal, Optional

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
jsonschema = pytest.importorskip("jsonschema")
from pydantic import BaseModel, Field  # noqa: E402
from server_thread import TOOLS_TEMPLATE, ThreadServer, render_independently, write_tools_model  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "a + b",
    "parameters": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": -99, "maximum": 99},
        "b": {"type": "integer", "minimum": -99, "maximum": 99}},
        "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
USER = [{"role": "user", "content": "hello there"}]
FUNCTIONS = [t["function"] for t in TOOLS]  # OpenAI's deprecated shape of the same tools


class Pet(BaseModel):
    name: str = Field(max_length=10)
    kind: Literal["cat", "dog", "fish"]
    age: int = Field(ge=0, le=30)
    tags: List[Literal["red", "blue"]] = Field(max_length=3)
    vaccinated: bool
    owner: Optional[str] = Field(default=None, max_length=8)


@pytest.fixture(scope="module")
def server(tools_target, tiny_draft):
    from specdec_cpu import BatchedDecoder
    from specdec_cpu.server.openai_app import ServerOptions

    def load():
        return BatchedDecoder.from_gguf(tools_target, tiny_draft, max_sequences=4, n_ctx=4096, n_threads=1,
                                        gamma=3)

    with ThreadServer(load, ServerOptions(model_name="tiny")) as s:
        yield s


def client(server) -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def valid_call(name: str, arguments: str) -> dict:
    args = json.loads(arguments)
    jsonschema.validate(args, PARAMS[name])
    return args


# ---------------------------------------------------------------------------
# response_format, grammar, json_schema
# ---------------------------------------------------------------------------


def test_openai_parse_returns_the_pydantic_model(server) -> None:
    c = client(server)
    for seed in range(4):
        r = c.chat.completions.parse(model="tiny", messages=USER, response_format=Pet, temperature=1.0, seed=seed,
                                     max_tokens=400)
        msg = r.choices[0].message
        assert isinstance(msg.parsed, Pet), msg
        jsonschema.validate(json.loads(msg.content), Pet.model_json_schema())
        assert r.choices[0].finish_reason == "stop"


def test_json_object_json_schema_and_grammar_on_both_endpoints_streamed_too(server) -> None:
    c = client(server)
    r = c.chat.completions.create(model="tiny", messages=USER, response_format={"type": "json_object"},
                                  temperature=1.0, seed=3, max_tokens=300)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # cut by max_tokens: still an object's beginning
        assert r.choices[0].message.content.startswith("{")
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
              "required": ["ok", "n"], "additionalProperties": False}
    for stream in (False, True):
        body = {"model": "tiny", "prompt": "the", "max_tokens": 64, "json_schema": schema, "stream": stream}
        text = completion_text(server, body)
        jsonschema.validate(json.loads(text), schema)
        body = {"model": "tiny", "prompt": "the", "max_tokens": 64, "stream": stream, "seed": 5,
                "grammar": 'root ::= "yes" | "no" | "maybe " [0-9]'}
        assert re.fullmatch(r"yes|no|maybe [0-9]", completion_text(server, body))
        body = {"model": "tiny", "messages": USER, "max_tokens": 64, "stream": stream, "response_format": {
            "type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}}
        jsonschema.validate(json.loads(completion_text(server, body, chat=True)), schema)


CHOICES = ['say "hi"', "back\\slash", "two\nlines", "caf\u00e9 \u00fc", "del\x7f\x01", "ab"]


def test_vllm_structured_outputs_and_guided_fields(server) -> None:
    """vLLM's ``structured_outputs`` (choice, regex, json, grammar, json_object) and its older
    ``guided_*`` spellings, through the SDK's ``extra_body`` as vLLM's clients send them, and raw on
    /v1/completions, streamed too.  Choices whose literals need escapes come back as written."""
    c = client(server)
    seen = set()
    for seed in range(8):
        for extra in ({"guided_choice": CHOICES}, {"structured_outputs": {"choice": CHOICES}}):
            r = c.chat.completions.create(model="tiny", messages=USER, temperature=2.0, seed=seed, max_tokens=40,
                                          extra_body=extra)
            assert r.choices[0].message.content in CHOICES and r.choices[0].finish_reason == "stop", r
            seen.add(r.choices[0].message.content)
    assert len(seen) >= 2, seen  # the choice is sampled, not a default
    for option in CHOICES:  # each literal, escapes and all, comes back as written
        r = c.chat.completions.create(model="tiny", messages=USER, max_tokens=40,
                                      extra_body={"guided_choice": [option]})
        assert r.choices[0].message.content == option, r
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
              "required": ["ok", "n"], "additionalProperties": False}
    checks = [({"structured_outputs": {"regex": "[0-9]{2}-[a-z]{3}"}}, lambda t: re.fullmatch("[0-9]{2}-[a-z]{3}", t)),
              ({"guided_regex": "(yes|no)!"}, lambda t: re.fullmatch(r"(yes|no)!", t)),
              ({"structured_outputs": {"json": schema}}, lambda t: jsonschema.validate(json.loads(t), schema) or 1),
              ({"structured_outputs": {"json": schema, "disable_any_whitespace": False}},
               lambda t: jsonschema.validate(json.loads(t), schema) or 1),
              ({"guided_json": json.dumps(schema)}, lambda t: jsonschema.validate(json.loads(t), schema) or 1),
              ({"structured_outputs": {"json_object": True}}, lambda t: t.startswith("{")),  # any keys: may be cut
              ({"structured_outputs": {"grammar": 'start: "a " ("cat" | "dog")'}},
               lambda t: re.fullmatch("a (cat|dog)", t)),
              ({"guided_grammar": 'root ::= "the " [0-9]', "guided_decoding_backend": "xgrammar"},
               lambda t: re.fullmatch("the [0-9]", t))]
    for extra, check in checks:
        for stream in (False, True):
            body = {"model": "tiny", "prompt": "the", "max_tokens": 120, "seed": 2, "stream": stream, **extra}
            text = completion_text(server, body)
            assert check(text), (extra, text)


def test_disable_any_whitespace_false_asks_for_the_flexible_json_layout() -> None:
    from specdec_cpu.server.openai_schema import ChatCompletionRequest
    from specdec_cpu.server.structured import output_spec

    def layout(structured_outputs: dict) -> str:
        body = ChatCompletionRequest.model_validate({"messages": USER, "structured_outputs": structured_outputs})
        return output_spec(body, chat=True).grammar.layout

    assert layout({"json": {}, "disable_any_whitespace": False}) == "flexible"
    assert layout({"json_object": True, "disable_any_whitespace": False}) == "flexible"
    assert layout({"json": {}}) == layout({"json": {}, "disable_any_whitespace": True}) == "spaced"


def completion_text(server, body: dict, chat: bool = False) -> str:
    """The output text of a request, streamed or not (raw HTTP)."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    if not body.get("stream"):
        r = server.post(path, body)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        return choice["message"]["content"] if chat else choice["text"]
    parts = []
    with httpx.stream("POST", server.url + path, json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choice = json.loads(line[6:])["choices"][0]
                parts.append((choice["delta"].get("content") or "") if chat else choice["text"])
    return "".join(parts)


# ---------------------------------------------------------------------------
# tools
# ---------------------------------------------------------------------------


def test_tool_choice_required_and_named(server) -> None:
    c = client(server)
    names = set()
    for seed in range(6):
        r = c.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, tool_choice="required",
                                      temperature=1.0, seed=seed, max_tokens=200)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.tool_calls, choice
        for call in choice.message.tool_calls:
            assert call.type == "function" and call.id.startswith("call_")
            valid_call(call.function.name, call.function.arguments)
            names.add(call.function.name)
    assert names <= {"get_weather", "add"}
    r = c.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, temperature=1.0, seed=1, max_tokens=200,
                                  tool_choice={"type": "function", "function": {"name": "add"}},
                                  parallel_tool_calls=False)
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and len(calls) == 1 and calls[0].function.name == "add"
    valid_call("add", calls[0].function.arguments)


def test_streamed_tool_calls_assemble_to_valid_calls(server) -> None:
    c = client(server)
    for seed in range(4):
        stream = c.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, tool_choice="required",
                                           temperature=1.0, seed=seed, max_tokens=200, stream=True)
        calls: dict = {}
        reasons = []
        for chunk in stream:
            assert chunk.id.startswith("chatcmpl-") and chunk.system_fingerprint.startswith("fp_")
            delta = chunk.choices[0].delta
            for d in delta.tool_calls or ():
                slot = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                if d.id:
                    assert slot["id"] is None  # the header comes once
                    slot["id"], slot["name"] = d.id, d.function.name
                slot["arguments"] += d.function.arguments or ""
            reasons.append(chunk.choices[0].finish_reason)
        assert reasons[-1] == "tool_calls" and all(r is None for r in reasons[:-1])
        assert calls and sorted(calls) == list(range(len(calls)))
        for slot in calls.values():
            assert slot["id"].startswith("call_")
            valid_call(slot["name"], slot["arguments"])
    # The SDK's own stream helper assembles the same deltas.
    with c.chat.completions.stream(model="tiny", messages=USER, tools=TOOLS, temperature=1.0, seed=9, max_tokens=200,
                                   tool_choice={"type": "function", "function": {"name": "get_weather"}}) as s:
        final = s.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    valid_call("get_weather", call.function.arguments)


def test_deprecated_functions_answer_in_their_own_shape(server) -> None:
    """``functions`` and ``function_call``: the same constrained calls as tools, answered as
    ``message.function_call`` (one call, no id) and finish_reason "function_call", whole and streamed
    (``delta.function_call``); "none" answers text; a ``function`` message is rendered as the tool result it is."""
    from specdec_cpu.server.openapi import ChatCompletion

    c = client(server)
    for seed in range(3):
        r = c.chat.completions.create(model="tiny", messages=USER, functions=FUNCTIONS, temperature=1.0, seed=seed,
                                      function_call={"name": "add"}, max_tokens=200)
        choice = r.choices[0]
        assert choice.finish_reason == "function_call" and choice.message.tool_calls is None, choice
        assert choice.message.function_call.name == "add"
        valid_call("add", choice.message.function_call.arguments)
        raw = server.post("/v1/chat/completions", {"model": "tiny", "messages": USER, "functions": FUNCTIONS,
                                                   "function_call": {"name": "get_weather"}, "seed": seed,
                                                   "max_tokens": 200}).json()
        assert set(raw["choices"][0]["message"]) == {"role", "content", "function_call"}, raw
        ChatCompletion.model_validate(raw)  # the answer /openapi.json documents
        stream = c.chat.completions.create(model="tiny", messages=USER, functions=FUNCTIONS, temperature=1.0,
                                           seed=seed, function_call={"name": "get_weather"}, max_tokens=200,
                                           stream=True)
        name, arguments, reasons = None, "", []
        for chunk in stream:
            delta = chunk.choices[0].delta
            assert delta.tool_calls is None
            if delta.function_call is not None:
                if delta.function_call.name:
                    assert name is None  # the name comes once, first
                    name = delta.function_call.name
                arguments += delta.function_call.arguments or ""
            reasons.append(chunk.choices[0].finish_reason)
        assert name == "get_weather" and reasons[-1] == "function_call" and all(x is None for x in reasons[:-1])
        valid_call("get_weather", arguments)
    text = c.chat.completions.create(model="tiny", messages=USER, functions=FUNCTIONS, function_call="none",
                                     temperature=1.0, seed=0, max_tokens=20)
    assert text.choices[0].message.function_call is None and text.choices[0].finish_reason == "length"
    # A call and its result in the old shape render as the same exchange in tools' shape, the call's id made up
    # from its message's index.
    arguments = '{"a": 2, "b": 3}'
    old = [*USER, {"role": "assistant", "content": None, "function_call": {"name": "add", "arguments": arguments}},
           {"role": "function", "name": "add", "content": "5"}]
    new = [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_fn1", "type": "function", "function": {"name": "add", "arguments": arguments}}]},
           {"role": "tool", "tool_call_id": "call_fn1", "content": "5"}]
    asks = ((old, {"functions": FUNCTIONS}), (new, {"tools": TOOLS}), (new, {}))
    counts = [c.chat.completions.create(model="tiny", messages=m, max_tokens=1, temperature=0,
                                        **kw).usage.prompt_tokens for m, kw in asks]
    assert counts[0] == counts[1] > counts[2], counts


@pytest.fixture(scope="module")
def tagged_server(tmp_path_factory):
    """The tools model with ``<tool_call>`` and ``</tool_call>`` as tokens of their own (as Qwen2.5's), and a
    draft sharing that vocabulary."""
    from tiny_gguf import write_tiny_model

    from specdec_cpu import BatchedDecoder
    from specdec_cpu.server.openai_app import ServerOptions

    folder = tmp_path_factory.mktemp("tagged")
    target = write_tools_model(folder / "target.gguf", tags=True)
    draft = write_tiny_model(folder / "draft.gguf", n_vocab=384, seed=0, n_layer=2, noise=0.04, noise_seed=7,
                             user_tokens=("<tool_call>", "</tool_call>"))

    def load():
        return BatchedDecoder.from_gguf(target, str(draft), max_sequences=2, n_ctx=4096, n_threads=1, gamma=3)

    with ThreadServer(load, ServerOptions(model_name="tiny")) as s:
        yield s


def test_an_auto_call_is_held_to_the_tools_from_its_opening_tag(tagged_server) -> None:
    """tool_choice "auto": the text is free until the model writes the ``<tool_call>`` token; from there the
    call follows its tool's schema (a grammar triggered by that token).  A bias makes the tiny model open a call
    at once; without tools the same bias gives the tag and then free text, never a call."""
    c = client(tagged_server)
    tag = tagged_server.post("/tokenize", {"content": "<tool_call>", "add_special": False,
                                           "parse_special": True}).json()["tokens"]
    assert len(tag) == 1
    bias = {str(tag[0]): 100}
    drafted = 0
    for seed in range(4):
        r = c.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, temperature=1.0, seed=seed,
                                      max_tokens=300, parallel_tool_calls=False, logit_bias=bias)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1, choice
        call = choice.message.tool_calls[0]
        valid_call(call.function.name, call.function.arguments)
        drafted += r.usage.model_extra["speculation"]["drafted"]
    assert drafted > 0
    with c.chat.completions.stream(model="tiny", messages=USER, tools=TOOLS, temperature=1.0, seed=7, max_tokens=300,
                                   logit_bias=bias, parallel_tool_calls=False) as s:
        final = s.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    valid_call(call.function.name, call.function.arguments)
    free = c.chat.completions.create(model="tiny", messages=USER, temperature=1.0, seed=0, max_tokens=30,
                                     logit_bias=bias)
    assert free.choices[0].message.tool_calls is None and free.choices[0].finish_reason == "length"


def test_tool_choice_none_keeps_the_tools_in_the_prompt_and_bans_the_call(tagged_server) -> None:
    """tool_choice "none" (and function_call "none"): the prompt offers the tools, as OpenAI's does, so it is
    the prompt of the same request with calls allowed; the call's opening tag is banned, even against the
    bias of +100 that makes the tiny model open a call at once (above)."""
    c = client(tagged_server)
    tag = tagged_server.post("/tokenize", {"content": "<tool_call>", "add_special": False,
                                           "parse_special": True}).json()["tokens"]
    bias = {str(tag[0]): 100}
    offered = c.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, max_tokens=1, temperature=0)
    drafted = 0
    for seed in range(3):
        r = c.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, tool_choice="none", temperature=1.0,
                                      seed=seed, max_tokens=40, logit_bias=bias)
        assert r.usage.prompt_tokens == offered.usage.prompt_tokens
        message = r.choices[0].message
        assert message.tool_calls is None and "<tool_call>" not in message.content, message
        drafted += r.usage.model_extra["speculation"]["drafted"]
    assert drafted > 0
    old = c.chat.completions.create(model="tiny", messages=USER, functions=FUNCTIONS, function_call="none",
                                    temperature=1.0, seed=0, max_tokens=40, logit_bias=bias)
    assert old.usage.prompt_tokens == offered.usage.prompt_tokens
    assert old.choices[0].message.function_call is None and "<tool_call>" not in old.choices[0].message.content


def test_tools_and_tool_history_render_through_the_template(server, tools_target) -> None:
    """The prompt the server decodes is the template rendered with the tools
    and with the assistant's calls and the tool results (counted in tokens:
    the server's usage against the same text tokenized)."""
    from specdec_cpu.engine import LlamaTokenizer, LlamaWeights

    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris, and 2+3?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": '{"city": "Paris", "unit": "celsius"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "5"},
    ]
    names = {"call_1": "get_weather", "call_2": "add"}
    expected = [dict(m, name=names[m["tool_call_id"]]) if m["role"] == "tool" else m for m in history]
    weights = LlamaWeights(tools_target)
    try:
        tok = LlamaTokenizer(weights)

        def n_tokens(text: str) -> int:
            return len(tok.tokenize(text, add_special=True, parse_special=True))

        with_tools = render_independently(TOOLS_TEMPLATE, expected, tools=TOOLS)
        without = render_independently(TOOLS_TEMPLATE, expected)
        assert "<tool_call>" in with_tools and '"get_weather"' in with_tools and "<tool_response" in with_tools
        c = client(server)
        r = c.chat.completions.create(model="tiny", messages=history, tools=TOOLS, max_tokens=1, temperature=0)
        assert r.usage.prompt_tokens == n_tokens(with_tools)
        r = c.chat.completions.create(model="tiny", messages=history, tools=TOOLS, tool_choice="none",
                                      max_tokens=1, temperature=0)
        # "none", with the call's tag split in this vocabulary: nothing could stop a call, so the tools are left out
        assert r.usage.prompt_tokens == n_tokens(without)
        assert r.choices[0].message.tool_calls is None
    finally:
        weights.close()


# ---------------------------------------------------------------------------
# LangChain
# ---------------------------------------------------------------------------


def test_langchain_with_structured_output_and_bind_tools(server) -> None:
    lc = pytest.importorskip("langchain_openai")
    from langchain_core.tools import tool

    llm = lc.ChatOpenAI(base_url=server.url + "/v1", api_key="unused", model="tiny", temperature=1.0,
                        max_tokens=400, max_retries=0, seed=2)
    pet = llm.with_structured_output(Pet).invoke("Describe a pet.")
    assert isinstance(pet, Pet)
    # strict: no properties beyond Pet's (a random tiny model would add some and never stop)
    pet = llm.with_structured_output(Pet, method="function_calling", strict=True).invoke("Describe a pet.")
    assert isinstance(pet, Pet)

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @tool
    def shout(text: str) -> str:
        """Upper-case a text."""
        return text.upper()

    msg = llm.bind_tools([add, shout], tool_choice="required", strict=True).invoke("Add 2 and 3.")
    assert msg.tool_calls and msg.response_metadata["finish_reason"] == "tool_calls"
    schemas = {"add": add.tool_call_schema.model_json_schema(), "shout": shout.tool_call_schema.model_json_schema()}
    for call in msg.tool_calls:
        jsonschema.validate(call["args"], schemas[call["name"]])
        assert call["id"].startswith("call_")
    chunks = list(llm.bind_tools([add], tool_choice="add", strict=True).stream("Add 2 and 3."))
    merged = chunks[0]
    for ch in chunks[1:]:
        merged = merged + ch
    assert [c["name"] for c in merged.tool_calls] == ["add"]
    jsonschema.validate(merged.tool_calls[0]["args"], schemas["add"])


# ---------------------------------------------------------------------------
# bad input: a specific 400 each, and the server stays up
# ---------------------------------------------------------------------------


BAD = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
     "response_format.json_schema.schema", "invalid_grammar", "Invalid type: foo"),
    ({"response_format": {"type": "xml"}}, "response_format.type", None, "json_schema"),
    ({"response_format": {"type": "json_object", "json_schema": {"schema": {"type": "object"}}}}, "response_format",
     None, "json_schema is read only with type 'json_schema'"),
    ({"response_format": {"type": "text", "schema": {"type": "object"}}}, "response_format", None,
     "schema is read only beside type 'json_object'"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}, "schema": {"type": "object"}}},
     "response_format", None, "it goes in json_schema.schema"),
    ({"grammar": "root ::= oops"}, "grammar", "invalid_grammar", "oops"),
    ({"json_schema": {"type": "object", "properties": {"a": 3}}}, "json_schema", "invalid_grammar", "object"),
    ({"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "grammar", None, "give one"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name", "invalid_tools", "'nope'"),
    ({"tool_choice": "required"}, "tool_choice", "invalid_tools", "needs tools"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name", None,
     "pattern"),
    ({"tools": [{"type": "function"}]}, "tools[0].function", None, "required"),
    ({"tools": [{"type": "retrieval", "function": {"name": "x"}}]}, "tools[0].type", None, "function"),
    ({"tools": [{"type": "function", "function": {"name": "x", "parameters": {"type": "array"}}}]},
     "tools[0].function.parameters", "invalid_tools", "object"),
    ({"tools": [{"type": "function", "function": {"name": "x", "parameters": {"properties": {"a": 1}}}}]},
     "tools[0].function.parameters", "invalid_tools", "JSON schema"),
    ({"tools": [ADD, ADD]}, "tools[1].function.name", "invalid_tools", "repeats"),
    ({"presence_penalty": 2.5}, "presence_penalty", None, "less than or equal to 2"),
    ({"top_logprobs": 3}, "top_logprobs", None, "needs logprobs"),
    ({"n": 17}, "n", None, "16"),
    ({"logit_bias": {"x5": 10}}, "logit_bias", None, "'x5'"),
    ({"structured_outputs": {"choice": ["a"], "regex": "a"}}, "structured_outputs", None,
     "exactly one of json, regex, choice, grammar, json_object; got regex, choice"),
    ({"structured_outputs": {"json_object": False}}, "structured_outputs", None, "got none"),
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex", "invalid_grammar", "regex"),
    ({"structured_outputs": {"json": {"type": "foo"}}}, "structured_outputs.json", "invalid_grammar", "foo"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json", "invalid_grammar", "not valid JSON"),
    ({"structured_outputs": {"choice": ["a"], "whitespace_pattern": " *"}}, "structured_outputs.whitespace_pattern",
     "unsupported_parameter", "not supported"),
    ({"structured_outputs": {"json": {}, "disable_additional_properties": True}},
     "structured_outputs.disable_additional_properties", "unsupported_parameter", "additionalProperties"),
    ({"structured_outputs": {"choice": ["a"], "options": 1}}, "structured_outputs.options", "unknown_parameter",
     "unknown field"),
    ({"guided_choice": []}, "guided_choice", None, "at least 1"),
    ({"guided_choice": ["a", 3]}, "guided_choice[1]", None, "string"),
    ({"guided_regex": "(unclosed"}, "guided_regex", "invalid_grammar", "regex"),
    ({"guided_grammar": "root ::= oops"}, "guided_grammar", "invalid_grammar", "oops"),
    ({"guided_whitespace_pattern": " *"}, "guided_whitespace_pattern", "unsupported_parameter", "not supported"),
    ({"guided_choice": ["a"], "response_format": {"type": "json_object"}}, "guided_choice", None, "give one"),
    ({"typical_p": 0.5}, "typical_p", "unsupported_parameter", "typical_p=0.5"),
    ({"functions": FUNCTIONS, "tools": TOOLS}, "functions", "invalid_tools", "does not mix with tools"),
    ({"function_call": "auto", "tool_choice": "auto"}, "function_call", "invalid_tools", "does not mix"),
    ({"functions": FUNCTIONS, "parallel_tool_calls": True}, "functions", "invalid_tools", "parallel_tool_calls"),
    ({"functions": FUNCTIONS, "function_call": {"name": "nope"}}, "function_call.name", "invalid_tools",
     "'nope', which is not in functions"),
    ({"function_call": {"name": "add"}}, "function_call.name", "invalid_tools", "offered: none"),
    ({"function_call": "required"}, "function_call", None, "none"),
    ({"functions": [FUNCTIONS[1], FUNCTIONS[1]]}, "functions[1].name", "invalid_tools", "repeats functions[0]"),
    ({"functions": [{"name": "x", "parameters": {"type": "array"}}]}, "functions[0].parameters", "invalid_tools",
     "object"),
    ({"messages": [{"role": "function", "content": "5"}]}, "messages", None, "messages[0].name"),
    ({"messages": [{"role": "assistant", "function_call": {"name": "add", "arguments": "{}"},
                    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "add"}}]}]},
     "messages", None, "give one"),
    ({"temprature": 0.5}, "temprature", "unknown_parameter", "unknown field"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content", None, "only text"),
    ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs", None, "tools"),
]


@pytest.mark.parametrize("extra, param, code, words", BAD, ids=[b[1] + ":" + b[3] for b in BAD])
def test_bad_requests_get_a_specific_400(server, extra, param, code, words) -> None:
    body = {"model": "tiny", "messages": USER, "max_tokens": 4, **extra}
    r = server.post("/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] == param and words in err["message"], err
    if code is not None:
        assert err["code"] == code, err
    # the SDK sees it as a BadRequestError naming the field
    with pytest.raises(openai.BadRequestError) as info:
        client(server).chat.completions.create(model="tiny", messages=USER, max_tokens=4, extra_body=extra)
    assert info.value.param == param
    assert client(server).chat.completions.create(model="tiny", messages=USER, max_tokens=2).choices  # still up
