"""Log-probabilities of a prompt's tokens (``prompt_logprobs``), through llama.cpp.

Entry i is prompt token i + 1 under the model's distribution after tokens
0..i.  The reference is one pass of the whole prompt through a
one-sequence context with every row's logits.  The prompts are longer than
the rows a step takes in for such a request, so entries come from several
chunks; they are asked again after the same prompt was cached, and of the
choices of one request, which share the first choice's prompt.
"""

from __future__ import annotations

import numpy as np
import pytest

from specdec_cpu import BatchedDecoder, SamplingParams, SpeculativeDecoder, engine
from specdec_cpu.decoding.loop import PROMPT_LOGPROB_ROWS

TOL = 0.05  # batched and one-context passes round differently (F16 KV cache): ~1e-2 in a logit
TEXT = "the cat sat on the mat and then it ran off to see the dog, who was not at home. " * 3


@pytest.fixture(scope="module")
def reference(tiny_target):
    w = engine.LlamaWeights(tiny_target)
    ctx = engine.LlamaContext(w, n_ctx=512, n_batch=512, n_threads=1)

    def rows(ids: list) -> np.ndarray:
        """log softmax of every row of ``ids``'s pass."""
        ctx.reset()
        x = np.array(ctx.eval(ids, len(ids)), dtype=np.float64)
        m = x.max(axis=1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))

    yield rows
    w.close()


def check(entries, prompt: list, reference, top: int) -> None:
    assert entries is not None and len(entries) == len(prompt) - 1
    want = reference(prompt)
    for i, e in enumerate(entries):
        assert e.token == prompt[i + 1] and len(e.top) == top
        assert abs(e.logprob - want[i, e.token]) < TOL, (i, e.logprob, want[i, e.token])
        for t, lp in e.top:
            assert abs(lp - want[i, t]) < TOL
        if top:
            assert abs(e.top[0][1] - want[i].max()) < TOL


@pytest.mark.parametrize("cls", [SpeculativeDecoder, BatchedDecoder])
def test_prompt_logprobs_over_several_chunks_and_a_cached_prompt(tiny_target, tiny_draft, reference, cls):
    kwargs = dict(max_sequences=2) if cls is BatchedDecoder else {}
    with cls.from_gguf(tiny_target, tiny_draft, gamma=3, n_ctx=512, n_threads=1, seed=5, calibration=None,
                       **kwargs) as dec:
        prompt = dec.tokenize(TEXT)
        assert len(prompt) > 2 * PROMPT_LOGPROB_ROWS  # three chunks at least
        params = SamplingParams(temperature=1.0)
        first = dec.generate(prompt, max_tokens=8, params=params, prompt_logprobs=3)
        check(first.prompt_logprobs, prompt, reference, 3)
        again = dec.generate(prompt, max_tokens=8, params=params, prompt_logprobs=0)  # the prompt is cached now
        check(again.prompt_logprobs, prompt, reference, 0)
        assert again.stats.prompt_cached == 0  # its rows were computed again, not taken from the cache
        plain = dec.generate(prompt, max_tokens=8, params=params)
        assert plain.prompt_logprobs is None and plain.stats.prompt_cached > 0
        one = dec.generate(prompt[:1], max_tokens=4, params=params, prompt_logprobs=2)
        assert one.prompt_logprobs == []  # nothing predicts a first token


def test_prompt_logprobs_beside_decoding_requests_and_of_every_choice(tiny_target, tiny_draft, reference):
    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, gamma=3, max_sequences=4, n_ctx=512, n_threads=1,
                                  seed=2, prefill_chunk=16, calibration=None) as dec:
        params = SamplingParams(temperature=1.0)
        busy = [dec.stream(p, max_tokens=60, params=params) for p in ("hello world", "and the")]
        prompt = dec.tokenize(TEXT)
        gens = dec.generate_choices(prompt, 3, max_tokens=6, params=params, prompt_logprobs=1, logprobs=1)
        for s in busy:
            "".join(s)
        for gen in gens:
            check(gen.prompt_logprobs, prompt, reference, 1)
            assert gen.logprobs is not None and len(gen.logprobs) == len(gen.tokens)
        assert gens[1].prompt_logprobs == gens[0].prompt_logprobs  # shared, not recomputed
        assert gens[1].stats.prompt_cached == len(prompt) - 1


def test_bad_prompt_logprobs_are_refused(tiny_target):
    with SpeculativeDecoder.from_gguf(tiny_target, None, gamma=0, n_ctx=64, n_threads=1, calibration=None) as dec:
        for bad in (21, -1, True, 1.5):
            with pytest.raises(ValueError, match=r"prompt_logprobs must be None or an int in \[0, 20\]"):
                dec.generate("hi", prompt_logprobs=bad)


def test_invalid_logits_in_a_prompt_fail_that_request_alone(tiny_nan_target, tiny_draft):
    """Token 300's embedding is NaN: every row after it is NaN, so scoring the prompt fails at its first
    position after 300, and only that request fails."""
    from specdec_cpu.errors import InvalidLogitsError

    with BatchedDecoder.from_gguf(tiny_nan_target, tiny_draft, gamma=2, max_sequences=2, n_ctx=256, n_threads=1,
                                  calibration=None) as dec:
        clean = dec.tokenize("hello world")
        poisoned = clean + [300] + clean  # the first token would come from clean rows' end: NaN too
        busy = dec.stream(clean, max_tokens=30, params=SamplingParams(temperature=0))
        with pytest.raises(InvalidLogitsError, match=r"invalid logits.*in its prompt \(positions 0 to"):
            dec.generate(poisoned, max_tokens=4, prompt_logprobs=1)
        assert len("".join(busy)) > 0 and busy.result.finish_reason in ("length", "stop")
        assert dec.healthy
        again = dec.generate(clean, max_tokens=4, prompt_logprobs=1)
        assert len(again.prompt_logprobs) == len(clean) - 1


@pytest.mark.parametrize("cls", [SpeculativeDecoder, BatchedDecoder])
def test_max_tokens_0_scores_the_prompt_and_samples_nothing(tiny_target, tiny_draft, reference, cls):
    with cls.from_gguf(tiny_target, tiny_draft, gamma=3, n_ctx=512, n_threads=1, seed=5, calibration=None) as dec:
        prompt = dec.tokenize(TEXT)
        gen = dec.generate(prompt, max_tokens=0, prompt_logprobs=2)
        check(gen.prompt_logprobs, prompt, reference, 2)
        assert gen.tokens == [] and gen.text == "" and gen.finish_reason == "length" and gen.stats.steps == 0
        stream = dec.stream(prompt[:PROMPT_LOGPROB_ROWS + 1], max_tokens=0, prompt_logprobs=0)  # one chunk and a row
        assert list(stream) == [] and len(stream.result.prompt_logprobs) == PROMPT_LOGPROB_ROWS
        one = dec.generate(prompt[:1], max_tokens=0, prompt_logprobs=0)
        assert one.prompt_logprobs == [] and one.tokens == []
        choices = dec.generate_choices(prompt, 3, max_tokens=0, prompt_logprobs=1)
        assert all(c.prompt_logprobs == choices[0].prompt_logprobs and c.tokens == [] for c in choices)
        check(choices[0].prompt_logprobs, prompt, reference, 1)
        with pytest.raises(ValueError, match=r"max_tokens must be an int >= 1 \(0 only with prompt_logprobs"):
            dec.generate(prompt, max_tokens=0)
        assert dec.generate(prompt, max_tokens=3).tokens  # the decoder goes on


def test_a_choice_whose_shared_prompt_was_evicted_computes_it_again(tiny_target, tiny_draft, reference, monkeypatch):
    """The first choice's cells may be gone when a later choice starts (another request took its slot): that
    choice computes its prompt again, rather than adding new entries to the copied ones."""
    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, gamma=2, max_sequences=1, n_ctx=512, n_threads=1,
                                  calibration=None) as dec:
        slots = dec._scheduler.loop.slots
        claim = slots.claim

        def claim_after_an_eviction(prompt, **kwargs):
            for slot in range(slots.n_slots):
                dec.target.clear(slot)
            return claim(prompt, **kwargs)

        monkeypatch.setattr(slots, "claim", claim_after_an_eviction)
        prompt = dec.tokenize(TEXT)
        gens = dec.generate_choices(prompt, 2, max_tokens=2, prompt_logprobs=1)
        for gen in gens:
            check(gen.prompt_logprobs, prompt, reference, 1)
        assert gens[1].stats.prompt_cached == 0
