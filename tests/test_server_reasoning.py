"""A reasoning model's thinking answered apart, through the server: chat's
``message.reasoning_content`` and ``delta.reasoning_content``, the Responses
API's reasoning item and its ``response.reasoning_text`` events, and the
thinking sent back in the history.  A tiny model with ``<think>`` and
``</think>`` tokens of their own, served under two templates: one that opens
the block in the prompt (as DeepSeek-R1's), one that leaves it to the model
(as Qwen3's).  Each split is checked against the raw output, read from the
tokens' own bytes in the log-probabilities (γ = 3: drafting runs)."""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
from server_thread import ThreadServer  # noqa: E402

TAGS = ("<think>", "</think>", "<tool_call>", "</tool_call>")
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a"],
    "additionalProperties": False}}}


def template(opened: bool) -> str:
    return ("{% for m in messages %}<|im_start|>{{ m.role }}\n"
            "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
            "{{ m.content or '' }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n" + ("<think>\n" if opened else "") + "{% endif %}")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tiny_gguf import write_tiny_model

    folder = tmp_path_factory.mktemp("reasoning")
    target = write_tiny_model(folder / "target.gguf", n_vocab=384, seed=0, n_layer=2, user_tokens=TAGS)
    draft = write_tiny_model(folder / "draft.gguf", n_vocab=384, seed=0, n_layer=2, noise=0.04, noise_seed=7,
                             user_tokens=TAGS)
    return str(target), str(draft)


def serve(models, opened: bool) -> ThreadServer:
    from specdec_cpu import BatchedDecoder
    from specdec_cpu.server.openai_app import ServerOptions

    def load():
        return BatchedDecoder.from_gguf(models[0], models[1], max_sequences=2, n_ctx=2048, n_threads=1, gamma=3,
                                        chat_template=template(opened))

    return ThreadServer(load, ServerOptions(model_name="tiny"))


@pytest.fixture(scope="module")
def opened(models):
    with serve(models, True) as s:
        yield s


@pytest.fixture(scope="module")
def left_to_model(models):
    with serve(models, False) as s:
        yield s


def client(server) -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def token(server, text: str) -> int:
    (tok,) = server.post("/tokenize", {"content": text, "add_special": False, "parse_special": True}).json()["tokens"]
    return tok


def close_bias(server) -> dict:
    return {str(token(server, "</think>")): 5}  # the tiny model closes its block about every other answer


def thought(entries, inside: bool = True) -> int:
    """How many of the output's tokens are its thinking, from the tokens' own bytes."""
    text = b""
    for i, e in enumerate(entries):
        text += bytes(e.bytes if hasattr(e, "bytes") else e["bytes"])
        if b"</think>" in text:
            return i + 1
    return len(entries)


def raw(entries) -> str:
    return bytes(b for e in entries for b in e.bytes).decode("utf-8", errors="replace")


def expected(text: str) -> "tuple[str, str]":
    """The thinking and the answer of an output that starts inside the block."""
    at = text.find("</think>")
    return (text.strip(), "") if at < 0 else (text[:at].strip(), text[at + len("</think>"):].lstrip())


def test_the_opened_block_is_answered_apart_whole_and_streamed(opened) -> None:
    c = client(opened)
    bias, closed, drafted = close_bias(opened), 0, 0
    body = dict(model="tiny", messages=[{"role": "user", "content": "think first"}], temperature=1.0,
                max_tokens=30, logit_bias=bias, logprobs=True, extra_body={"ignore_eos": True})
    for seed in range(4):
        r = c.chat.completions.create(seed=seed, **body)
        message = r.choices[0].message
        text = raw(r.choices[0].logprobs.content)
        thinking, answer = expected(text)
        closed += "</think>" in text
        assert (message.model_extra.get("reasoning_content") or "", message.content) == (thinking, answer), text
        assert r.usage.completion_tokens_details.reasoning_tokens == thought(r.choices[0].logprobs.content)
        drafted += r.usage.model_extra["speculation"]["drafted"]
        chunks = list(c.chat.completions.create(seed=seed + 10, stream=True, **body))
        deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
        text = raw(e for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content)
        streamed = ("".join(d.model_extra.get("reasoning_content") or "" for d in deltas),
                    "".join(d.content or "" for d in deltas))
        assert streamed == expected(text), text
    assert closed > 0 and drafted > 0
    none = c.chat.completions.create(seed=0, **{**body, "extra_body": {"ignore_eos": True, "reasoning_format": "none"}})
    assert none.choices[0].message.content == raw(none.choices[0].logprobs.content)
    assert "reasoning_content" not in none.choices[0].message.model_extra


def test_a_call_opened_while_thinking_ends_the_thinking(opened) -> None:
    """The engine holds a call to its tool's schema from its opening tag on, inside the thinking too: the
    call is answered as a call, the text before it as the thinking."""
    c = client(opened)
    body = dict(model="tiny", messages=[{"role": "user", "content": "add"}], tools=[ADD], temperature=1.0,
                max_tokens=200, parallel_tool_calls=False, logit_bias={str(token(opened, "<tool_call>")): 8})
    for seed in range(3):
        r = c.chat.completions.create(seed=seed, logprobs=True, **body)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name == "add", choice
        assert "<tool_call>" not in (choice.message.model_extra.get("reasoning_content") or "")
        opening = [bytes(e.bytes) for e in choice.logprobs.content].index(b"<tool_call>")
        assert r.usage.completion_tokens_details.reasoning_tokens == opening  # the thinking: the tokens before it
        with c.chat.completions.stream(seed=seed, **body) as stream:
            final = stream.get_final_completion().choices[0].message
        assert "<tool_call>" not in (final.content or "") + (final.model_extra.get("reasoning_content") or "")
        for call in final.tool_calls or ():
            assert json.loads(call.function.arguments).keys() == {"a"}


def test_a_model_without_the_tags_is_answered_as_it_wrote(tiny_target, tiny_draft) -> None:
    """A model whose vocabulary lacks the tags is no reasoning model: a <think> it writes as text stays."""
    from specdec_cpu import BatchedDecoder
    from specdec_cpu.server.openai_app import ServerOptions

    def load():
        return BatchedDecoder.from_gguf(tiny_target, tiny_draft, max_sequences=1, n_ctx=1024, n_threads=1, gamma=3)

    with ThreadServer(load, ServerOptions(model_name="tiny")) as plain:
        r = client(plain).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=60, temperature=1.0, seed=0,
            extra_body={"grammar": 'root ::= "<think>" [a-z]{1,8} "</think>" " " [a-z]{1,8}'})
        message = r.choices[0].message
        assert message.content.startswith("<think>") and "</think>" in message.content
        assert "reasoning_content" not in message.model_extra and r.usage.completion_tokens_details is None


def test_a_grammar_over_the_whole_output_leaves_no_thinking(opened) -> None:
    """The template opened the block, but a JSON object is the whole output: it is the content."""
    r = client(opened).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "json"}],
                                               response_format={"type": "json_object"}, temperature=1.0, seed=1,
                                               max_tokens=300)
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    assert "reasoning_content" not in r.choices[0].message.model_extra


def test_a_block_the_model_opens_is_answered_apart(left_to_model) -> None:
    """Under a template that leaves the block to the model, one at the output's start is thinking (a grammar
    makes the tiny model write one); reasoning_format "none" leaves it in the content."""
    c = client(left_to_model)
    grammar = 'root ::= "<think>" [a-z]{1,12} "</think>" " " [a-z ]{1,12}'
    body = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], temperature=1.0, max_tokens=60,
                logprobs=True)
    for seed in range(3):
        r = c.chat.completions.create(seed=seed, extra_body={"grammar": grammar}, **body)
        text = raw(r.choices[0].logprobs.content)
        thinking, answer = expected(text[len("<think>"):])
        message = r.choices[0].message
        assert (message.model_extra["reasoning_content"], message.content) == (thinking, answer), text
        kept = c.chat.completions.create(seed=seed, extra_body={"grammar": grammar, "reasoning_format": "none"},
                                         **body).choices[0]
        assert kept.message.content == raw(kept.logprobs.content) and kept.message.content.startswith("<think>")
    plain = c.chat.completions.create(seed=0, **body).choices[0]
    assert plain.message.content == raw(plain.logprobs.content)  # no block: the answer as it came
    assert "reasoning_content" not in plain.message.model_extra


def test_the_responses_api_answers_a_reasoning_item(opened) -> None:
    """The thinking is a reasoning item before the message, streamed as reasoning_text events; sent back (or
    continued by id), it is the assistant turn's reasoning_content in the history."""
    c = client(opened)
    bias = close_bias(opened)
    body = dict(model="tiny", input="think first", temperature=1.0, max_output_tokens=30,
                extra_body={"ignore_eos": True, "logit_bias": bias})
    seeds = iter(range(40))

    def seed() -> int:
        given = next(seeds, None)
        if given is None:
            pytest.fail("the seeds ran out: too few answers both thought and answered")
        return given

    while True:  # an answer that thought, then said something (about every other one)
        r = c.responses.create(**{**body, "extra_body": {**body["extra_body"], "seed": seed()}})
        if [o.type for o in r.output] == ["reasoning", "message"]:
            break
    thinking = r.output[0].content[0].text
    assert thinking and r.output[0].id.startswith("rs_") and r.output[0].summary == []
    while True:
        with c.responses.stream(**{**body, "extra_body": {**body["extra_body"], "seed": seed()}}) as stream:
            events = list(stream)
        final = events[-1].response
        if [o.type for o in final.output] == ["reasoning", "message"]:
            break
    kinds = [e.type for e in events]
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    # the text's log-probabilities are its own tokens', not the thinking's, whole and streamed (where one
    # step's tokens may close the thinking and start the text); the thinking counts as reasoning tokens
    with_logprobs = {**body, "include": ["message.output_text.logprobs"], "max_output_tokens": 60}
    for streamed in (False, True) * 3:
        extra = {**body["extra_body"], "seed": seed()}
        if streamed:
            with c.responses.stream(**{**with_logprobs, "extra_body": extra}) as stream:
                lp = list(stream)[-1].response
        else:
            lp = c.responses.create(**{**with_logprobs, "extra_body": extra})
        message = [o for o in lp.output if o.type == "message"]
        entries = message[0].content[0].logprobs if message else []
        assert raw(entries).lstrip() == lp.output_text, (streamed, lp.output)
        assert lp.usage.output_tokens_details.reasoning_tokens == lp.usage.output_tokens - len(entries)
    closed_at_once = c.responses.create(**{**with_logprobs, "extra_body": {
        **body["extra_body"], "seed": 0, "logit_bias": {str(token(opened, "</think>")): 30}}})
    assert [o.type for o in closed_at_once.output] == ["message"]  # an empty block: no reasoning item
    assert closed_at_once.usage.output_tokens_details.reasoning_tokens == 1
    assert raw(closed_at_once.output[0].content[0].logprobs).lstrip() == closed_at_once.output_text
    kept = c.responses.create(**{**body, "extra_body": {**body["extra_body"], "reasoning_format": "none"}})
    assert [o.type for o in kept.output] == ["message"] and kept.usage.output_tokens_details.reasoning_tokens == 0
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == final.output[0].content[0].text and final.output[0].status == "completed"
    history = [{"role": "user", "content": "think first"},
               {"role": "assistant", "content": r.output_text, "reasoning_content": thinking},
               {"role": "user", "content": "and now"}]
    chat = opened.post("/v1/chat/completions", {"model": "tiny", "messages": history, "max_tokens": 1}).json()
    sent_back = c.responses.create(model="tiny", input=[history[0], *r.output, history[2]], max_output_tokens=1)
    continued = c.responses.create(model="tiny", previous_response_id=r.id, input="and now", max_output_tokens=1)
    assert sent_back.usage.input_tokens == continued.usage.input_tokens == chat["usage"]["prompt_tokens"]
