"""chat/tools.py, tool_stream.py, tool_specs.py and tool_grammar.py:
tool calls parsed whole and streamed, tools checked, and the tool-call
grammar walked at random (tiny BPE vocabulary; Qwen's, ``real_model``)."""

from __future__ import annotations

import itertools
import json
import pickle
import random

import pytest

from specdec_cpu.chat import (
    ToolCallStreamParser,
    ToolChoice,
    parse_tool_calls,
    resolve_tool_choice,
    tool_call_grammar,
    validate_tools,
)
from specdec_cpu.errors import InvalidToolsError

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99}, "b": {"type": "number"}},
    "required": ["a", "b"], "additionalProperties": False}}}
PING = {"type": "function", "function": {"name": "ping", "description": "no parameters"}}
TAGS = {"type": "function", "function": {"name": "tag-items", "parameters": {  # pydantic-style $defs
    "type": "object", "$defs": {"Tag": {"type": "string", "enum": ["red", "blue"]}},
    "properties": {"tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}, "maxItems": 3}},
    "required": ["tags"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD, PING, TAGS]
NAMES = ["get_weather", "add", "ping", "tag-items"]


def ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def calls(parsed):
    return [(c.name, c.arguments) for c in parsed.tool_calls]


# ---------------------------------------------------------------------------
# parsing a whole output
# ---------------------------------------------------------------------------


HERMES_TWO = ('I will look both up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
              '</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3.5}}\n</tool_call>')


def test_hermes_calls():
    parsed = parse_tool_calls(HERMES_TWO, tool_names=NAMES, id_factory=ids())
    assert parsed.content == "I will look both up."
    assert calls(parsed) == [("get_weather", '{"city": "Paris"}'), ("add", '{"a": 2, "b": 3.5}')]
    assert parsed.tool_calls[1].to_openai() == {
        "id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3.5}'}}
    one = parse_tool_calls('<tool_call>{"name":"ping","arguments":{}}</tool_call>')
    assert one.content is None and calls(one) == [("ping", "{}")]
    assert one.tool_calls[0].id.startswith("call_") and len(one.tool_calls[0].id) == 29


KEPT = object()  # the content is the whole text


@pytest.mark.parametrize("text, content, expected", [
    # malformed JSON stays as content, the good block is a call
    ('<tool_call>\n{"name": "add", "arguments": {"a": 1,}}\n</tool_call>\n<tool_call>{"name": "ping"}</tool_call>',
     '<tool_call>\n{"name": "add", "arguments": {"a": 1,}}\n</tool_call>', [("ping", "{}")]),
    # cut off before its close
    ('Sure. <tool_call>\n{"name": "add", "arguments": {"a": 1', KEPT, []),
    # a function not offered
    ('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', KEPT, []),
    # no name, or arguments that are not an object
    ('<tool_call>{"arguments": {}}</tool_call>', KEPT, []),
    ('<tool_call>{"name": "add", "arguments": [1]}</tool_call>', KEPT, []),
    # trailing garbage inside the block
    ('<tool_call>{"name": "ping", "arguments": {}} x</tool_call>', KEPT, []),
    # "parameters" for "arguments", arguments as JSON text
    ('<tool_call>{"name": "add", "parameters": {"a": 1, "b": 2}}</tool_call>', None, [("add", '{"a": 1, "b": 2}')]),
    ('<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>', None,
     [("add", '{"a": 1, "b": 2}')]),
])
def test_malformed_blocks_stay_content(text, content, expected):
    parsed = parse_tool_calls(text, tool_names=NAMES)
    assert parsed.content == (text if content is KEPT else content) and calls(parsed) == expected


@pytest.mark.parametrize("text, expected", [
    ('{"name": "add", "arguments": {"a": 1, "b": 2}}', [("add", '{"a": 1, "b": 2}')]),
    (' [{"name": "ping", "arguments": {}}, {"name": "get_weather", "parameters": {"city": "Oslo"}}] ',
     [("ping", "{}"), ("get_weather", '{"city": "Oslo"}')]),
    ('{"name": "Ada", "age": 36}', []),  # a JSON answer, not a call
    ('{"name": "add", "arguments": {"a": 1}} and more', []),
    ('[{"name": "add", "arguments": {}}, 3]', []),
    ("[]", []),
    # fenced as small Qwen2.5 models write their calls
    ('```json\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n```', [("add", '{"a": 1, "b": 2}')]),
    ('\n```json\n[{"name": "ping", "arguments": {}}]\n```\n', [("ping", "{}")]),
    ('```json\n{"name": "Ada", "age": 36}\n```', []),  # fenced JSON data, not a call
    ('```python\n{"name": "add", "arguments": {}}\n```', []),  # not a JSON fence
    ('Here:\n```json\n{"name": "add", "arguments": {}}\n```', []),  # not the whole output
])
def test_generic_json_fallback(text, expected):
    parsed = parse_tool_calls(text, tool_names=NAMES)
    assert calls(parsed) == expected
    assert parsed.content == (None if expected else text.strip())
    assert calls(parse_tool_calls(text, tool_names=NAMES, json_fallback=False)) == []


# ---------------------------------------------------------------------------
# streaming
# ---------------------------------------------------------------------------


def stream(text, seed, **kwargs):
    """Feed ``text`` in random pieces; return all deltas."""
    parser = ToolCallStreamParser(id_factory=ids(), **kwargs)
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(text):
        n = rng.choice([1, 1, 2, 3, 5, 8, 13])
        out += parser.feed(text[i:i + n])
        i += n
    return out + parser.finish()


def reassemble(deltas):
    """Content and calls from deltas, checking their order as a client would."""
    content, found = "", []
    for d in deltas:
        assert set(d) in ({"content"}, {"tool_calls"})
        if "content" in d:
            content += d["content"]
            continue
        (call,) = d["tool_calls"]
        if "id" in call:  # a header: a new call, arguments empty
            assert call["index"] == len(found) and call["type"] == "function"
            assert call["function"]["arguments"] == ""
            found.append([call["id"], call["function"]["name"], ""])
        else:
            assert call["index"] == len(found) - 1 and set(call["function"]) == {"arguments"}
            found[-1][2] += call["function"]["arguments"]
    return content or None, [(name, args) for _, name, args in found]


STREAMED = [
    HERMES_TWO,
    "  Plain text, no tools at all.\n\n",
    "Text with a < sign and <tool_ but no call",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris}", "unit": "celsius"}}\n</tool_call>',
    '<tool_call>{"arguments": {"a": 1, "b": 2}, "name": "add"}</tool_call> then text',
    '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>\n<tool_call>{"name": "ping"}</tool_call>',
    '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>',
    '<tool_call>{"nam": "add"}</tool_call> after <tool_call> cut',
    '{"name": "add", "arguments": {"a": 1, "b": 2}}',
    '[{"name": "ping", "arguments": {}}]',
    '{"name": "Ada", "age": 36}',
    '```json\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n```',
    '```json\n{"name": "Ada"}\n```',
    '```js\nlet x = 1;\n```',
    '``',
    '```json\n{"port": 8080}\n```\nThat is the config.',  # JSON data, then text
    '```json\n{"name": "add", "arguments": {}}\n```\nand then text',  # a call, then text: no call
    '```json\n{"name": "add", "arguments": {"a": 1}}\n```  \n',
    '```json\n{"name": "add", "arguments": {}}\n```x',
    '```jsonc\n{"a": 1}\n```',
    '{"name": "Ada"} then <tool_call>{"name": "ping", "arguments": {}}</tool_call>',
    '[1, 2, 3] are numbers',
    '[{"name": "ping", "arguments": {}}]  ',
    'A\n<tool_call>{"name": "tag-items", "arguments": {"tags": ["red"]}}</tool_call>\n  B  \n'
    '<tool_call>{"name": "ping", "arguments": {}}</tool_call>\n',
]


@pytest.mark.parametrize("text", STREAMED)
def test_streamed_deltas_reassemble_to_the_same_calls(text):
    whole = parse_tool_calls(text, tool_names=NAMES)
    for seed in range(12):
        assert reassemble(stream(text, seed, tool_names=NAMES)) == (whole.content, calls(whole))


def test_arguments_stream_before_the_call_closes():
    parser = ToolCallStreamParser(tool_names=NAMES, id_factory=ids())
    assert parser.feed("Let me see.\n<tool_call>\n{") == [{"content": "Let me see."}]
    head = parser.feed('"name": "get_weather", "arguments": {"ci')
    assert head == [
        {"tool_calls": [{"index": 0, "id": "call_0", "type": "function",
                         "function": {"name": "get_weather", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"ci'}}]},
    ]
    rest = parser.feed('ty": "Oslo"}}\n</tool')
    assert rest == [{"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}]}]
    assert parser.feed("_call>") == [] and parser.finish() == []
    assert parser.n_calls == 1


def test_json_that_is_not_calls_streams_once_its_first_value_is_whole():
    """An output that starts as JSON is held (it may be a call written as bare or fenced JSON) only until
    its first value shows it is not one: the rest streams as content, not all at the end."""
    parser = ToolCallStreamParser(tool_names=NAMES, id_factory=ids())
    assert parser.feed('```json\n{"port": 80') == []
    assert parser.feed('80}\n') == [{"content": '```json\n{"port": 8080}'}]  # whole, and not a call
    assert parser.feed("```\nThe server") == [{"content": "\n```\nThe server"}]
    parser = ToolCallStreamParser(tool_names=NAMES, id_factory=ids())
    assert parser.feed('{"name": "Ada", "age": 36}') == [{"content": '{"name": "Ada", "age": 36}'}]  # no tool
    parser = ToolCallStreamParser(tool_names=NAMES, id_factory=ids())
    fenced_call = '```json\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n``'
    assert parser.feed(fenced_call) == [] and parser.feed("`\n") == []  # held: a fenced call so far
    assert parser.feed("Done.") == [{"content": fenced_call + "`\nDone."}]  # text after it: not a call
    parser = ToolCallStreamParser(tool_names=NAMES, id_factory=ids())
    assert parser.feed(fenced_call + "`\n") == []
    assert parser.finish()[0]["tool_calls"][0]["function"]["name"] == "add"


def test_json_nested_past_the_parsers_depth_is_content_not_an_error():
    for text in ("[" * 3000, '{"a": ' * 3000, "```json\n" + "[" * 3000):
        assert parse_tool_calls(text, tool_names=NAMES).content == text.strip()
        assert reassemble(stream(text, 0, tool_names=NAMES)) == (text.strip(), [])


def test_a_call_cut_off_after_its_header_keeps_what_was_sent():
    text = '<tool_call>{"name": "add", "arguments": {"a": 1'
    assert reassemble(stream(text, 0, tool_names=NAMES)) == (None, [("add", '{"a": 1')])
    assert parse_tool_calls(text, tool_names=NAMES).tool_calls == []  # whole: not a call
    # cut off after the name: a call with no arguments yet; before the name was whole: nothing, not markup
    for cut, expected in (('Sure. <tool_call>\n{"name": "add", "argu', ("Sure.", [("add", "")])),
                          ('<tool_call>\n{"name": "add"', (None, [("add", "")])),
                          ('Sure. <tool_call>\n{"name": "ad', ("Sure.", [])),
                          ('<tool_call>\n{"name": "rm_rf", "arg', ('<tool_call>\n{"name": "rm_rf", "arg', []))):
        for split in range(4):
            assert reassemble(stream(cut, split, tool_names=NAMES)) == expected, (cut, split)
    parser = ToolCallStreamParser()
    parser.finish()
    with pytest.raises(RuntimeError):
        parser.feed("x")


@pytest.mark.parametrize("text", STREAMED + [
    '<tool_call>{"name": "add", "arguments": {"a": 1',  # cut off after the header
    HERMES_TWO[:-20],  # the second call cut off: a streamed answer has sent two
    'Sure.\n<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>\n<',  # cut off at the next tag
    'Sure. <tool_call>\n{"name": "add", "argu',  # cut off after the name
    '<tool_call>\n{"name": "ge',  # cut off inside the name
])
def test_the_whole_answer_agrees_with_the_streamed_one(text):
    """The server's non-streamed message holds what its stream would have sent,
    cut-off calls included (their markup is not content)."""
    from specdec_cpu.chat import FunctionSpec, ToolChoice
    from specdec_cpu.server.responses import message_of
    from specdec_cpu.server.structured import OutputSpec

    spec = OutputSpec(functions=[FunctionSpec(n, None, {}) for n in NAMES], choice=ToolChoice("auto"))
    message = message_of(text, spec)
    content, found = reassemble(stream(text, 3, tool_names=NAMES))
    if not found:
        assert message == {"role": "assistant", "content": content or ""}
        return
    assert message["content"] == content
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == found
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in message["tool_calls"])
    if text == HERMES_TWO[:-20]:
        assert content == "I will look both up." and [name for name, _ in found] == ["get_weather", "add"]


# ---------------------------------------------------------------------------
# tools and tool_choice
# ---------------------------------------------------------------------------


def test_valid_tools():
    fns = validate_tools(TOOLS)
    assert [f.name for f in fns] == NAMES
    assert fns[2].parameters == {"type": "object", "properties": {}, "additionalProperties": False}
    assert validate_tools(None) == [] and validate_tools([]) == []


def _with(i, **change):
    tools = json.loads(json.dumps(TOOLS))
    tools[i]["function"].update(change)
    return tools


@pytest.mark.parametrize("tools, param, message", [
    ({"type": "function"}, "tools", "must be a list"),
    ([WEATHER, "add"], "tools[1]", "must be an object"),
    ([WEATHER, {"type": "retrieval"}], "tools[1].type", "must be 'function'"),
    ([{"type": "function"}], "tools[0].function", "must be an object"),
    (_with(1, name="add two"), "tools[1].function.name", "letters, digits"),
    (_with(1, name="x" * 65), "tools[1].function.name", "1-64"),
    (_with(2, name="add"), "tools[2].function.name", "repeats tools\\[1\\]"),
    (_with(0, description=3), "tools[0].function.description", "string"),
    (_with(1, parameters=[1]), "tools[1].function.parameters", "JSON schema object"),
    (_with(1, parameters={"type": "array"}), "tools[1].function.parameters", "type 'object'"),
    (_with(3, parameters={"type": "object", "properties": {"x": {"type": "strin"}}}),
     "tools[3].function.parameters", "strin"),
])
def test_bad_tools_name_the_field(tools, param, message):
    with pytest.raises(InvalidToolsError, match=message) as info:
        validate_tools(tools)
    assert info.value.param == param and param in str(info.value)
    assert isinstance(info.value, ValueError)
    back = pickle.loads(pickle.dumps(info.value))  # crosses process pools with its param
    assert (str(back), back.param) == (str(info.value), param)


def test_tool_choice():
    fns = validate_tools(TOOLS)
    assert resolve_tool_choice(None, fns) == ToolChoice("auto")
    assert resolve_tool_choice(None, []) == ToolChoice("none")
    assert resolve_tool_choice("required", fns).forces_call
    assert resolve_tool_choice({"type": "function", "function": {"name": "add"}}, fns) == ToolChoice("function", "add")
    with pytest.raises(InvalidToolsError, match="'sub', which is not in tools .*get_weather, add") as info:
        resolve_tool_choice({"type": "function", "function": {"name": "sub"}}, fns)
    assert info.value.param == "tool_choice.function.name"
    for bad in ("always", {"type": "function"}, {"type": "x"}):
        with pytest.raises(InvalidToolsError) as info:
            resolve_tool_choice(bad, fns)
        assert info.value.param.startswith("tool_choice")
    with pytest.raises(InvalidToolsError, match="needs tools"):
        resolve_tool_choice("required", [])
    assert tool_call_grammar(fns, ToolChoice("auto")) is None and tool_call_grammar(fns, ToolChoice("none")) is None


# ---------------------------------------------------------------------------
# the tool-call grammar, walked at random
# ---------------------------------------------------------------------------


def _walk_calls(vocab_weights, choice, parallel, seeds, max_steps=800):
    jsonschema = pytest.importorskip("jsonschema")
    from constraint_helpers import random_walk

    from specdec_cpu.constraints import compile_grammar
    from specdec_cpu.engine import LlamaTokenizer, llg_tokenizer

    fns = validate_tools(TOOLS)
    params = {f.name: f.parameters for f in fns}
    tok = LlamaTokenizer(vocab_weights)
    grammar = tool_call_grammar(fns, choice, parallel_tool_calls=parallel)
    compiled = compile_grammar(grammar, llg_tokenizer(vocab_weights))
    seen = set()
    for seed in seeds:
        state = compiled.new_state()
        tokens = random_walk(state, random.Random(seed), max_steps)
        assert state.ended, f"seed {seed}: no end in {max_steps} tokens"
        text = tok.detokenize([t for t in tokens if t not in state.eos_ids], errors="strict")
        parsed = parse_tool_calls(text, tool_names=NAMES)
        assert parsed.content is None and parsed.tool_calls, text
        assert parallel or len(parsed.tool_calls) == 1
        for call in parsed.tool_calls:
            assert choice.mode == "required" or call.name == choice.name
            jsonschema.validate(json.loads(call.arguments), params[call.name])
            seen.add(call.name)
        assert reassemble(stream(text, seed, tool_names=NAMES)) == (None, calls(parsed))
    return seen, compiled


@pytest.fixture(scope="module")
def tiny_weights(tiny_target):
    pytest.importorskip("llguidance")
    from specdec_cpu.engine import LlamaWeights

    with LlamaWeights(tiny_target) as w:
        yield w


def test_random_paths_of_the_tool_grammar_are_valid_calls(tiny_weights):
    seen, _ = _walk_calls(tiny_weights, ToolChoice("required"), True, range(40))
    assert seen == set(NAMES)
    seen, _ = _walk_calls(tiny_weights, ToolChoice("function", "add"), False, range(10))
    assert seen == {"add"}


def test_tool_grammar_forces_tags_keys_and_a_named_function(tiny_weights):
    from specdec_cpu.constraints import compile_grammar
    from specdec_cpu.engine import LlamaTokenizer, llg_tokenizer

    tok, llg = LlamaTokenizer(tiny_weights), llg_tokenizer(tiny_weights)
    fns = validate_tools(TOOLS)
    state = compile_grammar(tool_call_grammar(fns, ToolChoice("required")), llg).new_state()
    assert tok.detokenize(state.forced_tokens()) == '<tool_call>\n{"name": "'
    state = compile_grammar(tool_call_grammar(fns, ToolChoice("function", "get_weather")), llg).new_state()
    assert tok.detokenize(state.forced_tokens()) == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "'
    assert not state.accepting


@pytest.mark.real_model
def test_random_paths_of_the_tool_grammar_qwen():
    from real_models import default_pair

    from specdec_cpu.engine import LlamaWeights

    with LlamaWeights(default_pair()[1]) as weights:
        seen, compiled = _walk_calls(weights, ToolChoice("required"), True, range(12))
        assert len(seen) >= 3
        # the tag is Qwen's own <tool_call> token, forced
        assert compiled.new_state().forced_tokens(1) == [151657]
