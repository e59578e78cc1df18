"""One decoder shared by threads, and a DecoderPool: parallel requests give
exactly the outputs of the same requests run one by one."""

from __future__ import annotations

import threading
import time

import pytest

from specdec_cpu import (
    DecoderPool,
    GenerationCancelled,
    InvalidPromptError,
    SamplingParams,
    SpeculativeDecoder,
)
from specdec_cpu.engine import context as context_mod
from synthetic import ByteTokenizer, MarkovLM

THREADS, PER_THREAD = 8, 5
LOAD = {"gamma": 3, "n_ctx": 256, "n_threads": 1, "seed": 0}


def requests(n=THREADS * PER_THREAD):
    """n different requests.  Their prompts start with distinct ids, so no
    request reuses another's cache and every batch llama.cpp decodes is the
    same whatever ran before (batched and one-row logits differ in the last
    bits, which could change a sample)."""
    kinds = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9),
             SamplingParams(temperature=0.0), SamplingParams(temperature=1.2, top_k=40, min_p=0.02)]
    out = []
    for i in range(n):
        p = kinds[i % len(kinds)]
        params = SamplingParams(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p,
                                min_p=p.min_p, seed=1000 + i)
        prompt = [20 + i, 7 + i % 5, 100 + 3 * i, 9]
        out.append((prompt, {"max_tokens": 12 + i % 13, "params": params}))
    return out


def run_threads(call, reqs, threads=THREADS):
    """Run ``call(prompt, kwargs)`` for every request from ``threads`` threads
    (each thread takes requests i, i + threads, ...); results in order."""
    results = [None] * len(reqs)
    start = threading.Barrier(threads)
    errors = []

    def worker(k):
        start.wait()
        try:
            for i in range(k, len(reqs), threads):
                results[i] = call(*reqs[i])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errors, errors
    return results


@pytest.fixture(scope="module")
def reference(tiny_target, tiny_draft):
    """The requests run one by one on a fresh decoder."""
    dec = SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, **LOAD)
    return [dec.generate(p, **kw).tokens for p, kw in requests()]


# ---------------------------------------------------------------------------
# one decoder, several threads
# ---------------------------------------------------------------------------


class ExclusiveLM(MarkovLM):
    """Fails if two calls overlap (a sleep widens the window)."""

    def __init__(self, *args, pause: float = 0.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.pause = pause
        self.busy = False
        self.overlaps = 0

    def eval(self, tokens, n_logits=1):
        if self.busy:
            self.overlaps += 1
        self.busy = True
        try:
            if self.pause:
                time.sleep(self.pause)
            return super().eval(tokens, n_logits)
        finally:
            self.busy = False


def test_shared_synthetic_decoder_serialises_requests() -> None:
    def make(pause=0.0):
        return SpeculativeDecoder(ExclusiveLM(8, order=2, seed=1, pause=pause), ByteTokenizer(),
                                  ExclusiveLM(8, order=2, seed=2, pause=pause), gamma=3, seed=0)

    reqs = [([i % 8, (i + 3) % 8], {"max_tokens": 15, "params": SamplingParams(seed=i)}) for i in range(40)]
    one = make()
    want = [one.generate(p, **kw).tokens for p, kw in reqs]
    shared = make(pause=0.0002)
    got = run_threads(lambda p, kw: shared.generate(p, **kw).tokens, reqs)
    assert got == want
    assert shared.target.overlaps == 0 and shared.draft.overlaps == 0


def test_shared_gguf_decoder_from_threads(tiny_target, tiny_draft, reference) -> None:
    dec = SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, **LOAD)
    got = run_threads(lambda p, kw: dec.generate(p, **kw).tokens, requests())
    assert got == reference


def test_shared_decoder_streams_from_threads(tiny_target, tiny_draft, reference) -> None:
    dec = SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, **LOAD)

    def call(p, kw):
        stream = dec.stream(p, **kw)
        text = "".join(stream)
        assert text == stream.result.text
        return stream.result.tokens

    reqs = requests()[:16]
    assert run_threads(call, reqs) == reference[:16]


# ---------------------------------------------------------------------------
# DecoderPool
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pool(tiny_target, tiny_draft):
    with DecoderPool(4, tiny_target, tiny_draft, **LOAD) as p:
        yield p


def test_pool_shares_one_model(pool) -> None:
    decs = pool._decoders
    assert pool.size == 4 and len(decs) == 4
    assert len({id(d.target.weights) for d in decs}) == 1
    assert len({id(d.draft.weights) for d in decs}) == 1
    assert len({id(d.target) for d in decs}) == 4  # a context each
    assert pool.tokenizer.n_vocab == decs[0].target.n_vocab


def test_pool_generate_from_threads(pool, reference) -> None:
    got = run_threads(lambda p, kw: pool.generate(p, **kw).tokens, requests())
    assert got == reference


def test_pool_stream_and_acquire_from_threads(pool, reference) -> None:
    def call(p, kw):
        if p[0] % 2:
            with pool.stream(p, **kw) as stream:
                "".join(stream)
            return stream.result.tokens
        with pool.acquire() as dec:
            return dec.generate(p, **kw).tokens

    assert run_threads(call, requests()) == reference


def test_pool_runs_requests_in_parallel(pool, monkeypatch) -> None:
    """llama_decode releases the GIL: several contexts decode at once."""
    real = context_mod.lib.llama_decode
    state = {"now": 0, "max": 0}
    guard = threading.Lock()

    def counting(*args):
        with guard:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        try:
            time.sleep(0.002)
            return real(*args)
        finally:
            with guard:
                state["now"] -= 1

    monkeypatch.setattr(context_mod.lib, "llama_decode", counting)
    run_threads(lambda p, kw: pool.generate(p, **kw), requests(8), threads=4)
    assert state["max"] >= 2


def test_pool_waiting_honours_timeout_and_cancel(tiny_target) -> None:
    with DecoderPool(1, tiny_target, None, gamma=0, n_ctx=64, n_threads=1) as small:
        with small.acquire() as held:
            assert isinstance(held, SpeculativeDecoder)
            t0 = time.perf_counter()
            with pytest.raises(GenerationCancelled) as info:
                small.generate("hello", max_tokens=4, timeout=0.15)
            assert info.value.reason == "timeout" and info.value.partial.tokens == []
            assert 0.15 <= time.perf_counter() - t0 < 2.0
            with pytest.raises(TimeoutError):
                with small.acquire(timeout=0.05):
                    pass
            cancel = threading.Event()
            threading.Timer(0.1, cancel.set).start()
            stream = small.stream("hello", max_tokens=4, cancel=cancel)
            assert list(stream) == [] and stream.result.finish_reason == "cancelled"
        assert len(small.generate("hello", max_tokens=4).tokens) == 4


def test_pool_gives_decoders_back(tiny_target) -> None:
    with DecoderPool(1, tiny_target, None, gamma=0, n_ctx=64, n_threads=1) as small:
        stream = small.stream("hello", max_tokens=30)
        next(stream)
        assert small._idle.qsize() == 0
        del stream  # dropped mid-way: the decoder is back at once
        assert small._idle.qsize() == 1
        with small.acquire() as dec:
            s = dec.stream("hello", max_tokens=30)
            next(s)  # left open: closed when the decoder is given back
        assert small._idle.qsize() == 1 and s.result.finish_reason == "cancelled"
        with pytest.raises(InvalidPromptError):  # checked before taking a decoder
            small.generate("")
        with pytest.raises(TypeError, match="max_token"):
            small.generate("hello", max_token=3)
        assert len(small.generate("hello", max_tokens=3).tokens) == 3


def test_pool_close_waits_for_requests(tiny_target) -> None:
    small = DecoderPool(2, tiny_target, None, gamma=0, n_ctx=64, n_threads=1)
    taken, release, used = threading.Event(), threading.Event(), []

    def borrower():
        with small.acquire() as dec:
            taken.set()
            release.wait(5)
            used.append(dec.generate("hello", max_tokens=3).tokens)  # still works while closing
            used.append(dec)

    t = threading.Thread(target=borrower)
    t.start()
    assert taken.wait(5)
    closer = threading.Thread(target=small.close)
    closer.start()
    time.sleep(0.1)
    assert closer.is_alive() and small.closed  # waiting for the borrowed decoder
    with pytest.raises(ValueError, match="closed"):
        small.generate("hello")
    with pytest.raises(ValueError, match="closed"):
        with small.acquire():
            pass
    release.set()
    t.join(5)
    closer.join(5)
    assert not closer.is_alive() and len(used[0]) == 3
    assert used[1].target.closed  # contexts and weights freed once every decoder was back
    small.close()  # idempotent


def test_tokenizer_shared_by_threads(tiny_target) -> None:
    """Token pieces are fetched with the GIL released: threads filling the
    piece cache of one tokenizer at once must not mix their bytes up."""
    from specdec_cpu.engine import LlamaTokenizer, LlamaWeights

    with LlamaWeights(tiny_target) as w:
        want = [LlamaTokenizer(w).token_bytes(i) for i in range(w.n_vocab)]
        for _ in range(5):
            tok = LlamaTokenizer(w)
            start = threading.Barrier(4)

            def fill(k, tok=tok, start=start):
                start.wait()
                for i in list(range(k, w.n_vocab, 4)) + list(range(w.n_vocab)):
                    tok.token_bytes(i)

            threads = [threading.Thread(target=fill, args=(k,)) for k in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert [tok.token_bytes(i) for i in range(w.n_vocab)] == want
