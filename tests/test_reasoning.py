"""A reasoning model's ``<think>`` block told apart from its answer
(chat/reasoning.py), and the server's stream shaping built on it: the same
split for any cut of the output into pieces, tool calls after the thinking
parsed as before, and an answer without a block left as it was."""

from __future__ import annotations

import random

import pytest

from specdec_cpu.chat import ReasoningSplitter, opens_thinking

CASES = [
    ("<think>\nI think so.\n</think>\n\nYes.", False, "I think so.", "Yes."),
    ("  <think>a b  c</think>x <think>y", False, "a b  c", "x <think>y"),  # only a block at the start counts
    ("Hello <think>", False, "", "Hello <think>"),
    ("<thin", False, "", "<thin"),  # cut before the tag was whole: text
    ("I ponder\n\n and more</think>\nAnswer", True, "I ponder\n\n and more", "Answer"),
    ("cut off mid thought  ", True, "cut off mid thought", ""),
    ("<think></think>Answer", False, "", "Answer"),
    ("", False, "", ""),
    ("  \n", False, "", "  \n"),
    ("plain answer, no block", False, "", "plain answer, no block"),
]


def split(text: str, inside: bool, rng: random.Random) -> "tuple[str, str]":
    cuts = sorted(rng.sample(range(len(text) + 1), rng.randint(0, min(6, len(text) + 1))))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    splitter = ReasoningSplitter(inside=inside)
    deltas = [d for p in pieces for d in splitter.feed(p)] + splitter.finish()
    assert all(set(d) in ({"text"}, {"reasoning_content"}) and next(iter(d.values())) for d in deltas)
    return ("".join(d.get("reasoning_content", "") for d in deltas), "".join(d.get("text", "") for d in deltas))


@pytest.mark.parametrize("text, inside, reasoning, answer", CASES)
def test_any_cut_splits_the_same(text: str, inside: bool, reasoning: str, answer: str) -> None:
    rng = random.Random(text)
    for _ in range(300):
        assert split(text, inside, rng) == (reasoning, answer)


def test_a_prompt_opens_the_block_when_it_ends_with_the_tag() -> None:
    assert opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not opens_thinking("<|im_start|>assistant\n")
    assert not opens_thinking("<think>\nold</think>\n<|im_start|>assistant\n")


def test_the_stream_shaper_reads_calls_after_the_thinking() -> None:
    pytest.importorskip("fastapi")
    from specdec_cpu.chat import resolve_tool_choice, validate_tools
    from specdec_cpu.server.responses import StreamShaper, message_of
    from specdec_cpu.server.structured import OutputSpec

    tools = validate_tools([{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}])
    spec = OutputSpec(functions=tools, choice=resolve_tool_choice("auto", tools), reasoning="inside")
    text = 'I should add.</think>\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    rng = random.Random(0)
    for _ in range(200):
        cuts = sorted(rng.sample(range(len(text) + 1), rng.randint(0, 6)))
        shaper = StreamShaper(spec)
        deltas = [d for a, b in zip([0, *cuts], [*cuts, len(text)]) for d in shaper.feed(text[a:b])]
        deltas += shaper.finish()
        assert "".join(d.get("reasoning_content", "") for d in deltas) == "I should add."
        calls = [c for d in deltas for c in d.get("tool_calls", ())]
        assert calls[0]["function"]["name"] == "add"
        assert "".join(c["function"]["arguments"] for c in calls) == '{"a": 1}'
        assert not any(d.get("content") for d in deltas)
    message = message_of(text, spec)
    assert message["reasoning_content"] == "I should add." and message["content"] is None
    assert message["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 1}'}
    plain = OutputSpec(reasoning="start")
    assert message_of("  no thinking here\n", plain) == {"role": "assistant", "content": "  no thinking here\n"}
