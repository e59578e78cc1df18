"""One decoder shared by threads, and a DecoderPool: parallel requests give
exactly the outputs of the same requests run one by one."""

from __future__ import annotations

import threading
import time

import pytest
from synthetic import ByteTokenizer, MarkovLM

from specdec_cpu import (
    SamplingParams,
    SpeculativeDecoder,
)

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
