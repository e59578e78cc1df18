"""Long runs on one decoder: memory and file descriptors stay flat.

Short by default (CI); ``pytest tests/test_soak.py --soak`` runs 500
generations, ``--soak-generations N`` any number.  The workload mixes every
way a request can end: finished, stopped by a string, a stream closed early,
cancelled, timed out, refused for a bad prompt, and chat turns.
"""

from __future__ import annotations

import gc
import os
import threading

import pytest

from specdec_cpu import GenerationCancelled, InvalidPromptError, SamplingParams, SpeculativeDecoder

CI_GENERATIONS = 60
FULL_GENERATIONS = 500

pytestmark = pytest.mark.soak


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def generations(request) -> int:
    n = request.config.getoption("--soak-generations")
    if n is not None:
        return n
    return FULL_GENERATIONS if request.config.getoption("--soak") else CI_GENERATIONS


def one_request(dec: SpeculativeDecoder, i: int) -> None:
    params = SamplingParams(temperature=(0.0, 0.7, 1.0)[i % 3], top_p=0.95, seed=i)
    prompt = [30 + i % 200, 5, 60 + i % 50, 7]
    kind = i % 8
    if kind == 0:
        dec.generate(prompt, max_tokens=24, params=params)
    elif kind == 1:
        dec.generate("hello world, the end", max_tokens=24, params=params, stop=["e", "<|im_end|>"])
    elif kind == 2:
        stream = dec.stream(prompt, max_tokens=40, params=params)
        for k, _ in enumerate(stream):
            if k == 3:
                break
        stream.close()
    elif kind == 3:
        cancel = threading.Event()
        stream = dec.stream(prompt, max_tokens=40, params=params, cancel=cancel)
        next(stream, None)
        cancel.set()
        list(stream)
    elif kind == 4:
        with pytest.raises(GenerationCancelled):
            dec.generate(prompt, max_tokens=40, params=params, timeout=1e-9)
    elif kind == 5:
        with pytest.raises(InvalidPromptError):
            dec.generate(b"bad \xff utf-8", max_tokens=4)
    elif kind == 6:
        messages = [{"role": "user", "content": f"turn {i}"}]
        first = dec.chat(messages, max_tokens=12, params=params)
        messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "more"}]
        dec.chat(messages, max_tokens=12, params=params)
    else:
        dec.generate(prompt, max_tokens=24, params=params, gamma="auto")


def test_soak(tiny_target, tiny_draft, generations) -> None:
    if not os.path.exists("/proc/self/statm"):
        pytest.skip("needs /proc (Linux)")
    dec = SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, gamma=3, n_ctx=256, n_threads=1,
                                       seed=0, calibration=None)
    probe = ([250, 5, 9], {"max_tokens": 24, "params": SamplingParams(temperature=1.0, seed=7)})
    warmup = max(16, generations // 10)
    for i in range(warmup):
        one_request(dec, i)
    first = dec.generate(probe[0], **probe[1]).tokens
    gc.collect()
    rss0, fds0 = rss_bytes(), open_fds()
    for i in range(warmup, warmup + generations):
        one_request(dec, i)
    gc.collect()
    rss1, fds1 = rss_bytes(), open_fds()
    growth = (rss1 - rss0) / rss0
    print(f"soak: {generations} generations, RSS {rss0 / 2**20:.1f} -> {rss1 / 2**20:.1f} MiB "
          f"({growth:+.2%}), fds {fds0} -> {fds1}")
    assert growth < 0.05, f"RSS grew {growth:.1%} over {generations} generations ({rss0} -> {rss1} bytes)"
    assert fds1 <= fds0, f"file descriptors grew from {fds0} to {fds1}"
    # still exact after the long run
    assert dec.generate(probe[0], **probe[1]).tokens == first
