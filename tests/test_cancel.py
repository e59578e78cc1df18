"""Stopping a generation early: closing a stream, a cancel event, a timeout,
a KeyboardInterrupt inside a step.  After any stop the caches are consistent
and the next request gives exactly what a fresh decoder gives."""

from __future__ import annotations

import threading
import time

import pytest
from synthetic import ByteTokenizer, MarkovLM

from specdec_cpu import GenerationCancelled, SamplingParams, SpeculativeDecoder
from specdec_cpu.engine import LlamaContext
from specdec_cpu.engine import context as context_mod

V = 8
T1 = SamplingParams(temperature=1.0, seed=11)


class HookedLM(MarkovLM):
    """A Markov model that calls ``hook(call_index, self)`` before each eval
    and ``truncate_hook(self)`` after each truncate."""

    def __init__(self, *args, hook=None, truncate_hook=None, n_batch=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hook, self.truncate_hook = hook, truncate_hook
        self.calls = 0
        if n_batch is not None:
            self.n_batch = n_batch

    def eval(self, tokens, n_logits=1):
        i, self.calls = self.calls, self.calls + 1
        if self.hook is not None:
            self.hook(i, self, tokens)
        return super().eval(tokens, n_logits)

    def truncate(self, n):
        super().truncate(n)
        if self.truncate_hook is not None:
            self.truncate_hook(self)


def make(target_kw=None, draft_kw=None, gamma=3):
    target = HookedLM(V, order=2, seed=1, **(target_kw or {}))
    draft = HookedLM(V, order=2, seed=2, **(draft_kw or {}))
    return SpeculativeDecoder(target, ByteTokenizer(), draft, gamma=gamma, seed=0)


def fresh(prompt, max_tokens=30, params=T1, gamma=3):
    return make(gamma=gamma).generate(prompt, max_tokens=max_tokens, params=params).tokens


def consistent(dec) -> bool:
    """Each model holds exactly the tokens its mirror says."""
    lms = [lm for lm in (dec._target_lm, dec._draft_lm) if lm is not None]
    return all(lm.model.n_past == len(lm.tokens(0)) and lm.model.tokens == lm.tokens(0) for lm in lms)


def lock_is_free(dec) -> bool:
    if dec._lock.acquire(blocking=False):
        dec._lock.release()
        return True
    return False


# ---------------------------------------------------------------------------
# streams
# ---------------------------------------------------------------------------


def test_stream_close_stops_at_once_and_reports() -> None:
    dec = make()
    stream = dec.stream([1, 2], max_tokens=200, params=T1)
    pieces = [next(stream) for _ in range(3)]
    evals = dec.target.calls
    stream.close()
    assert dec.target.calls == evals  # nothing ran after close
    assert stream.result.finish_reason == "cancelled" and "".join(pieces) == stream.result.text
    assert consistent(dec) and lock_is_free(dec)
    assert dec.generate([5, 6], max_tokens=30, params=T1).tokens == fresh([5, 6])


def test_consumer_that_stops_iterating_releases_the_decoder() -> None:
    dec = make()
    stream = dec.stream([1, 2], max_tokens=200, params=T1)
    for _ in stream:
        break
    assert not lock_is_free(dec)  # a suspended stream holds the decoder...
    del stream  # no garbage collection needed: the decoder is free at once
    assert lock_is_free(dec) and consistent(dec)  # ...until it is dropped
    out = []
    t = threading.Thread(target=lambda: out.append(dec.generate([5, 6], max_tokens=30, params=T1).tokens))
    t.start()
    t.join(10)
    assert out == [fresh([5, 6])]


def test_stream_as_context_manager_and_closed_before_start() -> None:
    dec = make()
    with dec.stream([1, 2], max_tokens=100, params=T1) as stream:
        next(stream)
    assert stream.result.finish_reason == "cancelled" and lock_is_free(dec)
    unstarted = dec.stream([1, 2], max_tokens=100, params=T1)
    unstarted.close()
    assert unstarted.result.finish_reason == "cancelled" and unstarted.result.tokens == []
    assert dec.generate([5, 6], max_tokens=30, params=T1).tokens == fresh([5, 6])


# ---------------------------------------------------------------------------
# cancel events
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("at_call", [1, 2, 5])
def test_cancel_stops_within_one_step(at_call) -> None:
    """The event is set during the target pass of step `at_call` (call 0 is
    the prompt): that step finishes, no other starts."""
    cancel = threading.Event()

    def hook(i, model, tokens):
        if i == at_call:
            cancel.set()

    dec = make(target_kw={"hook": hook})
    full = fresh([1, 2, 3], max_tokens=100)
    with pytest.raises(GenerationCancelled) as info:
        dec.generate([1, 2, 3], max_tokens=100, params=T1, cancel=cancel)
    part = info.value.partial
    assert info.value.reason == "cancelled" and part.finish_reason == "cancelled"
    assert "cancel" in str(info.value)
    assert part.stats.steps == at_call and dec.target.calls == at_call + 1
    assert part.tokens == full[: len(part.tokens)] and 0 < len(part.tokens) <= at_call * 4
    assert consistent(dec)
    assert dec.generate([4, 5], max_tokens=30, params=T1).tokens == fresh([4, 5])


def test_cancel_in_a_stream_ends_it_quietly() -> None:
    cancel = threading.Event()
    dec = make()
    stream = dec.stream([1, 2], max_tokens=200, params=T1, cancel=cancel)
    next(stream)
    cancel.set()
    rest = list(stream)  # no exception
    assert len("".join(rest)) <= dec.gamma + 1
    assert stream.result.finish_reason == "cancelled"
    assert dec.generate([4, 5], max_tokens=30, params=T1).tokens == fresh([4, 5])


def test_cancel_set_before_the_call() -> None:
    cancel = threading.Event()
    cancel.set()
    dec = make()
    with pytest.raises(GenerationCancelled) as info:
        dec.generate([1, 2, 3], params=T1, cancel=cancel)
    assert info.value.partial.tokens == [] and dec.target.calls == 0
    stream = dec.stream([1, 2, 3], params=T1, cancel=cancel)
    assert list(stream) == [] and stream.result.finish_reason == "cancelled"


def test_cancel_from_another_thread() -> None:
    dec = make(target_kw={"hook": lambda i, m, t: time.sleep(0.01)})
    cancel = threading.Event()
    timer = threading.Timer(0.15, cancel.set)
    timer.start()
    t0 = time.perf_counter()
    with pytest.raises(GenerationCancelled) as info:
        dec.generate([1, 2], max_tokens=10_000, params=T1, cancel=cancel)
    assert time.perf_counter() - t0 < 2.0
    assert info.value.partial.stats.tokens > 0
    assert consistent(dec)


def test_a_stream_closed_from_another_thread_stops_at_its_next_step() -> None:
    """A UI's stop button: close() from a thread other than the reader's."""
    dec = make(target_kw={"hook": lambda i, m, t: time.sleep(0.01)})
    stream = dec.stream([1, 2], max_tokens=10_000, params=T1)
    pieces = []
    reader = threading.Thread(target=lambda: pieces.extend(stream))
    reader.start()
    time.sleep(0.15)
    stream.close()  # the reader is inside next(): it may not be closed under it
    reader.join(5)
    assert not reader.is_alive() and stream.result.finish_reason == "cancelled" and pieces
    assert consistent(dec)
    assert dec.generate([1, 2], max_tokens=5, params=T1).tokens  # the decoder is free again


def test_a_stream_handed_to_another_thread_is_not_ended_by_the_first() -> None:
    """A stream started on one thread and read on by another: the first thread's
    next call waits for it instead of taking it for one it left suspended."""
    dec = make(target_kw={"hook": lambda i, m, t: time.sleep(0.005)})
    stream = dec.stream([1, 2], max_tokens=60, params=T1)
    pieces = [next(stream)]
    reader = threading.Thread(target=lambda: pieces.extend(stream))
    reader.start()
    time.sleep(0.05)
    assert dec.generate([1, 2], max_tokens=5, params=T1).finish_reason == "length"
    reader.join(10)
    assert stream.result.finish_reason == "length" and len(stream.result.tokens) == 60
    assert consistent(dec)


def test_cancel_between_prompt_batches() -> None:
    """A long prompt is processed a batch at a time, checking in between."""
    cancel = threading.Event()

    def hook(i, model, tokens):
        if i == 0:
            cancel.set()
            time.sleep(0.05)

    dec = make(target_kw={"hook": hook, "n_batch": 4})
    prompt = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
    with pytest.raises(GenerationCancelled) as info:
        dec.generate(prompt, max_tokens=50, params=T1, cancel=cancel)
    stats = info.value.partial.stats
    assert stats.steps == 0
    # Its time went to the prompt: none of it is decoding time (a chat's /stats, the session's tok/s).
    assert stats.prompt_seconds == stats.total_seconds >= 0.05 and stats.decode_seconds == 0.0
    assert dec.target.calls == 1 and dec.target.n_past == 4 and consistent(dec)
    assert dec.generate(prompt, max_tokens=30, params=T1).tokens == fresh(prompt)


# ---------------------------------------------------------------------------
# timeouts
# ---------------------------------------------------------------------------


def test_timeout_generate_and_stream() -> None:
    dec = make(target_kw={"hook": lambda i, m, t: time.sleep(0.01)})
    t0 = time.perf_counter()
    with pytest.raises(GenerationCancelled) as info:
        dec.generate([1, 2], max_tokens=10_000, params=T1, timeout=0.2)
    elapsed = time.perf_counter() - t0
    assert 0.2 <= elapsed < 2.0
    assert info.value.reason == "timeout" and info.value.partial.finish_reason == "timeout"
    assert "timeout" in str(info.value) and info.value.partial.stats.tokens > 0
    stream = dec.stream([1, 2], max_tokens=10_000, params=T1, timeout=0.2)
    text = "".join(stream)
    assert stream.result.finish_reason == "timeout" and text == stream.result.text
    assert consistent(dec)
    dec.target.hook = None
    assert dec.generate([4, 5], max_tokens=30, params=T1).tokens == fresh([4, 5])


def test_finished_within_timeout_returns_normally() -> None:
    dec = make()
    gen = dec.generate([1, 2], max_tokens=20, params=T1, timeout=30.0)
    assert gen.finish_reason == "length" and gen.tokens == fresh([1, 2], max_tokens=20)


@pytest.mark.parametrize("how", ["timeout", "cancelled"])
def test_waiting_for_a_busy_decoder_honours_timeout_and_cancel(how) -> None:
    """A stream suspended in one thread holds the decoder; a request from
    another thread gives up on its timeout or cancel instead of hanging."""
    dec = make()
    held = dec.stream([1, 2], max_tokens=100, params=T1)
    next(held)
    result = {}
    cancel = threading.Event()

    def request():
        t0 = time.perf_counter()
        try:
            if how == "timeout":
                dec.generate([4, 5], max_tokens=5, params=T1, timeout=0.2)
            else:
                dec.generate([4, 5], max_tokens=5, params=T1, cancel=cancel)
        except GenerationCancelled as exc:
            result["exc"] = exc
        result["seconds"] = time.perf_counter() - t0

    t = threading.Thread(target=request)
    t.start()
    if how == "cancelled":
        time.sleep(0.2)
        cancel.set()
    t.join(5)
    assert not t.is_alive()
    exc = result["exc"]
    assert exc.reason == how and exc.partial.tokens == []
    assert result["seconds"] < 2.0
    held.close()
    # Both ended requests count, the one that never got the decoder included; so does a stream closed unstarted.
    unstarted = dec.stream([6, 7], max_tokens=5, params=T1)
    unstarted.close()
    counts = dec.metrics().requests  # the waiting one (as ``how``), the held one and the unstarted one (cancelled)
    assert (counts["timeout"], counts["cancelled"]) == ((1, 2) if how == "timeout" else (0, 3)), counts
    assert dec.generate([4, 5], max_tokens=30, params=T1).tokens == fresh([4, 5])


# ---------------------------------------------------------------------------
# KeyboardInterrupt inside a step
# ---------------------------------------------------------------------------


def _interrupt_once(at_call, *, after=False):
    """An eval hook raising KeyboardInterrupt at one call; with ``after`` the
    model has already taken the tokens (state changed, mirror not)."""
    def hook(i, model, tokens):
        if i == at_call:
            if after:
                model.tokens.extend(tokens)
            raise KeyboardInterrupt
    return hook


@pytest.mark.parametrize("where", ["target", "draft"])
@pytest.mark.parametrize("at_call", [0, 1, 3])
@pytest.mark.parametrize("after", [False, True])
def test_keyboard_interrupt_in_eval(where, at_call, after) -> None:
    hook = _interrupt_once(at_call, after=after)
    dec = make(target_kw={"hook": hook}) if where == "target" else make(draft_kw={"hook": hook})
    with pytest.raises(KeyboardInterrupt):
        dec.generate([1, 2, 3], max_tokens=60, params=T1)
    assert consistent(dec) and lock_is_free(dec)
    assert dec.generate([1, 2, 3], max_tokens=40, params=T1).tokens == fresh([1, 2, 3], max_tokens=40)
    assert dec.generate([4, 5], max_tokens=30, params=T1).tokens == fresh([4, 5])


def test_keyboard_interrupt_inside_a_cache_truncation() -> None:
    """The model truncated, the cache's mirror not yet cut: the decoder must
    cut the mirror rather than trust it."""
    state = {"armed": True}

    def truncate_hook(model):
        if state["armed"] and model.n_past > 0:
            state["armed"] = False
            raise KeyboardInterrupt

    dec = make(target_kw={"truncate_hook": truncate_hook})
    with pytest.raises(KeyboardInterrupt):
        dec.generate([1, 2, 3], max_tokens=60, params=T1)
    assert not state["armed"] and consistent(dec)
    assert dec.generate([1, 2, 3], max_tokens=40, params=T1).tokens == fresh([1, 2, 3], max_tokens=40)


def test_keyboard_interrupt_in_a_stream() -> None:
    dec = make(target_kw={"hook": _interrupt_once(4)})
    stream = dec.stream([1, 2], max_tokens=100, params=T1)
    with pytest.raises(KeyboardInterrupt):
        for _ in stream:
            pass
    assert consistent(dec) and lock_is_free(dec)
    assert dec.generate([4, 5], max_tokens=30, params=T1).tokens == fresh([4, 5])


# ---------------------------------------------------------------------------
# the same on llama.cpp contexts
# ---------------------------------------------------------------------------


@pytest.fixture
def gguf_pair(tiny_target, tiny_draft):
    def load():
        return SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, gamma=3, n_ctx=256, n_threads=1, seed=0)
    return load


# Token-id prompts with distinct first ids share no cached prefix, so a
# used decoder decodes them in the same batches as a fresh one.
FIRST = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51]
AFTER = [60, 61, 62, 63, 64, 65]


def test_gguf_stop_paths_leave_the_decoder_exact(gguf_pair) -> None:
    want = gguf_pair().generate(AFTER, max_tokens=40, params=T1).tokens
    dec = gguf_pair()
    # close a stream
    stream = dec.stream(FIRST, max_tokens=100, params=T1)
    next(stream)
    next(stream)
    stream.close()
    assert dec.generate(AFTER, max_tokens=40, params=T1).tokens == want
    # a cancel event
    cancel = threading.Event()
    stream = dec.stream(FIRST, max_tokens=100, params=T1, cancel=cancel)
    next(stream)
    cancel.set()
    list(stream)
    assert dec.generate(AFTER, max_tokens=40, params=T1).tokens == want
    # a timeout too short for the request (each llama_decode slowed down)
    real = context_mod.lib.llama_decode

    def slow(*args):
        time.sleep(0.005)
        return real(*args)

    context_mod.lib.llama_decode = slow
    try:
        with pytest.raises(GenerationCancelled) as info:
            dec.generate(FIRST, max_tokens=100_000, params=T1, timeout=0.1)
    finally:
        context_mod.lib.llama_decode = real
    assert info.value.partial.finish_reason == "timeout" and info.value.partial.stats.steps > 0
    assert dec.generate(AFTER, max_tokens=40, params=T1).tokens == want
    for lm in (dec._target_lm, dec._draft_lm):
        assert lm.model.tokens == lm.tokens(0)


def test_gguf_keyboard_interrupt_in_decode_and_truncate(gguf_pair, monkeypatch) -> None:
    want = gguf_pair().generate(AFTER, max_tokens=40, params=T1).tokens
    dec = gguf_pair()
    lib = context_mod.lib
    for name in ("llama_decode", "llama_memory_seq_rm"):
        real = getattr(lib, name)
        calls = {"n": 0}

        def flaky(*args, _real=real, _calls=calls):
            _calls["n"] += 1
            if _calls["n"] == 6:
                raise KeyboardInterrupt
            return _real(*args)

        monkeypatch.setattr(lib, name, flaky)
        with pytest.raises(KeyboardInterrupt):
            dec.generate(FIRST, max_tokens=200, params=T1)
        monkeypatch.setattr(lib, name, real)
        assert calls["n"] >= 6, name
        for lm in (dec._target_lm, dec._draft_lm):
            assert lm.model.tokens == lm.tokens(0)
        assert dec.generate(AFTER, max_tokens=40, params=T1).tokens == want, name


def test_gguf_context_repairs_an_interrupted_truncate(tiny_target) -> None:
    """Ids forgotten but cells not yet freed (an interrupt between the two):
    the next eval frees them instead of failing."""
    from specdec_cpu.engine import LlamaWeights

    with LlamaWeights(tiny_target) as w:
        ctx = LlamaContext(w, n_ctx=64, n_batch=32, n_threads=1, kv_type="f32")
        want = ctx.eval([5, 6, 7, 8, 9], 1).copy()
        ctx.truncate(0)
        ctx.eval([5, 6, 7, 20, 21, 22], 1)
        ctx._dirty = True  # the state truncate(3) leaves when interrupted mid-way
        del ctx._tokens[3:]
        got = ctx.eval([8, 9], 1)
        assert ctx.n_past == 5
        assert abs(got - want).max() < 1e-4
