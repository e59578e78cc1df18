"""chat/template.py and chat/messages.py: rendering a GGUF's own chat
template (the tiny models' ChatML; Qwen2.5-Coder's with tools, marked
``real_model``), its helpers, and its errors."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("jinja2")

from specdec_cpu.chat import ChatTemplate, load_template_source, template_messages  # noqa: E402
from specdec_cpu.errors import (  # noqa: E402
    ChatTemplateError,
    ChatTemplateRefusal,
    InvalidPromptError,
    SpecDecError,
)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "a + b",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}

HISTORY = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris, and 2+3?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
    ]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18°C, sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "5"},
]


# ---------------------------------------------------------------------------
# Qwen2.5-Coder's own template
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen_template():
    gguf = pytest.importorskip("gguf")
    from real_models import default_pair

    _, draft = default_pair()
    field = gguf.GGUFReader(draft).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8"), draft


@pytest.mark.real_model
def test_qwen_template_with_tools_calls_and_results(qwen_template):
    source, path = qwen_template
    template = ChatTemplate(source, name=path)
    text = template.render(HISTORY, tools=[WEATHER, ADD])
    # What the template's text says it writes, piece by piece.
    tools_block = "\n".join(json.dumps(t, ensure_ascii=False) for t in (WEATHER, ADD))
    expected = (
        "<|im_start|>system\nYou are terse.\n\n# Tools\n\nYou may call one or more functions to assist with "
        "the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{tools_block}\n</tools>\n\nFor each function call, return a json object with function name "
        "and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather in Paris, and 2+3?<|im_end|>\n"
        "<|im_start|>assistant"
        '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        '\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n18°C, sunny\n</tool_response>"
        "\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert text == expected


@pytest.mark.real_model
def test_qwen_template_from_the_model(qwen_template):
    from specdec_cpu.engine import LlamaTokenizer, LlamaWeights

    source, path = qwen_template
    with LlamaWeights(path) as weights:
        tok = LlamaTokenizer(weights)
        template = ChatTemplate.for_model(tok)
        assert template.source == source and path in template.name
        assert template.eos_token == "<|im_end|>"
        plain = [{"role": "user", "content": "hi"}]
        assert template.render(plain) == (
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
        # llama.cpp's built-in matcher writes plain ChatML: it drops the
        # default system prompt Qwen's template adds (and knows no tools)
        assert tok.chat_prompt(plain) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


# ---------------------------------------------------------------------------
# the tiny models' ChatML template
# ---------------------------------------------------------------------------


def test_tiny_chatml_template(tiny_target):
    pytest.importorskip("llama_cpp")
    from specdec_cpu.engine import LlamaTokenizer, LlamaWeights

    with LlamaWeights(tiny_target) as weights:
        tok = LlamaTokenizer(weights)
        template = ChatTemplate.for_model(tok)
        assert (template.bos_token, template.eos_token) == ("<|begin_of_text|>", "<|im_end|>")
        messages = [{"role": "developer", "content": "Be brief."},
                    {"role": "user", "content": [{"type": "text", "text": "hello "},
                                                 {"type": "text", "text": "world"}]}]
        text = template.render(messages)
        assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhello world<|im_end|>\n"
                        "<|im_start|>assistant\n")
        assert template.render(messages, add_generation_prompt=False) == text[:-len("<|im_start|>assistant\n")]
        assert text == tok.chat_prompt(template_messages(messages))
        override = ChatTemplate.for_model(tok, "{{ bos_token }}{{ messages[-1].content }}")
        assert override.render(messages) == "<|begin_of_text|>hello world"


def test_no_template_means_none():
    class NoTemplate:
        chat_template = None

    assert ChatTemplate.for_model(NoTemplate()) is None


# ---------------------------------------------------------------------------
# helpers templates expect
# ---------------------------------------------------------------------------


def test_helpers_and_extra_variables():
    source = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}|"
        "{{ tools[0] | tojson }}|{{ {'b': 1, 'a': [1, 2]} | tojson(indent=2) }}|"
        "{{ {'x': 'é<>'} | tojson(separators=(',', ':')) }}|"
        "{% generation %}{{ 'gen' }}{% endgeneration %}|{{ strftime_now('%Y') | length }}|"
        "{{ enable_thinking }}|{{ bos_token }}"
    )
    text = ChatTemplate(source, bos_token="<s>").render(
        [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}],
        tools=[WEATHER], chat_template_kwargs={"enable_thinking": False, "bos_token": "[B]"})
    parts = text.split("|")
    assert parts[0] == "one"
    assert parts[1] == json.dumps(WEATHER)
    assert parts[2] == json.dumps({"b": 1, "a": [1, 2]}, indent=2)
    assert parts[3] == '{"x":"é<>"}'  # not HTML-escaped, not ASCII-escaped
    assert parts[4:] == ["gen", "4", "False", "[B]"]


def test_trim_and_lstrip_blocks():
    source = "A\n  {% if true %}\nB\n  {% endif %}\nC"
    assert ChatTemplate(source).render([{"role": "user", "content": ""}]) == "A\nB\nC"


def test_messages_are_shaped_for_templates():
    out = template_messages(HISTORY)
    assert out[2]["content"] == "" and out[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert out[3]["name"] == "get_weather" and out[4]["name"] == "add"
    assert HISTORY[2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'  # not modified
    not_json = template_messages([{"role": "assistant", "tool_calls": [
        {"id": "c", "function": {"name": "f", "arguments": "not json"}}]}])
    assert not_json[0]["tool_calls"][0]["function"]["arguments"] == "not json"
    assert "tool_calls" not in template_messages([{"role": "assistant", "content": "x", "tool_calls": None}])[0]


def test_function_messages_are_tool_calls_and_results():
    """OpenAI's deprecated shape: an assistant's function_call is a one-call tool_calls with a made-up id, and
    the function message right after it is the tool result answering that id; a function message after any
    other message answers nothing (no id)."""
    out = template_messages([
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": None, "function_call": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
        {"role": "function", "name": "add", "content": "5"},
        {"role": "assistant", "content": "5."},
        {"role": "user", "content": "and the weather?"},
        {"role": "function", "name": "get_weather", "content": "sunny"}])
    call = out[1]["tool_calls"][0]
    assert call == {"id": "call_fn1", "type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
    assert "function_call" not in out[1]
    assert out[2] == {"role": "tool", "name": "add", "content": "5", "tool_call_id": "call_fn1"}
    assert out[5]["role"] == "tool" and "tool_call_id" not in out[5]


@pytest.mark.parametrize("messages, field", [
    ([], "non-empty list"),
    ([{"role": "robot", "content": "x"}], r"messages\[0\].role"),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": 3}], r"messages\[1\].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], r"messages\[0\].content\[0\]"),
    ([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}],
     r"messages\[0\].tool_calls\[0\].function.name"),
    ([{"role": "assistant", "tool_calls": {"function": {}}}], r"messages\[0\].tool_calls must be a list"),
    ([{"role": "function", "content": "5"}], r"messages\[0\].name"),
    ([{"role": "user", "content": "x", "function_call": {"name": "f"}}], r"messages\[0\].function_call: only"),
    ([{"role": "assistant", "function_call": {"arguments": "{}"}}], r"messages\[0\].function_call.name"),
])
def test_bad_messages_name_the_field(messages, field):
    with pytest.raises(InvalidPromptError, match=field):
        ChatTemplate("{{ messages }}").render(messages)


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------


def test_syntax_error_names_template_and_line():
    with pytest.raises(ChatTemplateError, match=r"my.jinja is not valid Jinja \(line 2\)") as info:
        ChatTemplate("ok\n{% if %}", name="my.jinja")
    assert info.value.template == "my.jinja" and isinstance(info.value, SpecDecError)
    assert not isinstance(info.value, ValueError)  # the server's fault, not the client's


def test_raise_exception_is_a_refusal():
    source = "{% if messages[0].role != 'system' %}{{ raise_exception('System message first') }}{% endif %}ok"
    template = ChatTemplate(source, name="strict")
    assert template.render([{"role": "system", "content": "s"}]) == "ok"
    with pytest.raises(ChatTemplateRefusal, match="strict refused the messages: System message first") as info:
        template.render([{"role": "user", "content": "u"}])
    assert isinstance(info.value, ValueError) and info.value.template == "strict"


@pytest.mark.parametrize("source, why", [
    ("{{ messages[0].content + 1 }}", "TypeError"),
    ("{{ nothing.here }}", "UndefinedError"),
    ("{{ messages.append(1) }}", "SecurityError"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "UndefinedError|SecurityError"),
    ("{{ 1 / 0 }}", "ZeroDivisionError"),
    ("{{ 10.0 ** 400 }}", "OverflowError"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
])
def test_render_failures_name_the_template(source, why):
    with pytest.raises(ChatTemplateError, match=f"t.jinja failed: ({why})") as info:
        ChatTemplate(source, name="t.jinja").render([{"role": "user", "content": "x"}])
    assert not isinstance(info.value, ChatTemplateRefusal)


def test_template_override_sources(tmp_path):
    path = tmp_path / "chat.jinja"
    path.write_text("{{ messages[0].content }}!", encoding="utf-8")
    assert load_template_source(str(path)) == ("{{ messages[0].content }}!", str(path))
    assert load_template_source("{{ x }}") == ("{{ x }}", "inline chat template")
    with pytest.raises(ChatTemplateError, match="cannot read chat template file .*missing.jinja"):
        load_template_source(str(tmp_path / "missing.jinja"))
    with pytest.raises(ChatTemplateError, match="file path or template text"):
        load_template_source("  ")
