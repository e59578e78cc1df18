"""BatchedDecoder: many requests in one llama.cpp pass per step (tiny GGUF models).

Exactness under batching is in test_batched_exactness.py, churn and
resource use in test_batched_churn.py.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import pytest
from batched_helpers import assert_greedy_equal, call_or_fail, endless_prompt, wait_idle

from specdec_cpu import (
    BatchedDecoder,
    ContextOverflowError,
    DecoderClosedError,
    GenerationCancelled,
    InvalidLogitsError,
    InvalidPromptError,
    QueueFullError,
    SamplingParams,
    SpecDecError,
    SpeculativeDecoder,
)
from specdec_cpu.decoding.request import Request
from specdec_cpu.decoding.step_trace import StepRecord
from specdec_cpu.planning.policy import CATCH_UP_LIMIT, EXPLORE_ROWS, INVESTMENT_GAIN, PROBE_GAMMA

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = ["the quick brown fox", "hello world", "def return print", "and the", "it is of",
           "with that for", "in the world", "hello and"]


@pytest.fixture(scope="module")
def batched(tiny_target, tiny_draft):
    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, max_sequences=4, n_ctx=256, n_threads=1,
                                  seed=5, max_queue=64) as dec:
        yield dec


def test_greedy_requests_in_flight_equal_single_stream_runs(batched, tiny_target, tiny_draft) -> None:
    single = SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, gamma=3, n_ctx=256, n_threads=1)
    want = {p: single.generate(p, max_tokens=40, params=GREEDY).tokens for p in PROMPTS}
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = dict(zip(PROMPTS, pool.map(
            lambda p: batched.generate(p, max_tokens=40, params=GREEDY).tokens, PROMPTS)))
    for p in PROMPTS:
        assert_greedy_equal(got[p], want[p], single.tokenizer.tokenize(p), single.target, what=repr(p))
    m = batched.metrics()
    assert m.target_passes < m.tokens_generated, "requests did not share target passes"


def test_api_mirrors_the_single_stream_decoder(batched) -> None:
    seeded = SamplingParams(temperature=0.9, seed=11)
    gen = batched.generate("hello world", max_tokens=12, params=seeded, gamma=2)
    assert gen.finish_reason in ("length", "stop") and len(gen.tokens) <= 12
    assert gen.stats.tokens == len(gen.tokens) and gen.stats.steps >= 1
    assert gen.stats.total_seconds > 0 and gen.stats.queue_seconds >= 0
    # Time to first token: from submission, so within the request's whole time.
    assert 0 < gen.stats.first_token_seconds <= gen.stats.queue_seconds + gen.stats.total_seconds
    before = batched.metrics()
    # A request's own seed reproduces it at a fixed γ (alone, same cached prefix).
    again = batched.generate("hello world", max_tokens=12, params=seeded, gamma=2)
    assert again.tokens == gen.tokens
    after = batched.metrics()  # the request's time to first token went into the histogram
    assert after.ttft_buckets[-1] == before.ttft_buckets[-1] + 1
    assert after.ttft_seconds - before.ttft_seconds == pytest.approx(again.stats.first_token_seconds)
    assert list(after.ttft_buckets) == sorted(after.ttft_buckets)  # cumulative

    stream = batched.stream("hello world", max_tokens=12, params=seeded, gamma=2)
    pieces = list(stream)
    assert "".join(pieces) == stream.result.text == gen.text

    reply = batched.chat([{"role": "user", "content": "hi"}], max_tokens=5, params=GREEDY)
    assert len(reply.tokens) <= 5
    pieces = list(batched.chat_stream([{"role": "user", "content": "hi"}], max_tokens=5, params=GREEDY))
    assert "".join(pieces) == reply.text


def test_stop_strings_and_max_tokens(batched) -> None:
    gen = batched.generate("hello world", max_tokens=60, params=GREEDY)
    assert gen.finish_reason == "length" and len(gen.tokens) == 60 or gen.finish_reason == "stop"
    text = gen.text
    if len(text) > 4:
        stop = text[2:4]
        cut = batched.generate("hello world", max_tokens=60, params=GREEDY, stop=[stop])
        assert cut.finish_reason == "stop" and cut.text == text[:text.index(stop)]


@pytest.mark.parametrize("cls", [BatchedDecoder, SpeculativeDecoder])
def test_close_waits_for_a_caller_still_tokenizing(tiny_target, tiny_draft, cls) -> None:
    """Tokenizing runs in the caller's thread; close() from another thread must
    not free the model under it (llama.cpp would read freed memory)."""
    dec = cls.from_gguf(tiny_target, tiny_draft, n_ctx=256, n_threads=1)
    tokenizer, seen = dec.tokenizer, {}
    real = tokenizer.tokenize

    def slow(*args, **kwargs):
        seen["entered"] = True
        time.sleep(0.3)
        seen["model_open_after"] = not dec.target.closed
        return real(*args, **kwargs)

    tokenizer.tokenize = slow
    caller = threading.Thread(target=lambda: seen.setdefault("ids", dec.tokenize("hello world")))
    caller.start()
    while "entered" not in seen:
        time.sleep(0.01)
    dec.close()
    caller.join(10)
    assert seen["model_open_after"] and seen["ids"], seen
    with pytest.raises(DecoderClosedError):
        dec.tokenize("hello")


def test_a_decoder_dropped_without_close_stops_its_thread_and_frees_its_models(tiny_target) -> None:
    dec = BatchedDecoder.from_gguf(tiny_target, max_sequences=1, n_ctx=128, n_threads=1)
    dec.generate("hi", max_tokens=2, params=GREEDY)
    thread, target = dec._scheduler._thread, dec.target
    del dec
    gc.collect()
    thread.join(10)
    assert not thread.is_alive() and target.closed


def test_a_bad_close_timeout_is_refused_before_anything_closes(tiny_target) -> None:
    dec = BatchedDecoder.from_gguf(tiny_target, max_sequences=1, n_ctx=128, n_threads=1)
    for bad in ("5", -1, True):
        with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0 or None"):
            dec.close(drain=True, timeout=bad)
    assert not dec.closed and dec.generate("hi", max_tokens=2, params=GREEDY).tokens
    dec.close(drain=True, timeout=5)
    assert dec.closed and dec.target.closed


def test_a_cancel_event_that_fails_stops_its_request_alone(batched) -> None:
    """A Manager().Event() whose manager is gone raises from is_set(): that
    request ends as cancelled, the scheduler and the other requests go on."""

    class Broken:
        def is_set(self) -> bool:
            raise BrokenPipeError("the manager is gone")

    other = threading.Thread(target=batched.generate, args=("the other request",),
                             kwargs={"max_tokens": 20, "params": GREEDY})
    other.start()
    with pytest.raises(GenerationCancelled):
        batched.generate("hello", max_tokens=20, params=GREEDY, cancel=Broken())
    other.join(60)
    assert batched.healthy and batched.generate("hi", max_tokens=3, params=GREEDY).tokens
    wait_idle(batched)


def test_draft_lags_longer_than_one_draft_pass_never_overflow_it(tiny_target, tiny_draft) -> None:
    """A fixed γ takes in its draft's lag within its first draft pass; four
    fresh 60-token prompts lag 4 x 61 rows, more than a pass of 128 holds,
    and one prompt alone lags more than a pass of 32: the lag a step takes in
    fits the pass (a work it would not fit drafts no more that step, the
    longer lag catches up in chunks), and the decoder lives on."""
    prompts = [" ".join([f"word{i}"] * 60) for i in range(4)]
    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, n_batch=128, max_sequences=4, gamma=3, n_ctx=512,
                                  n_threads=1) as dec:
        with ThreadPoolExecutor(4) as pool:
            gens = list(pool.map(lambda p: dec.generate(p, max_tokens=30, params=GREEDY), prompts))
        assert [g.finish_reason for g in gens] == ["length"] * 4 and dec.healthy
        assert sum(g.stats.drafted for g in gens) > 0
    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, n_batch=32, max_sequences=1, gamma=3, n_ctx=256,
                                  n_threads=1) as dec:
        gen = dec.generate(" ".join(["hello"] * 40), max_tokens=40, params=GREEDY)
        assert gen.finish_reason == "length" and dec.healthy
        assert gen.stats.drafted > 0  # its lag went in as catch-up chunks that fit, then it drafted


def test_a_grammar_past_the_matchers_limits_fails_its_request_alone(batched) -> None:
    """A grammar that never ends (each step forces more tokens than llguidance
    will fast-forward) fails its own request with a ConstraintError, wherever
    in the step it hits the limit; the scheduler and the other requests go on."""
    from specdec_cpu.constraints import Grammar
    from specdec_cpu.errors import ConstraintError

    endless = Grammar.gbnf('root ::= "a" root')
    before = batched.metrics()
    other = threading.Thread(target=batched.generate, args=("the other request",),
                             kwargs={"max_tokens": 30, "params": GREEDY})
    other.start()
    batched.generate("x", max_tokens=2, params=GREEDY)  # "x" is cached: the limit is hit while drafting
    where = set()
    for prompt in ("x", "a new prompt"):
        with pytest.raises(ConstraintError, match="Too many items") as info:
            batched.generate(prompt, max_tokens=16, params=GREEDY, gamma=2, grammar=endless)
        where.add(str(info.value).split(" failed ")[1].split(":")[0])
    other.join(60)
    assert "while drafting" in where, where
    assert batched.healthy and batched.generate("hi", max_tokens=3, params=GREEDY).tokens
    after = batched.metrics()
    assert after.requests["error"] - before.requests["error"] == 2
    wait_idle(batched)


def test_bad_requests_are_refused_before_they_run(batched) -> None:
    before = batched.metrics()
    with pytest.raises(InvalidPromptError, match="empty"):
        batched.generate("", max_tokens=4)
    with pytest.raises(InvalidPromptError, match="outside the vocabulary"):
        batched.generate([1, 2, 10**6], max_tokens=4)
    with pytest.raises(ContextOverflowError, match="context holds 256"):
        batched.generate([5] * 300, max_tokens=4)
    with pytest.raises(ValueError, match="max_tokens"):
        batched.generate("hi", max_tokens=0)
    with pytest.raises(TypeError, match="params"):
        batched.generate("hi", params={"temperature": 1})
    with pytest.raises(ValueError, match="gamma"):
        batched.generate("hi", gamma=-1)
    with pytest.raises(ValueError, match="timeout"):
        batched.generate("hi", timeout=0)
    with pytest.raises(TypeError, match="stop must be a str"):
        batched.generate("hi", stop=5)
    after = batched.metrics()
    assert after.requests == before.requests and after.active_sequences == 0
    assert batched.generate("hi", max_tokens=3, params=GREEDY).tokens  # still serving


def test_the_metrics_count_a_request_before_its_caller_wakes(batched, monkeypatch) -> None:
    """A client that reads the metrics right after its answer sees its request
    counted and its sequence free: both are updated before the caller wakes."""
    wait_idle(batched)
    before = sum(batched.metrics().requests.values())
    seen = []
    wake = Request.finish

    def finish_and_look(req: Request, *args, **kwargs) -> None:
        seen.append(batched.metrics())  # what the caller would read the moment it wakes
        wake(req, *args, **kwargs)

    monkeypatch.setattr(Request, "finish", finish_and_look)
    batched.generate("hello world", max_tokens=3, params=GREEDY)
    assert seen and seen[0].active_sequences == 0
    assert sum(seen[0].requests.values()) == before + 1


def test_one_requests_nan_logits_do_not_disturb_the_others(tiny_target, tiny_nan_target, tiny_draft) -> None:
    clean = SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, gamma=0, n_ctx=256, n_threads=1)
    prompts = [p for p in PROMPTS if 300 not in clean.generate(p, max_tokens=24, params=GREEDY).tokens][:4]
    want = {p: clean.generate(p, max_tokens=24, params=GREEDY).tokens for p in prompts}
    poisoned = clean.tokenizer.tokenize("hello") + [300, 5]
    with BatchedDecoder.from_gguf(tiny_nan_target, tiny_draft, max_sequences=4, n_ctx=256, n_threads=1,
                                  gamma=2) as dec:
        with ThreadPoolExecutor(6) as pool:
            bad = [pool.submit(dec.generate, poisoned, max_tokens=24, params=GREEDY) for _ in range(2)]
            good = {p: pool.submit(dec.generate, p, max_tokens=24, params=GREEDY) for p in prompts}
            for f in bad:
                with pytest.raises(InvalidLogitsError, match="target model produced invalid logits"):
                    f.result(timeout=60)
            for p, f in good.items():
                got = f.result(timeout=60).tokens
                assert got[:len(want[p]) // 2] == want[p][:len(want[p]) // 2], p
        wait_idle(dec)
        m = dec.metrics()
        assert m.requests["error"] == 2 and m.active_sequences == 0


def test_queue_full_timeout_and_cancel_while_waiting(tiny_target, tiny_draft) -> None:
    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, max_sequences=1, n_ctx=8192, n_threads=1,
                                  max_queue=2) as dec:
        hold = threading.Event()
        # Thousands of greedy steps that never end by themselves: it holds the one slot until `hold` is set.
        busy = dec.stream(endless_prompt(dec, PROMPTS), max_tokens=8000, params=GREEDY, cancel=hold)
        next(busy)
        cancel = threading.Event()
        waiting = dec.stream("hi", max_tokens=5, cancel=cancel)
        t0 = time.perf_counter()
        with pytest.raises(GenerationCancelled) as info:
            dec.generate("hi", max_tokens=5, timeout=0.3)
        assert info.value.reason == "timeout" and info.value.partial.tokens == []
        assert time.perf_counter() - t0 < 5.0
        third = dec.stream("hi", max_tokens=5)
        with pytest.raises(QueueFullError, match="max_queue=2"):
            dec.generate("hi", max_tokens=5)
        assert dec.metrics().requests["rejected"] == 1
        assert busy.result is None, "the slot was not held throughout: the test proved nothing"
        cancel.set()
        assert list(waiting) == [] and waiting.result.finish_reason == "cancelled"
        hold.set()
        list(busy)
        assert busy.result.finish_reason == "cancelled"
        assert third.result is None or third.result.finish_reason in ("length", "stop")
        list(third)
        assert third.result.finish_reason in ("length", "stop")
        wait_idle(dec)


def test_a_refused_request_uses_up_no_seed(tiny_target, tiny_draft) -> None:
    """Requests without a seed of their own draw the decoder's next seed once
    accepted: a request refused with QueueFullError draws none, so the next
    one samples what it would have without the refusal."""
    unseeded = SamplingParams(temperature=1.0)

    def run(refuse: bool) -> list:
        with BatchedDecoder.from_gguf(tiny_target, tiny_draft, max_sequences=2, max_queue=0, n_ctx=256,
                                      n_threads=1, seed=9, gamma=2) as dec:
            busy = dec.stream("hello", max_tokens=100_000, params=unseeded)  # seed 1
            next(busy)
            if refuse:  # one sequence is free: one request would be taken, two choices are not
                with pytest.raises(QueueFullError):
                    dec.generate_choices("hi", 2, max_tokens=4, params=unseeded)
                assert dec.metrics().requests["rejected"] == 1 and dec.metrics().requests["cancelled"] == 0
            busy.close()
            wait_idle(dec)
            return dec.generate("the quick brown fox", max_tokens=24, params=unseeded).tokens

    assert run(refuse=True) == run(refuse=False)


def test_a_measured_calibration_at_load(tiny_target, tiny_draft, tmp_path, monkeypatch) -> None:
    """calibration="measure": the pair's pass times for a batch and α, measured
    at load (and stored); the decoder then serves as usual."""
    monkeypatch.setenv("SPECDEC_CALIBRATION_DIR", str(tmp_path))
    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, max_sequences=2, n_ctx=256, n_threads=1,
                                  calibration="measure") as dec:
        cost = dec.cost_model
        assert cost is not None and cost.alpha is not None and 0.0 < cost.alpha <= 1.0
        assert cost.draft_batch_ms is not None and len(cost.draft_batch_ms) >= 2
        assert dec.policy.alpha_known
        assert len(dec.generate("hello world", max_tokens=8, params=GREEDY).tokens) > 0
    assert list(tmp_path.glob("*.json"))


def test_closing_a_stream_frees_its_sequence(tiny_target, tiny_draft) -> None:
    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, max_sequences=2, n_ctx=256, n_threads=1) as dec:
        s = dec.stream("hello", max_tokens=200, params=SamplingParams(temperature=1.0))
        next(s)
        assert dec.metrics().active_sequences == 1
        s.close()
        assert s.result.finish_reason == "cancelled"
        wait_idle(dec)
        # Dropping the last reference does the same.
        s = dec.stream("hello", max_tokens=200, params=SamplingParams(temperature=1.0))
        next(s)
        del s
        wait_idle(dec)
        assert dec.metrics().requests["cancelled"] == 2


def test_cancel_and_timeout_while_running(batched) -> None:
    # How long a run takes to fill the context on this machine (tiny models can do
    # it in well under 0.1 s): the cancel and the timeout come at a fraction of it.
    t0 = time.perf_counter()
    full = batched.generate("hello", max_tokens=100_000, params=SamplingParams(temperature=1.0))
    soon = max(0.002, (time.perf_counter() - t0) / 4) if full.finish_reason == "context" else 0.05

    def stopped(**kw) -> GenerationCancelled:
        """The error of a T = 1 run stopped by ``kw``; a run that ends by itself
        first (an end-of-generation token, or a full context) is tried again."""
        for _ in range(50):
            cancel = threading.Event()
            timer = threading.Timer(soon, cancel.set)
            timer.start()
            try:
                gen = batched.generate("hello", max_tokens=100_000, params=SamplingParams(temperature=1.0),
                                       **({"cancel": cancel, "gamma": 0} if not kw else kw))
            except GenerationCancelled as exc:
                return exc
            finally:
                timer.cancel()
            assert gen.finish_reason in ("stop", "length", "context"), gen.finish_reason
        raise AssertionError("50 runs ended before their cancel or timeout")

    assert stopped().reason == "cancelled"
    exc = stopped(timeout=soon)
    assert exc.reason == "timeout" and exc.partial.finish_reason == "timeout"
    wait_idle(batched)


def test_close_with_requests_in_flight_never_hangs(tiny_target, tiny_draft) -> None:
    dec = BatchedDecoder.from_gguf(tiny_target, tiny_draft, max_sequences=2, n_ctx=4096, n_threads=1)
    prompt = endless_prompt(dec, PROMPTS)
    # Greedy from this prompt cycles without an end-of-generation token: 4000 tokens take
    # thousands of steps, so every request below is still queued or running at close().
    stream = dec.stream(prompt, max_tokens=4000, params=GREEDY)
    next(stream)
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(dec.generate, prompt, max_tokens=4000, params=GREEDY) for _ in range(4)]
        while dec.metrics().queue_depth + dec.metrics().active_sequences < 5:
            time.sleep(0.005)
        t0 = time.perf_counter()
        dec.close()
        assert time.perf_counter() - t0 < 10.0
        for f in futures:
            with pytest.raises(DecoderClosedError, match="closed while request"):
                f.result(timeout=10)
        with pytest.raises(DecoderClosedError) as info:
            list(stream)
        assert info.value.partial is not None and len(info.value.partial.tokens) >= 1
    with pytest.raises(DecoderClosedError, match="closed"):
        dec.generate("hi")
    dec.close()  # idempotent


def test_close_with_drain_lets_requests_finish(tiny_target, tiny_draft) -> None:
    dec = BatchedDecoder.from_gguf(tiny_target, tiny_draft, max_sequences=2, n_ctx=256, n_threads=1)
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(dec.generate, p, max_tokens=20, params=GREEDY) for p in PROMPTS[:3]]
        time.sleep(0.05)
        dec.close(drain=True, timeout=30)
        assert all(f.result(timeout=10).finish_reason in ("length", "stop") for f in futures)


def test_shared_prompt_prefixes_are_reused(tiny_target, tiny_draft) -> None:
    system = "hello world and the world is " * 4
    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, max_sequences=3, n_ctx=512, n_threads=1) as dec:
        first = dec.generate(system + "one", max_tokens=4, params=GREEDY)
        assert first.stats.prompt_cached == 0
        with ThreadPoolExecutor(3) as pool:
            gens = list(pool.map(lambda s: dec.generate(system + s, max_tokens=4, params=GREEDY),
                                 ["two", "three", "four"]))
        shared = len(dec.tokenize(system)) - 2
        assert all(g.stats.prompt_cached >= shared for g in gens), [g.stats.prompt_cached for g in gens]
        assert dec.metrics().prefix_cache_hits >= 3
        # Greedy output is that of a fresh decoder: the shared cells are the same keys and values.
        fresh = SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, gamma=0, n_ctx=512, n_threads=1)
        want = fresh.generate(system + "two", max_tokens=4, params=GREEDY).tokens
        assert gens[0].tokens[:2] == want[:2]


def test_ngram_only_decoder(tiny_target) -> None:
    text = "hello world and the world is hello world and the world is "
    with BatchedDecoder.from_gguf(tiny_target, None, ngram=True, max_sequences=2, n_ctx=512,
                                  n_threads=1, gamma=4) as dec:
        gen = dec.generate(text * 3, max_tokens=30, params=SamplingParams(temperature=1.0, seed=3))
        assert gen.stats.by_drafter.get("ngram", [0, 0])[0] > 0
        assert set(gen.stats.gammas) - {0} <= {1, 2, 3, 4}


def test_constructor_arguments_are_checked(tiny_target, tiny_draft) -> None:
    with pytest.raises(ValueError, match="max_sequences"):
        BatchedDecoder.from_gguf(tiny_target, tiny_draft, max_sequences=0)
    with pytest.raises(ValueError, match="gamma"):
        BatchedDecoder.from_gguf(tiny_target, None, gamma=3)
    with pytest.raises(ValueError, match="ngram_kwargs"):
        BatchedDecoder.from_gguf(tiny_target, tiny_draft, ngram_kwargs={"max_draft": 4})
    # Checked before a model loads (the path does not exist): a bad n-gram setting
    # would otherwise surface only inside the scheduler, at the first request.
    for kwargs, name in (({"ngram": True, "ngram_kwargs": {"max_draft": 0}}, "max_draft"),
                         ({"prefill_chunk": "64"}, "prefill_chunk"), ({"max_queue": -1}, "max_queue"),
                         ({"gamma_max": 0}, "gamma_max")):
        with pytest.raises((ValueError, TypeError), match=name):
            BatchedDecoder.from_gguf("no-such-model.gguf", **kwargs)


def test_a_request_that_cannot_start_fails_alone(tiny_target, tiny_draft, monkeypatch) -> None:
    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, max_sequences=2, n_ctx=256, n_threads=1) as dec:
        slots = dec._scheduler.loop.slots
        claim, calls = slots.claim, []

        def fails_once(prompt, **kwargs):
            calls.append(prompt)
            if len(calls) == 1:
                raise RuntimeError("no cells left")
            return claim(prompt, **kwargs)

        monkeypatch.setattr(slots, "claim", fails_once)
        with pytest.raises(SpecDecError, match="could not start.*no cells left"):
            call_or_fail(lambda: dec.generate("hello", max_tokens=4, params=GREEDY))
        assert len(dec.generate("hello", max_tokens=4, params=GREEDY).tokens) == 4
        assert dec.healthy and slots.n_free == 2


def test_a_failed_scheduler_ends_its_requests_and_refuses_new_ones(tiny_target, tiny_draft, monkeypatch) -> None:
    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, max_sequences=1, n_ctx=256, n_threads=1) as dec:
        def bug(*args, **kwargs):
            raise RuntimeError("a bug in planning")

        monkeypatch.setattr(dec._scheduler.loop, "_plan", bug)
        with pytest.raises(SpecDecError, match="scheduler failed.*a bug in planning") as info:
            call_or_fail(lambda: dec.generate("hello", max_tokens=4, params=GREEDY))
        assert not isinstance(info.value, DecoderClosedError)
        assert not dec.healthy
        # As after close(): the same error type SpecDecError-catching code moved from SpeculativeDecoder expects.
        with pytest.raises(DecoderClosedError, match="scheduler failed.*no more requests"):
            dec.generate("hello", max_tokens=4, params=GREEDY)


def test_async_streams_for_asyncio_servers(batched) -> None:
    import asyncio

    async def main():
        seeded = SamplingParams(temperature=0.9, seed=21)
        # A seed reproduces a request's tokens given the same γ choices; the
        # first request for a prompt drafts later (the draft model catches up
        # on the prompt first) than a request whose prompt is cached, so warm
        # the cache before comparing two runs.
        await batched.astream("hello world", max_tokens=2, params=seeded, gamma=2).wait()
        s = batched.astream("hello world", max_tokens=10, params=seeded, gamma=2)
        pieces = [p async for p in s]
        assert "".join(pieces) == s.result.text and s.result.finish_reason in ("length", "stop")
        whole = batched.astream("hello world", max_tokens=10, params=seeded, gamma=2)
        await whole.wait()
        assert whole.result.tokens == s.result.tokens
        # Once the request has ended, read_ready() hands over all its text at
        # once and leaves the end for the iteration; nothing is read twice.
        assert whole.read_ready() == s.result.text and whole.read_ready() == ""
        assert [p async for p in whole] == []
        # The reader is woken as each step's text is ready, not only at the end.
        rung = batched.astream(PROMPTS[0], max_tokens=8, params=GREEDY, gamma=0)
        rings, ring = [], rung._request.wakeup
        rung._request.wakeup = lambda: (rings.append(1), ring())
        await rung.wait()
        assert rung.result.stats.tokens >= 4 and len(rings) >= rung.result.stats.tokens - 2
        # Many concurrent async readers and no thread blocked on any of them.
        streams = [batched.astream(p, max_tokens=8, params=GREEDY) for p in PROMPTS]
        texts = await asyncio.gather(*[_collect(x) for x in streams])
        assert all(t == x.result.text for t, x in zip(texts, streams))
        # aclose() stops a request without waiting for it; so does dropping the
        # stream (the request holds no reference to it).
        await cancelled_by(drop=False)
        await cancelled_by(drop=True)

    async def cancelled_by(drop: bool) -> None:
        """A T = 1 run stopped after its first piece by aclose() or by dropping its
        stream ends "cancelled"; one that ends by itself first (an end-of-generation
        token, a full context: a busy machine may delay the stop) is tried again."""
        import asyncio

        for _ in range(20):
            s = batched.astream("hello", max_tokens=100_000, params=SamplingParams(temperature=1.0), gamma=0)
            await s.__anext__()
            req = s._request
            if drop:
                del s
                gc.collect()
            else:
                await s.aclose()
            for _ in range(500):
                if req.done.is_set():
                    break
                await asyncio.sleep(0.01)
            if req.result.finish_reason == "cancelled":
                return
            assert req.result.finish_reason in ("stop", "context"), req.result.finish_reason
        raise AssertionError("20 runs ended by themselves before they were stopped")

    async def _collect(s):
        return "".join([p async for p in s])

    asyncio.run(main())
    wait_idle(batched)


@contextlib.contextmanager
def _decoder_on_given_costs(target, draft, *, row_ms: float, max_sequences: int, n_ctx: int = 256,
                            alpha: Optional[float] = 0.95):
    """A decoder whose planner keeps the given costs (nothing learnt from the
    tiny model's passes): T(k) = 10 + row_ms·(k − 1) ms, a draft row 1 ms, α
    as measured by a calibration (None: not measured)."""
    from specdec_cpu.planning.costmodel import CostModel

    costs = CostModel(target_ms=[10.0 + row_ms * (k - 1) for k in range(1, 513)], draft_ms=1.0,
                      draft_batch_ms=[1.0 * b for b in range(1, 513)], alpha=alpha)
    with BatchedDecoder.from_gguf(target, draft, max_sequences=max_sequences, n_ctx=n_ctx, n_threads=1, seed=3,
                                  calibration=costs) as dec:
        planner = dec.policy.planner
        planner.observe_target = planner.observe_draft = lambda rows, seconds: None
        yield dec


def test_a_full_batch_spends_nothing_on_the_draft_where_it_cannot_pay(tiny_target, tiny_draft) -> None:
    """Costs where rows are cheap for one request but not for a batch (T(k) =
    10 + 6(k − 1) ms, a draft row 1 ms): alone, a good draft pays; with two or
    more requests decoding it does not, so no draft pass runs then at all — no
    drafts, no probes re-measuring α̂, no catch-up of the draft's cache after
    the prompts.  The planner keeps the given costs (nothing is learnt from the
    tiny model's passes)."""
    with _decoder_on_given_costs(tiny_target, tiny_draft, row_ms=6.0, max_sequences=4) as dec:
        sch = dec._scheduler
        busy = []  # requests decoding at each draft pass
        decode = dec.draft.decode
        dec.draft.decode = lambda parts: (busy.append(sum(r.prefilled for r in sch.loop.active)), decode(parts))[1]
        params = SamplingParams(temperature=1.0, seed=1)
        with ThreadPoolExecutor(4) as pool:
            gens = list(pool.map(lambda p: dec.generate(p, max_tokens=80, params=params), PROMPTS[:4]))
        assert all(g.stats.tokens > 0 for g in gens)
        assert not [b for b in busy if b >= 2], busy
        # Alone, the same costs make drafting pay (the test can fail the other way too).  The
        # tiny model's passes beat the given costs: plain steps' record (a batch's last request
        # may have decoded alone for a while) would hold a draft back, so only the costs judge.
        dec.policy.planner.realised.clear()
        busy.clear()
        gen = dec.generate(PROMPTS[4], max_tokens=40, params=params)
        assert busy and gen.stats.drafted > 0


def test_no_catch_up_or_probe_where_drafting_has_not_paid_for_its_catch_ups(tiny_target, tiny_draft) -> None:
    """The planner's ledger: a batch size where drafting, its catch-ups
    included, has lost tokens against plain batching gets no new catch-up or
    probe, so a request whose draft lags after its prompt decodes plain; with
    the loss forgotten the same request catches up and drafts.  Steps that
    drafted or caught up are booked in the ledger, plain steps are not."""
    with _decoder_on_given_costs(tiny_target, tiny_draft, row_ms=0.5, max_sequences=1) as dec:
        draft_rows = []
        decode = dec.draft.decode
        dec.draft.decode = lambda parts: (draft_rows.append(sum(len(p.tokens) for p in parts)), decode(parts))[1]
        booked = []
        observe = dec.policy.planner.observe_balance
        dec.policy.planner.observe_balance = lambda *a: (booked.append(a), observe(*a))[1]
        params = SamplingParams(temperature=1.0, seed=1, ignore_eos=True)
        dec.policy.planner.ledger.balances[1] = -1e9  # drafting alone has lost (more than plain steps fade)
        prompt = "the quick brown fox and hello world it is of the quick"  # its draft lags > IN_STEP_LAG
        held = dec.generate(prompt, max_tokens=60, params=params)
        assert held.stats.tokens == 60 and held.stats.drafted == 0 and not draft_rows
        assert booked and not any(a[1] for a in booked)
        assert not dec.policy.planner.may_invest(1)
        dec.policy.planner.ledger.balances.clear()
        booked.clear()
        free = dec.generate(prompt + " fox", max_tokens=60, params=params)
        assert free.stats.drafted > 0 and max(draft_rows) >= free.stats.prompt_tokens - 2  # caught up, drafted
        assert any(a[1] for a in booked) and 1 in dec.policy.planner.ledger.balances


def test_a_catch_up_must_repay_itself_within_the_expected_horizon(tiny_target, tiny_draft) -> None:
    """After its prompt the draft's cache lags by the whole prompt; catching it
    up costs a draft row per token (1 ms here) and pays only over the tokens
    drafting then saves, counted over the request's remaining ones, at most
    EXPECTED_TOKENS_ALONE (256) for a request decoding alone.  With cheap
    rows drafting saves a few ms per token: a 100-token catch-up repays
    itself within 60 tokens and happens; a 600-token one does not for a
    request of 60 tokens (it decodes plain to its end) but does for one of
    300, in one draft pass (alone, nobody waits for the chunks), and it then
    drafts.  (At the batch's horizon of 64 the 300-token request decoded
    plain: planning.md §3.)"""
    with _decoder_on_given_costs(tiny_target, tiny_draft, row_ms=0.5, max_sequences=1, n_ctx=1024) as dec:
        sch = dec._scheduler
        draft_rows = []
        decode = dec.draft.decode
        dec.draft.decode = lambda parts: (draft_rows.append(sum(len(p.tokens) for p in parts)), decode(parts))[1]
        params = SamplingParams(temperature=1.0, seed=1)
        words = "the quick brown fox and hello world it is of "

        def prompt_of(n_tokens: int) -> str:
            text = words
            while len(dec.tokenizer.tokenize(text)) < n_tokens:
                text += words
            return text

        records: list[StepRecord] = []
        sch.loop.step_trace = records.append
        short = dec.generate(prompt_of(100), max_tokens=60, params=params)
        assert short.stats.prompt_tokens < 150
        assert max(draft_rows) >= 90 and short.stats.drafted > 0  # caught up, then drafted
        # The trace says what each catch-up was judged to buy, and only there.
        wait_idle(dec)
        caught = [r for r in records if r.catch_up_rows]
        assert caught and all(r.catch_up_gain > INVESTMENT_GAIN for r in caught)
        assert all(r.catch_up_gain == 0.0 for r in records if not r.catch_up_rows)
        sch.loop.step_trace = None
        draft_rows.clear()
        to_the_end = SamplingParams(temperature=1.0, seed=1, ignore_eos=True)
        brief = dec.generate(prompt_of(600), max_tokens=60, params=to_the_end)
        assert brief.stats.prompt_tokens >= 600 and brief.stats.tokens == 60
        assert not draft_rows and brief.stats.drafted == 0
        wait_idle(dec)  # only the given costs judge (not how the tiny model's steps ran on a busy machine)
        dec.policy.planner.realised.clear()
        dec.policy.planner.ledger.balances.clear()
        long = dec.generate(prompt_of(600), max_tokens=300, params=to_the_end)
        assert long.stats.tokens == 300 and long.stats.drafted > 0
        assert draft_rows[0] >= 450  # the whole lag (the prompt less the prefix cached) in one pass


@pytest.mark.parametrize("alpha, prompt_tokens", [(None, 5), (None, 100), (0.95, 5)])
def test_a_pair_without_a_measured_acceptance_probes_at_the_first_decoding_step(tiny_target, tiny_draft,
                                                                                  alpha, prompt_tokens) -> None:
    """Without an α from a calibration the pair's acceptance is a guess, and
    plans made on it can keep a good draft idle (planned at 0.7, drafting at
    two requests of the default pair looked no better than plain batching;
    measured, it was 1.4x): the first request that can draft probes at its
    first decoding step, its draft catching up first where the prompt is too
    long to take in within the step (> CATCH_UP_LIMIT), and again at steps
    that would not draft until the pair has EXPLORE_ROWS first rows.  That exploration buys knowledge for every later
    plan: it is not booked against drafting at its batch size (the drafting
    ledger).  With a measured α there is nothing to explore.  The costs
    (T(k) = 10 + 6(k − 1) ms, a draft row 1 ms) make drafting pay at 0.95
    but not at the guess: nothing but the exploration drafts first."""
    with _decoder_on_given_costs(tiny_target, tiny_draft, row_ms=6.0, max_sequences=1, alpha=alpha) as dec:
        sch = dec._scheduler
        records: list[StepRecord] = []
        sch.loop.step_trace = records.append
        booked = []
        observe = dec.policy.planner.observe_balance
        dec.policy.planner.observe_balance = lambda *a: (booked.append(a), observe(*a))[1]
        seeds = []  # (request, how many rows its acceptance starts as), in order of admission
        admit = sch._admit

        def admitting() -> None:
            admit()
            seeds.extend((r, r.plan.alpha.prior_rows) for r in sch.loop.active if not any(r is q for q, _ in seeds))
        sch._admit = admitting
        params = SamplingParams(temperature=1.0, seed=1, ignore_eos=True)
        words = "the quick brown fox and hello world it is of "
        prompt = words
        while len(dec.tokenizer.tokenize(prompt)) < prompt_tokens:
            prompt += words
        assert (len(dec.tokenizer.tokenize(prompt)) > CATCH_UP_LIMIT) == (prompt_tokens > CATCH_UP_LIMIT)
        for p in (prompt, PROMPTS[1]):
            dec.generate(p, max_tokens=24, params=params)
        wait_idle(dec)
    decoding = [r for r in records if r.gammas]
    explored = [r for r in decoding if any(r.probes)]
    if alpha is None:
        first = decoding.index(explored[0])
        # probes until the pair has EXPLORE_ROWS first rows (each one row), at steps that would not draft
        assert all(r.gammas == (PROBE_GAMMA,) for r in explored) and 1 <= len(explored) <= EXPLORE_ROWS
        catch_ups = [r.catch_up_rows for r in decoding[:first]]
        if prompt_tokens > CATCH_UP_LIMIT:  # its draft caught up first, in chunks
            assert catch_ups and all(catch_ups) and sum(catch_ups) > CATCH_UP_LIMIT
        else:
            assert first == 0
        assert dec.policy.pair_alpha.first_rows > 0
        assert len(booked) == len(decoding) - first - len(explored)
        assert [n for _, n in seeds] == [1.0, 2.0]  # the first request started from the guess, the second from rows
    else:
        assert not explored and len(booked) == len(decoding)
        assert [n for _, n in seeds] == [2.0, 2.0]


def test_decoding_steps_are_scored_against_their_plans(tiny_target, tiny_draft) -> None:
    """The planner learns how steps did against their plans from every step
    of decoding alone: the batch size, whether it drafted, the plan's rate
    and what it emitted (the prompt's step and the draft's catch-up are set
    aside)."""
    # The given costs decide every plan, so that the steps that catch the draft up and those that
    # draft are the same on a loaded machine.
    with _decoder_on_given_costs(tiny_target, tiny_draft, row_ms=0.5, max_sequences=2) as dec:
        sch = dec._scheduler
        seen = []
        observe = dec.policy.planner.observe_step
        dec.policy.planner.observe_step = lambda *a: (seen.append(a), observe(*a))[1]
        catching_up = []  # per decoding step: did the draft take in a catch-up chunk?
        plan = sch.loop._plan

        def recording_plan(decoding, prefill, joining):
            works, cands, catch_up, timed = plan(decoding, prefill, joining)
            if works:
                catching_up.append(bool(catch_up))
            return works, cands, catch_up, timed

        sch.loop._plan = recording_plan
        params = SamplingParams(temperature=1.0, seed=1)
        gen = dec.generate(PROMPTS[0], max_tokens=40, params=params)
        assert gen.stats.drafted > 0
        assert any(catching_up) and len(seen) == catching_up.count(False)  # catch-up steps are set aside
        assert {a[0] for a in seen} == {1}
        drafting = [a for a in seen if a[1]]
        assert drafting and all(a[2] > 0 and a[4] > 0 for a in seen)
        # Every token but the prompt step's first came from a scored step, bar the draft's catch-up steps.
        assert gen.stats.tokens - 8 <= sum(a[3] for a in seen) <= gen.stats.tokens - 1
        assert dec.policy.planner.realised[(1, True)].steps == len(drafting)
        seen.clear()
        plain = dec.generate(PROMPTS[1], max_tokens=20, params=params, gamma=0)
        assert seen and not any(a[1] for a in seen)
        assert sum(a[3] for a in seen) == plain.stats.tokens - 1


def test_a_step_trace_records_each_step_beside_its_plan(tiny_target, tiny_draft) -> None:
    records: list[StepRecord] = []
    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, max_sequences=2, n_ctx=256, n_threads=1,
                                  calibration=None, step_trace=records.append) as dec:
        gens = [dec.generate(p, max_tokens=20, params=SamplingParams(temperature=1.0, seed=3), gamma=3)
                for p in ("hello", "the quick brown fox")]
        wait_idle(dec)
    assert sum(r.emitted for r in records) == sum(len(g.tokens) for g in gens)
    drafting = [r for r in records if any(r.gammas)]
    assert drafting, "no step drafted at gamma=3"
    for r in drafting:
        assert r.routes == tuple("model" if g else None for g in r.gammas)
        assert [len(a) for a in r.alpha_hats] == list(r.gammas)
        # The verify reads rows up to the first rejection: the accepted ones and the one rejected.
        assert all(min(n + 1, g) == len(a) for n, g, a in zip(r.accepted, r.gammas, r.alphas))
        assert r.planned_rate > 0 and r.plain_rate > 0 and r.seconds > 0
        assert len(r.target_passes) == 1 and r.target_passes[0][0] == sum(r.gammas) + len(r.gammas) + r.prompt_rows
        assert len(r.draft_passes) >= max(r.gammas)
        assert all(ms > 0 and predicted > 0 for _, ms, predicted in r.target_passes + r.draft_passes)
    assert {"gammas", "plain_rate", "target_passes"} <= set(drafting[0].to_dict())


def test_a_failing_step_trace_is_dropped_not_the_decoder(tiny_target, tiny_draft) -> None:
    def broken(record: StepRecord) -> None:
        raise RuntimeError("trace sink full")

    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, max_sequences=1, n_ctx=256, n_threads=1,
                                  step_trace=broken) as dec:
        assert len(dec.generate("hello", max_tokens=8, params=GREEDY).tokens) > 0
        assert dec.healthy
