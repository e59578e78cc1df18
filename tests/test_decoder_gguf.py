"""The decoder over real llama.cpp contexts, on tiny generated GGUF models."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

from specdec_cpu import DecoderClosedError, SamplingParams, SpeculativeDecoder, VocabMismatchError
from specdec_cpu.errors import UnsupportedModelError
from specdec_cpu.planning import CostModel

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


# ---------------------------------------------------------------- γ and n_batch

# A cost model under which extra verify rows and draft tokens look free, so
# that γ = auto asks for as many rows as it may (up to gamma_max = 12 for the
# draft model, max_draft = 24 for prompt lookup).
_FREE_ROWS = CostModel(target_ms=[1e-3] * 65, draft_ms=1e-4, alpha=0.99)
_REPEATING = "hello world and the " * 12  # gives prompt lookup long matches


@pytest.mark.parametrize("gamma, with_draft", [(8, True), (8, False), ("auto", True), ("auto", False)])
def test_gamma_never_exceeds_what_one_batch_can_verify(tiny_target, tiny_draft, gamma, with_draft):
    """A verify pass needs γ + 1 rows of logits from one llama.cpp batch: with
    n_batch = 8 no step may draft more than 7 tokens, on any route."""
    n_batch = 8
    draft = tiny_draft if with_draft else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dec = SpeculativeDecoder.from_gguf(tiny_target, draft, gamma=gamma, ngram=True, n_ctx=512,
                                           n_batch=n_batch, n_threads=1, seed=1, calibration=_FREE_ROWS)
    assert dec.gamma_cap == n_batch - 1
    too_long = [w for w in caught if "n_batch" in str(w.message)]
    assert bool(too_long) == (gamma == 8), [str(w.message) for w in caught]
    gen = dec.generate(_REPEATING, max_tokens=64, params=GREEDY)
    s = gen.stats
    assert s.tokens == 64 or s.finish_reason == "stop"
    assert s.drafted > 0
    assert max(s.gammas) <= n_batch - 1, s.gamma_runs()
    if with_draft and gamma == 8:  # a fixed γ drafts what it is asked, up to the cap
        assert max(s.gammas) == n_batch - 1, s.gamma_runs()
    # A per-call γ is capped the same way.
    again = dec.generate(_REPEATING, max_tokens=16, params=GREEDY, gamma=12)
    assert max(again.stats.gammas) <= n_batch - 1


def test_a_one_row_batch_decodes_plain(tiny_target, tiny_draft):
    with pytest.warns(UserWarning, match="n_batch is 1"):
        dec = SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, gamma=3, n_ctx=256, n_batch=1,
                                           n_threads=1, calibration=None)
    gen = dec.generate("hello", max_tokens=12, params=GREEDY)
    assert gen.stats.gammas and set(gen.stats.gammas) == {0}


# ---------------------------------------------------------------- recurrent models


@pytest.fixture(scope="module")
def tiny_recurrent(tmp_path_factory):
    """A tiny Mamba model (llama.cpp reports it recurrent) with the target's vocabulary."""
    pytest.importorskip("gguf")
    from tiny_mamba import write_tiny_mamba

    return str(write_tiny_mamba(tmp_path_factory.mktemp("mamba") / "mamba.gguf", n_vocab=384))


def test_a_recurrent_draft_is_refused_at_load(tiny_target, tiny_recurrent):
    with pytest.raises(UnsupportedModelError, match=r"draft model .*mamba.gguf \(mamba\) is a recurrent"):
        SpeculativeDecoder.from_gguf(tiny_target, tiny_recurrent, n_ctx=256, calibration=None)


@pytest.mark.parametrize("with_draft, ngram", [(True, False), (False, True), (True, True)])
def test_a_recurrent_target_with_a_drafter_is_refused_at_load(tiny_recurrent, tiny_draft, with_draft,
                                                              ngram):
    with pytest.raises(UnsupportedModelError,
                       match=r"target model .*mamba.gguf \(mamba\) is a recurrent.*plain decoding works"):
        SpeculativeDecoder.from_gguf(tiny_recurrent, tiny_draft if with_draft else None, ngram=ngram,
                                     n_ctx=256, calibration=None)


def test_a_recurrent_target_alone_decodes_plain_across_requests(tiny_recurrent):
    dec = SpeculativeDecoder.from_gguf(tiny_recurrent, None, n_ctx=256, n_batch=8, n_threads=1)

    def fresh(prompt, n):
        return SpeculativeDecoder.from_gguf(tiny_recurrent, None, n_ctx=256, n_batch=8,
                                            n_threads=1).generate(prompt, max_tokens=n, params=GREEDY)

    prompt = dec.tokenizer.tokenize("hello world and the world")  # longer than n_batch: chunked
    first = dec.generate(prompt, max_tokens=12, params=GREEDY)
    assert set(first.stats.gammas) == {0}
    assert first.tokens == fresh(prompt, 12).tokens
    # A request extending the cached text reuses it; one that does not, or
    # that repeats it exactly, starts over: its state cannot drop a suffix.
    longer = prompt + first.tokens + dec.tokenizer.tokenize(" more", add_special=False)
    second = dec.generate(longer, max_tokens=8, params=GREEDY)
    assert second.stats.prompt_cached > len(prompt)
    assert second.tokens == fresh(longer, 8).tokens
    for other in (longer, dec.tokenizer.tokenize("the and of")):
        gen = dec.generate(other, max_tokens=8, params=GREEDY)
        assert gen.stats.prompt_cached == 0
        assert gen.tokens == fresh(other, 8).tokens


def test_gamma_max_bounds_auto_for_the_draft_model_not_lookup_nor_a_fixed_gamma():
    """On a memory-bound pair (every pass costs the same, whatever its rows)
    γ=auto asks for as many draft-model tokens as it may: gamma_max; a
    fixed γ and prompt lookup (bounded by its max_draft) go beyond it."""
    from synthetic import ByteTokenizer, MarkovLM

    def model(seed, seconds):
        return MarkovLM(12, order=2, seed=seed, pass_seconds=seconds)

    # A target pass 100 times a draft pass: on a busy machine the draft's measured
    # time grows by the thread's wake-up delay, which must not make drafting dear.
    target = model(41, 0.02)
    repeating = [1, 2, 3, 4, 5, 6] * 6
    dec = SpeculativeDecoder(target, ByteTokenizer(), MarkovLM(12, order=2, table=target.table, pass_seconds=0.0002),
                             gamma="auto", gamma_max=3, seed=1)
    auto = dec.generate(repeating, max_tokens=48, params=GREEDY).stats
    assert max(auto.gammas) == 3, auto.gamma_runs()  # a perfect draft on free rows: all it may
    fixed = dec.generate(repeating, max_tokens=48, params=GREEDY, gamma=6).stats
    assert max(fixed.gammas) == 6, fixed.gamma_runs()
    lookup = SpeculativeDecoder(model(41, 0.02), ByteTokenizer(), gamma="auto", gamma_max=3, ngram=True, seed=1)
    copied = lookup.generate(repeating, max_tokens=64, params=GREEDY).stats
    assert max(copied.gammas) > 3, copied.gamma_runs()  # bounded by max_draft instead


def test_close_frees_the_models_and_refuses_later_calls(tiny_target, tiny_draft) -> None:
    with SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, gamma=2, n_ctx=256, n_threads=1) as dec:
        left_open = dec.stream("hello", max_tokens=50)
        next(left_open)  # a stream this thread left open is ended by close()
        pair = dec._owned
    assert dec.closed and dec.target.closed and dec.draft.closed
    assert pair.target.closed and pair.draft.closed
    with pytest.raises(DecoderClosedError, match="closed"):
        dec.generate("hello", max_tokens=3)
    with pytest.raises(DecoderClosedError, match="SpeculativeDecoder is closed"):
        dec.tokenize("hello")
    dec.reset()  # nothing to forget
    dec.close()  # idempotent

    # A call that passed its checks and waits for the lock while the decoder
    # closes ends with the error (it must not run on freed contexts).
    dec = SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, gamma=2, n_ctx=256, n_threads=1)
    gate = _GatedLock(dec._lock)
    dec._lock = gate
    outcome: list = []
    waiter = threading.Thread(target=lambda: outcome.append(_error_of(lambda: dec.generate("hi", max_tokens=3))))
    gate.waiter = waiter
    waiter.start()
    assert gate.reached.wait(30)
    dec.close()
    gate.open.set()
    waiter.join(30)
    assert outcome and isinstance(outcome[0], DecoderClosedError), outcome


class _GatedLock:
    """The decoder's lock, but the thread ``waiter`` gets it only after ``open``."""

    def __init__(self, lock) -> None:
        self.lock, self.waiter = lock, None
        self.reached, self.open = threading.Event(), threading.Event()

    def acquire(self, *args, **kwargs) -> bool:
        if threading.current_thread() is self.waiter:
            self.reached.set()
            self.open.wait()
        return self.lock.acquire(*args, **kwargs)

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _error_of(call) -> object:
    try:
        return call()
    except Exception as exc:
        return exc
