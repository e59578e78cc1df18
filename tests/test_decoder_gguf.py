"""The decoder over real llama.cpp contexts, on tiny generated GGUF models."""

from __future__ import annotations

import numpy as np
import pytest

from specdec_cpu import SamplingParams, SpeculativeDecoder, VocabMismatchError

GREEDY = SamplingParams(temperature=0.0)


def test_generates_and_reports_stats(tiny_target, tiny_draft) -> None:
    dec = SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, gamma=4, n_ctx=256, seed=3)
    gen = dec.generate("hello world", max_tokens=40, params=SamplingParams(temperature=1.0, seed=1))
    s = gen.stats
    assert 1 <= s.tokens <= 40 and s.steps >= 1
    assert s.drafted > 0 and 0.0 < s.mean_alpha <= 1.0
    assert s.target_seconds > 0 and s.draft_seconds > 0
    again = dec.generate("hello world", max_tokens=40, params=SamplingParams(temperature=1.0, seed=1))
    assert again.tokens == gen.tokens  # a seed reproduces a run


def test_greedy_equals_plain_up_to_batch_noise(tiny_target, tiny_draft) -> None:
    plain = SpeculativeDecoder.from_gguf(tiny_target, None, gamma=0, n_ctx=256)
    spec = SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, gamma=3, n_ctx=256)
    prompt = plain.tokenizer.tokenize("the quick brown fox")
    want = plain.generate(prompt, max_tokens=48, params=GREEDY).tokens
    got = spec.generate(prompt, max_tokens=48, params=GREEDY).tokens
    if got != want:
        i = next(i for i, (a, b) in enumerate(zip(got + [-1], want + [-1])) if a != b)
        plain.reset()
        top2 = np.sort(np.asarray(plain.target.eval(prompt + want[:i], 1)[0], dtype=np.float64))[-2:]
        plain.target.truncate(0)
        assert top2[1] - top2[0] < 1e-3, f"diverged at {i} with a top-2 gap of {top2[1] - top2[0]}"


def test_padded_draft_vocabulary_is_accepted(tiny_target, tiny_padded_draft) -> None:
    dec = SpeculativeDecoder.from_gguf(tiny_target, tiny_padded_draft, gamma=3, n_ctx=256, seed=1)
    gen = dec.generate("abc", max_tokens=20, params=SamplingParams(temperature=1.0))
    assert all(t < dec.target.n_vocab for t in gen.tokens)


def test_mismatched_vocabulary_is_refused(tiny_target, tiny_mismatched_draft) -> None:
    with pytest.raises(VocabMismatchError, match="id"):
        SpeculativeDecoder.from_gguf(tiny_target, tiny_mismatched_draft, n_ctx=256)


def test_chat_reuses_the_conversation_cache(tiny_target, tiny_draft) -> None:
    dec = SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, gamma=3, n_ctx=512, seed=2)
    messages = [{"role": "user", "content": "hi there"}]
    first = dec.chat(messages, max_tokens=16, params=SamplingParams(temperature=0.8))
    messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "more"}]
    second = dec.chat(messages, max_tokens=16, params=SamplingParams(temperature=0.8))
    first_prompt = len(dec.tokenizer.tokenize(dec.chat_prompt(messages[:1])))
    assert second.stats.prompt_cached >= first_prompt


def test_large_vocabulary_pair(tiny_large_vocab, tiny_large_vocab_draft) -> None:
    dec = SpeculativeDecoder.from_gguf(tiny_large_vocab, tiny_large_vocab_draft, gamma=4, n_ctx=256, seed=4)
    gen = dec.generate("zz", max_tokens=24, params=SamplingParams(temperature=0.7, top_p=0.9))
    assert gen.stats.tokens >= 1 and gen.stats.drafted > 0
