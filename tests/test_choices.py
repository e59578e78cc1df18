"""``n`` choices of one prompt (OpenAI's ``n``): independent samples that
share the prompt's cached cells instead of decoding it again."""

from __future__ import annotations

import time

import numpy as np
import pytest
from stats_helpers import assert_matches_distribution, expected_distribution

from specdec_cpu import BatchedDecoder, SamplingParams, SpeculativeDecoder, engine

PROMPT = "the world is and the cat is"


@pytest.fixture(scope="module")
def first_token_law(tiny_target):
    w = engine.LlamaWeights(tiny_target)
    ctx = engine.LlamaContext(w, n_ctx=128, n_batch=64, n_threads=1, flash_attn=True)
    tok = engine.LlamaTokenizer(w)
    ids = tok.tokenize(PROMPT)
    p = expected_distribution(np.array(ctx.eval(ids, 1)[0], dtype=np.float64), params=SamplingParams())
    eog = sorted(tok.eog_ids)
    p[eog[0]] += p[eog[1:]].sum()
    p[eog[1:]] = 0.0
    yield p, eog
    w.close()


def test_choices_decode_the_prompt_once(tiny_target, tiny_draft):
    """Choices 1..n−1 start once choice 0's prompt is in, and share its cells.

    Each step is slowed down, so that all four choices are queued before the
    scheduler admits any: admitted together, they would each decode the prompt."""
    import time

    prompt = "hello world and the cat is of the world " * 4
    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, gamma=3, max_sequences=5, n_ctx=256, n_threads=1,
                                  calibration=None) as dec:
        loop = dec._scheduler.loop
        step = loop.step
        loop.step = lambda *a: (time.sleep(0.05), step(*a))[1]
        busy = dec.stream("and the", max_tokens=100, params=SamplingParams(temperature=1.0, ignore_eos=True))
        next(iter(busy))  # the scheduler is stepping
        n_prompt = len(dec.tokenize(prompt))
        before = dec.metrics()
        gens = dec.generate_choices(prompt, 4, max_tokens=8, params=SamplingParams(temperature=1.0))
        busy.close()
        m = dec.metrics()
    assert len(gens) == 4 and m.prompt_tokens - before.prompt_tokens == 4 * n_prompt
    assert m.prompt_tokens_cached - before.prompt_tokens_cached >= 3 * (n_prompt - 1)


def test_each_choice_follows_the_target(tiny_target, tiny_draft, first_token_law):
    p, eog = first_token_law
    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, gamma=3, max_sequences=4, n_ctx=128, n_threads=1,
                                  seed=1, calibration=None, max_queue=64) as dec:
        counts = np.zeros((4, p.size))
        calls, drafted = 500, 0
        for _ in range(calls):
            gens = dec.generate_choices(PROMPT, 4, max_tokens=4, params=SamplingParams(temperature=1.0))
            for i, g in enumerate(gens):
                counts[i, g.tokens[0] if g.tokens else eog[0]] += 1
                drafted += g.stats.drafted
    assert drafted > 0
    for i in range(4):
        assert_matches_distribution(counts[i], p, what=f"choice {i}: first tokens")
    # the choices are independent: how often two choices agree is what two draws agree
    same = counts[1] @ counts[2] / calls**2
    assert abs(same - p @ p) < 0.1


def test_seeded_choices_differ_and_repeat(tiny_target):
    params = SamplingParams(temperature=1.0, seed=42)
    runs = []
    for _ in range(2):
        with SpeculativeDecoder.from_gguf(tiny_target, None, gamma=0, n_ctx=128, n_threads=1,
                                          calibration=None) as dec:
            runs.append([g.tokens for g in dec.generate_choices(PROMPT, 3, max_tokens=12, params=params)])
    assert runs[0] == runs[1] and len({tuple(t) for t in runs[0]}) == 3


def test_streamed_choices_and_bad_n(tiny_target):
    with BatchedDecoder.from_gguf(tiny_target, None, gamma=0, max_sequences=2, n_ctx=128, n_threads=1,
                                  calibration=None) as dec:
        streams = dec.stream_choices(PROMPT, 3, max_tokens=6, params=SamplingParams(temperature=1.0, seed=5))
        texts = ["".join(s) for s in streams]
        assert [s.result.text for s in streams] == texts and len(set(texts)) > 1
        with pytest.raises(ValueError, match=r"n must be an int in \[1, 8\]"):
            dec.generate_choices(PROMPT, 0)
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            dec.generate_choices(PROMPT, 2, temprature=0.5)


@pytest.mark.parametrize("cls", [SpeculativeDecoder, BatchedDecoder])
def test_stop_strings_given_as_an_iterator_reach_every_choice(tiny_target, cls):
    dec = cls.from_gguf(tiny_target, n_ctx=256, n_threads=1, seed=2)
    params = SamplingParams(temperature=0.0)
    word = dec.generate("hello", max_tokens=12, params=params).text[3:6]
    gens = dec.generate_choices("hello", 3, max_tokens=12, params=params, stop=(s for s in [word]))
    assert all(word not in g.text and g.finish_reason == "stop" for g in gens), [g.text for g in gens]
    dec.close()


def test_an_interrupted_wait_for_choices_stops_them_all(tiny_target):
    """generate_choices waits for choice 0, then 1, ...: when a wait ends by
    an exception (here KeyboardInterrupt), no choice decodes on."""
    dec = BatchedDecoder.from_gguf(tiny_target, max_sequences=2, n_ctx=4096, n_threads=1)
    calls = []

    def interrupted(req, timeout):
        calls.append(req)
        raise KeyboardInterrupt

    dec._wait = interrupted
    with pytest.raises(KeyboardInterrupt):
        dec.generate_choices("hello", 2, max_tokens=4000)
    deadline = time.monotonic() + 10
    while (dec.metrics().active_sequences or dec.metrics().queue_depth) and time.monotonic() < deadline:
        time.sleep(0.01)
    m = dec.metrics()
    assert len(calls) == 1 and m.active_sequences == 0 and m.queue_depth == 0 and m.requests["cancelled"] == 2
    dec.close()
