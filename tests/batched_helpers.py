"""Helpers shared by the BatchedDecoder tests."""

from __future__ import annotations

import threading
import time
from typing import Callable, Sequence

import numpy as np
import pytest

from specdec_cpu import BatchedDecoder
from specdec_cpu.engine import LlamaContext


def wait_idle(dec: BatchedDecoder, timeout: float = 30.0) -> None:
    """Wait until no request is active or queued (a slot is freed at the end
    of the step that ended its request, which may be after the caller woke)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        m = dec.metrics()
        if m.active_sequences == 0 and m.queue_depth == 0:
            return
        time.sleep(0.01)
    raise AssertionError(f"decoder not idle after {timeout} s: {dec.metrics()}")


def assert_greedy_equal(got: Sequence[int], want: Sequence[int], prompt: Sequence[int], ctx: LlamaContext,
                        *, gap: float = 5e-2, what: str = "") -> None:
    """``got == want``, except that they may part at a near-tie: batched
    logits differ from one-sequence logits by up to ~3e-2, which can flip an
    argmax whose top two logits are closer than that (checked on ``ctx``,
    a one-sequence context of the target)."""
    got, want = list(got), list(want)
    if got == want:
        return
    i = next(i for i, (a, b) in enumerate(zip(got + [-1], want + [-1])) if a != b)
    ctx.truncate(0)
    row = np.sort(np.asarray(ctx.eval(list(prompt) + want[:i], 1)[0], dtype=np.float64))
    ctx.truncate(0)
    assert row[-1] - row[-2] < gap, f"{what} diverged at token {i} with a top-2 logit gap of {row[-1] - row[-2]}"


def endless_prompt(dec: BatchedDecoder, candidates: Sequence[str]) -> str:
    """A prompt from which greedy decoding runs 300 tokens without an
    end-of-generation token: a tiny random model's greedy path then cycles,
    so a long greedy request holds its slot until it is stopped."""
    from specdec_cpu import SamplingParams

    greedy = SamplingParams(temperature=0.0)
    for p in candidates:
        if dec.generate(p, max_tokens=300, params=greedy).finish_reason == "length":
            return p
    raise AssertionError("every candidate prompt reaches an end-of-generation token")


def call_or_fail(fn: Callable[[], object], timeout: float = 60.0) -> object:
    """``fn()`` on a daemon thread: its result, or its exception re-raised;
    a call still waiting after ``timeout`` seconds fails the test (and is
    abandoned, so a regression that hangs a caller cannot hang the suite)."""
    box: dict = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # handed to the test thread
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        pytest.fail(f"the call was still waiting after {timeout} s")
    if "error" in box:
        raise box["error"]
    return box["result"]
