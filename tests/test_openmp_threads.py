"""A thread that stops decoding gives back llama.cpp's OpenMP workers
(engine/openmp.py): otherwise every thread that once ran a 2-thread pass
keeps a worker, and once they outnumber the CPUs libgomp makes every pass
in the process sleep at its barriers instead of spinning.

The workers are counted as the process's threads (/proc/self/task): a
2-thread pass run on a thread with no pool adds one.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

import pytest
from batched_helpers import wait_idle

from specdec_cpu import BatchedDecoder, SamplingParams, SpeculativeDecoder
from specdec_cpu.engine import LlamaContext, LlamaWeights, openmp

pytestmark = [
    pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc"),
    pytest.mark.skipif(openmp._libgomp_pause() is None, reason="this llama.cpp build does not run on libgomp"),
]

GREEDY = SamplingParams(temperature=0.0)


def _threads() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def _on_a_thread(fn: Callable[[], None]) -> set[str]:
    """Run ``fn`` on a new thread that stays alive afterwards; the threads it
    left behind (besides itself) while that thread still lives."""
    done, leave = threading.Event(), threading.Event()
    error: list[BaseException] = []

    def body() -> None:
        try:
            fn()
        except BaseException as exc:  # reported by the caller
            error.append(exc)
        done.set()
        leave.wait(30)

    before = _threads()
    t = threading.Thread(target=body)
    t.start()
    assert done.wait(60)
    left = _threads() - before - {str(t.native_id)}
    leave.set()
    t.join()
    if error:
        raise error[0]
    return left


def test_a_two_thread_pass_leaves_a_worker_that_release_gives_back(tiny_target) -> None:
    """The mechanism itself: without release_threads the worker stays; with it, it goes."""
    w = LlamaWeights(tiny_target)
    try:
        ctx = LlamaContext(w, n_ctx=64, n_batch=16, n_threads=2)
        try:
            left = _on_a_thread(lambda: ctx.eval([1, 2, 3], 1))
            assert len(left) == 1, "a 2-thread pass on a new thread adds one OpenMP worker"

            def pass_then_release() -> None:
                ctx.truncate(0)
                ctx.eval([1, 2, 3], 1)
                assert openmp.release_threads()

            left = _on_a_thread(pass_then_release)
            assert left == set()
        finally:
            ctx.close()
    finally:
        w.close()


def test_an_idle_batched_decoder_holds_no_worker(tiny_target, tiny_draft, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SPECDEC_CALIBRATION_DIR", str(tmp_path))  # the first-use timing runs here
    before = _threads()
    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, max_sequences=2, n_ctx=512, n_threads=2,
                                  calibration="auto", seed=1) as dec:
        assert list(tmp_path.iterdir()), "the calibration ran (on this thread)"
        scheduler = _threads() - before
        assert len(scheduler) == 1, "after from_gguf: the scheduler's thread only, no worker of the calibration"
        for p in ("hello world", "the quick brown fox"):
            dec.generate(p, max_tokens=12, params=GREEDY)
        dec.generate("and the", max_tokens=12, params=GREEDY)
        # The scheduler releases its workers before it waits for work.
        wait_idle(dec)
        deadline = time.monotonic() + 30  # generous: a loaded CI machine may be slow to step
        while _threads() - before != scheduler and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _threads() - before == scheduler


def test_a_speculative_decoders_caller_keeps_no_worker(tiny_target, tiny_draft) -> None:
    with SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, n_ctx=128, n_threads=2, seed=1,
                                      calibration=None) as dec:
        left = _on_a_thread(lambda: dec.generate("hello world", max_tokens=12, params=GREEDY))
        assert left == set()

        def streamed() -> None:
            assert "".join(dec.stream("the quick brown fox", max_tokens=12, params=GREEDY)) is not None

        left = _on_a_thread(streamed)
        assert left == set()
