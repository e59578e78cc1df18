"""Churn: 1,000 requests joining and leaving a BatchedDecoder at random steps.

Some are cancelled (by their event, by a timeout, or by closing their
stream), some carry bad input; every good request must complete correctly,
no sequence slot may leak, and the process's memory must stay flat.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from batched_helpers import assert_greedy_equal, wait_idle

from specdec_cpu import (
    BatchedDecoder,
    ContextOverflowError,
    GenerationCancelled,
    InvalidPromptError,
    SamplingParams,
)

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = ["the quick brown fox", "hello world", "def return print", "and the", "it is of",
           "with that for", "in the world", "hello and", "the world is the world is", "print hello"]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_a_thousand_requests_come_and_go(tiny_target, tiny_draft) -> None:
    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, ngram=True, max_sequences=4, n_ctx=512,
                                  n_threads=1, seed=3, max_queue=10_000) as dec:
        ids = {p: dec.tokenize(p) for p in PROMPTS}
        want = {p: dec.generate(p, max_tokens=16, params=GREEDY).tokens for p in PROMPTS}  # alone
        from specdec_cpu import engine

        w = engine.LlamaWeights(tiny_target)
        ref_ctx = engine.LlamaContext(w, n_ctx=512, n_threads=1)
        outcomes: dict[str, int] = {}
        lock = threading.Lock()
        failures: list[str] = []

        def tally(kind: str) -> None:
            with lock:
                outcomes[kind] = outcomes.get(kind, 0) + 1

        def one(i: int) -> None:
            r = random.Random(i)
            kind = r.choices(["greedy", "sampled", "cancel", "timeout", "close", "bad"],
                             weights=[40, 20, 10, 10, 10, 10])[0]
            p = r.choice(PROMPTS)
            time.sleep(r.random() * 0.01)  # arrive at a random step
            try:
                if kind == "greedy":
                    gen = dec.generate(p, max_tokens=16, params=GREEDY, gamma=r.choice(["auto", 0, 2, 5]))
                    assert_greedy_equal(gen.tokens, want[p], ids[p], ref_ctx, what=f"request {i} ({p!r})")
                elif kind == "sampled":
                    gen = dec.generate(p, max_tokens=r.randint(1, 24),
                                       params=SamplingParams(temperature=r.choice([0.5, 1.0, 1.5]),
                                                             top_k=r.choice([0, 5]), top_p=r.choice([1.0, 0.8])))
                    assert gen.finish_reason in ("length", "stop") and 0 <= len(gen.tokens) <= 24
                elif kind == "cancel":
                    ev = threading.Event()
                    threading.Timer(r.random() * 0.02, ev.set).start()
                    try:
                        dec.generate(p, max_tokens=400, params=SamplingParams(temperature=1.0), cancel=ev)
                    except GenerationCancelled as exc:
                        assert exc.reason == "cancelled"
                elif kind == "timeout":
                    try:
                        dec.generate(p, max_tokens=400, params=SamplingParams(temperature=1.0),
                                     timeout=0.001 + r.random() * 0.02)
                    except GenerationCancelled as exc:
                        assert exc.reason == "timeout"
                elif kind == "close":
                    s = dec.stream(p, max_tokens=400, params=SamplingParams(temperature=1.0))
                    for _, _piece in zip(range(r.randint(0, 5)), s):
                        pass
                    s.close()
                    assert s.result is not None
                else:
                    bad = r.choice(["", [1, 10**6], [5] * 600, "ok"])
                    with pytest.raises((InvalidPromptError, ContextOverflowError, ValueError, TypeError)):
                        if bad == "ok":
                            dec.generate("fine", max_tokens=4, params={"temperature": 1})  # type: ignore
                        else:
                            dec.generate(bad, max_tokens=4)
                tally(kind)
            except BaseException as exc:  # collected: a thread's assertion must fail the test
                with lock:
                    failures.append(f"request {i} ({kind}): {exc!r}")

        for i in range(100):  # warm up the allocator before measuring memory
            one(10_000 + i)
        wait_idle(dec)
        rss_before = rss_bytes()
        with ThreadPoolExecutor(12) as pool:
            list(pool.map(one, range(1000)))
        wait_idle(dec)
        rss_after = rss_bytes()
        assert not failures, "\n".join(failures[:10])
        assert sum(outcomes.values()) == 1100
        m = dec.metrics()
        assert m.active_sequences == 0 and m.queue_depth == 0
        assert dec._scheduler.loop.slots.n_free == dec.max_sequences, "a sequence slot leaked"
        assert m.requests["cancelled"] + m.requests["timeout"] >= outcomes.get("cancel", 0) // 2
        # Still healthy: a request now gives what it gave alone at the start.
        assert_greedy_equal(dec.generate(PROMPTS[0], max_tokens=16, params=GREEDY).tokens, want[PROMPTS[0]],
                            ids[PROMPTS[0]], ref_ctx)
        w.close()
    growth = rss_after - rss_before
    print(f"outcomes {outcomes}; decoder counted {m.requests}; RSS growth {growth / 2**20:.2f} MiB")
    assert growth < 16 * 2**20, f"resident memory grew by {growth / 2**20:.1f} MiB over 1,000 requests"
