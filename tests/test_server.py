"""``specdec-cpu serve``: a real server process driven by the official ``openai`` client."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from server_helpers import ServerProcess  # noqa: E402

from specdec_cpu import SamplingParams, SpeculativeDecoder  # noqa: E402
from specdec_cpu.core.text import TextAssembler  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = ["the quick brown fox", "hello world", "def return print", "and the", "it is of",
           "with that for", "in the world", "hello and"]
SERVE = ["--threads", "1", "--n-ctx", "256", "--max-sequences", "4", "--model-name", "tiny", "--stored-responses", "2"]


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft, tmp_path_factory):
    with ServerProcess([tiny_target, tiny_draft, *SERVE], tmp_path_factory.mktemp("server")) as s:
        yield s


@pytest.fixture(scope="module")
def reference(tiny_target, tiny_draft):
    """Single-stream greedy runs of the same models."""
    return SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, gamma=3, n_ctx=256, n_threads=1)


@pytest.fixture(scope="module")
def endless(tiny_target, tiny_draft) -> str:
    """A prompt whose greedy continuation never ends by itself (see batched_helpers)."""
    from batched_helpers import endless_prompt

    from specdec_cpu import BatchedDecoder

    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, max_sequences=1, n_ctx=512, n_threads=1) as dec:
        return endless_prompt(dec, PROMPTS)


def client(server) -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def assert_same_greedy_text(got: str, ref: SpeculativeDecoder, prompt, want_tokens: list[int]) -> None:
    """``got`` is the text of ``want_tokens``, or parts from it at a near-tie
    (batched logits differ from one-sequence logits by up to ~3e-2)."""
    text = TextAssembler()
    want = "".join(text.feed(ref.tokenizer.token_bytes(t)) for t in want_tokens) + text.finish()
    if got == want:
        return
    ids = ref.tokenizer.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
    text = TextAssembler()
    shown = ""
    for j, t in enumerate(want_tokens):
        shown += text.feed(ref.tokenizer.token_bytes(t))
        if not got.startswith(shown):
            break
    ctx = ref.target
    gaps = []
    for i in range(max(0, j - 3), j + 1):  # a character may span up to 4 tokens
        ctx.truncate(0)
        row = np.sort(np.asarray(ctx.eval(ids + want_tokens[:i], 1)[0], dtype=np.float64))
        gaps.append(row[-1] - row[-2])
    ctx.truncate(0)
    assert min(gaps) < 5e-2, f"{got!r} != {want!r}; top-2 gaps near the divergence: {gaps}"


def test_health_models_and_metrics(server) -> None:
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    models = client(server).models.list()
    assert [m.id for m in models.data] == ["tiny"]
    text = httpx.get(server.url + "/metrics").text
    for name in ("specdec_requests_total", "specdec_tokens_generated_total", "specdec_drafted_tokens_total",
                 "specdec_accepted_tokens_total", "specdec_mean_alpha", "specdec_tokens_per_target_pass",
                 "specdec_tokens_per_second", "specdec_queue_depth", "specdec_active_sequences",
                 "specdec_prefix_cache_hits_total", 'specdec_time_to_first_token_seconds_bucket{le="+Inf"}',
                 "specdec_time_to_first_token_seconds_sum"):
        assert name in text, name
    # Each request's time to first token inside the decoder goes into the histogram.
    count, total = (server.metric(f"specdec_time_to_first_token_seconds_{s}") for s in ("count", "sum"))
    client(server).completions.create(model="tiny", prompt="hello", max_tokens=2, temperature=0)
    assert server.metric("specdec_time_to_first_token_seconds_count") == count + 1
    assert server.metric("specdec_time_to_first_token_seconds_sum") > total


def test_the_server_keeps_the_last_stored_responses(server) -> None:
    """``--stored-responses 2``: a third stored response drops the oldest."""
    c = client(server)
    ids = [c.responses.create(model="tiny", input=f"hi {i}", max_output_tokens=2).id for i in range(3)]
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(ids[0])
    assert [c.responses.retrieve(i).id for i in ids[1:]] == ids[1:]


def test_greedy_output_equals_the_single_stream_decoder(server, reference) -> None:
    c = client(server)
    for p in PROMPTS[:3]:
        want = reference.generate(p, max_tokens=24, params=GREEDY).tokens
        r = c.completions.create(model="tiny", prompt=p, max_tokens=24, temperature=0)
        assert r.usage.completion_tokens == len(r.choices[0].text) or r.usage.completion_tokens <= 24
        assert_same_greedy_text(r.choices[0].text, reference, p, want)
        pieces = [ch.choices[0].text for ch in c.completions.create(model="tiny", prompt=p, max_tokens=24,
                                                                     temperature=0, stream=True)]
        assert_same_greedy_text("".join(pieces), reference, p, want)
    messages = [{"role": "user", "content": "hello there"}]
    gen = reference.chat(messages, max_tokens=20, params=GREEDY)
    r = c.chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0)
    assert_same_greedy_text(r.choices[0].message.content, reference, reference.chat_prompt(messages), gen.tokens)
    assert r.usage.prompt_tokens == len(reference.tokenizer.tokenize(reference.chat_prompt(messages)))
    assert r.choices[0].finish_reason == ("length" if gen.finish_reason == "length" else "stop")


def test_stream_usage_finish_reason_and_done(server) -> None:
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=60, json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
            "stream": True, "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        data = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["completion_tokens"] <= 6
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_ignore_eos_runs_every_answer_to_max_tokens(server) -> None:
    """The same seeded requests end early without ``ignore_eos`` and run to
    ``max_tokens`` with it (finish_reason "length")."""
    c = client(server)

    def answers(**extra):
        return [c.completions.create(model="tiny", prompt="to print hello in", max_tokens=48, temperature=1.0,
                                     seed=seed, extra_body=extra) for seed in range(12)]

    plain = answers()
    assert any(r.choices[0].finish_reason == "stop" for r in plain), "no request ended early: test too weak"
    for r in answers(ignore_eos=True):
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 48, r
    status = httpx.post(server.url + "/v1/completions", timeout=60,
                        json={"model": "tiny", "prompt": "x", "ignore_eos": "maybe"})
    assert status.status_code == 400 and status.json()["error"]["param"] == "ignore_eos"


def test_eight_concurrent_async_streams_are_correct_and_independent(server, reference) -> None:
    want = {p: reference.generate(p, max_tokens=20, params=GREEDY).tokens for p in PROMPTS}

    async def main():
        c = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)

        async def one(p):
            s = await c.completions.create(model="tiny", prompt=p, max_tokens=20, temperature=0, stream=True)
            return "".join([ch.choices[0].text async for ch in s])

        try:
            return await asyncio.gather(*[one(p) for p in PROMPTS])
        finally:
            await c.close()

    texts = asyncio.run(main())
    for p, text in zip(PROMPTS, texts):
        assert_same_greedy_text(text, reference, p, want[p])
    assert len(set(texts)) > 1


def test_a_disconnecting_client_frees_its_sequence(tiny_target, tiny_draft, endless, tmp_path) -> None:
    args = [tiny_target, tiny_draft, "--threads", "1", "--n-ctx", "8192", "--max-sequences", "2",
            "--model-name", "tiny"]
    with ServerProcess(args, tmp_path) as s:
        cancelled = 'specdec_requests_total{outcome="cancelled"}'
        # Greedy from this prompt never ends by itself: only the disconnect can end it.
        body = {"model": "tiny", "prompt": endless, "max_tokens": 8000, "temperature": 0, "stream": True}
        other = ThreadPoolExecutor(1).submit(
            lambda: client(s).completions.create(model="tiny", prompt="hello world", max_tokens=40))
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", s.url + "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        break
        end = time.monotonic() + 10
        while time.monotonic() < end and s.metric(cancelled) < 1:
            time.sleep(0.02)
        assert s.metric(cancelled) == 1 and s.metric("specdec_active_sequences") <= 1
        assert other.result(timeout=60).choices[0].finish_reason in ("length", "stop")  # undisturbed
        end = time.monotonic() + 10
        while time.monotonic() < end and s.metric("specdec_active_sequences") > 0:
            time.sleep(0.02)
        assert s.metric("specdec_active_sequences") == 0


def test_client_errors_get_openai_shaped_4xx(server) -> None:
    url = server.url + "/v1"

    def post(path, body=None, content=None, headers=None):
        r = httpx.post(url + path, json=body, content=content, headers=headers, timeout=60)
        err = r.json().get("error") if r.status_code >= 400 else None
        if err is not None:
            assert set(err) == {"message", "type", "param", "code"} and err["message"], r.text
        return r.status_code, err

    assert post("/completions", {"model": "nope", "prompt": "x"})[0] == 404
    status, err = post("/completions", {"model": "tiny", "prompt": "x", "typical_p": 0.5})
    assert status == 400 and err["param"] == "typical_p" and "typical_p=0.5 is not supported" in err["message"]
    assert err["code"] == "unsupported_parameter"
    status, err = post("/completions", content=b'{"model": "tiny", "prompt": ',
                       headers={"content-type": "application/json"})
    assert status == 400 and "JSON" in err["message"]
    status, err = post("/completions", content=b"[1, 2]", headers={"content-type": "application/json"})
    assert status == 400 and err["message"] == "the request body must be a JSON object"
    status, err = post("/completions", content=b'{"model": "tiny", "prompt": "x"}',
                       headers={"content-type": "text/plain"})
    assert status == 400 and "sent with 'Content-Type: application/json' (got 'text/plain')" in err["message"]
    status, err = post("/completions", {"model": "tiny", "prompt": "x", "temperature": "hot"})
    assert status == 400 and err["param"] == "temperature"
    status, err = post("/completions", {"model": "tiny", "prompt": "x", "max_tokens": -3})
    assert status == 400 and err["param"] == "max_tokens"
    status, err = post("/chat/completions", {"model": "tiny", "messages": []})
    assert status == 400 and err["param"] == "messages"
    status, err = post("/chat/completions", {"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]})
    assert status == 400 and err["param"] == "messages[0].role"
    status, err = post("/completions", {"model": "tiny", "prompt": "hello " * 400})
    assert status == 400 and err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    status, err = post("/completions", {"model": "tiny", "prompt": [5, 10**7]})
    assert status == 400 and err["param"] == "prompt" and "vocabulary" in err["message"]
    status, err = post("/completions", {"model": "tiny", "prompt": "x", "top_p": 0})
    assert status == 400 and err["param"] == "top_p"
    status, err = post("/completions", {"model": "tiny", "prompt": "x", "stop": [str(i) for i in range(17)]})
    assert status == 400 and err["param"] == "stop" and "at most 16" in err["message"]
    status, err = post("/completions", {"model": "tiny", "prompt": "x", "presence_penalty": 2.5})
    assert status == 400 and err["param"] == "presence_penalty"
    assert httpx.get(url + "/nope").status_code == 404
    status, err = post("/completions", {"model": "tiny", "prompt": "x", "no_such_field": True})
    assert status == 400 and err["param"] == "no_such_field" and err["code"] == "unknown_parameter"
    # A huge max_tokens is capped at the context, not refused; harmless fields are ignored.
    r = client(server).completions.create(model="tiny", prompt="hello", max_tokens=10**9, temperature=1.0, user="u",
                                          extra_body={"metadata": {"a": "b"}, "top_k": 5, "gamma": 2})
    assert r.usage.prompt_tokens + r.usage.completion_tokens <= 256
    assert r.choices[0].finish_reason in ("length", "stop")
    assert "status=500" not in server.logs()


def test_api_key_body_limit_and_queue_full(tiny_target, tiny_draft, endless, tmp_path) -> None:
    args = [tiny_target, tiny_draft, "--threads", "1", "--n-ctx", "4096", "--max-sequences", "1",
            "--max-queue", "0", "--api-key", "sekrit", "--max-body", "2048", "--model-name", "tiny"]
    with ServerProcess(args, tmp_path) as s:
        assert httpx.get(s.url + "/health").status_code == 200  # open without the key
        r = httpx.post(s.url + "/v1/completions", json={"model": "tiny", "prompt": "x"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        broken = {"content": b'{"model": ', "headers": {"content-type": "application/json"}}
        r = httpx.post(s.url + "/v1/completions", **broken)  # the key is asked for before the JSON is read
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = httpx.post(s.url + "/v1/completions", **{**broken, "headers": {**broken["headers"],
                                                                           "Authorization": "Bearer sekrit"}})
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
        bad = openai.OpenAI(base_url=s.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        auth = {"Authorization": "Bearer sekrit"}
        r = httpx.post(s.url + "/v1/completions", headers=auth, timeout=30,
                       json={"model": "tiny", "prompt": "x" * 5000})
        assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="sekrit", max_retries=0)
        hold = c.completions.create(model="tiny", prompt=endless, max_tokens=4000, temperature=0, stream=True)
        next(iter(hold))  # the one sequence is busy, and nothing may wait
        r = httpx.post(s.url + "/v1/completions", headers=auth, json={"model": "tiny", "prompt": "hi"})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        with pytest.raises(openai.RateLimitError):
            c.completions.create(model="tiny", prompt="hi", max_tokens=2)
        # Choices that could never all run or wait at once are the request's fault, not a busy server's.
        r = httpx.post(s.url + "/v1/completions", headers=auth, json={"model": "tiny", "prompt": "hi", "n": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "n" and "limit of 1 choices" in r.text
        hold.close()
        assert s.metric('specdec_requests_total{outcome="rejected"}', auth) == 2


def test_sigterm_during_load_drains_and_exits_zero(tiny_target, tiny_draft, tmp_path) -> None:
    s = ServerProcess([tiny_target, tiny_draft, *SERVE, "--grace", "60"], tmp_path)
    c = client(s)
    results = []
    accepted = [threading.Event() for _ in range(6)]

    def one(i, p):
        stream = c.completions.create(model="tiny", prompt=p, max_tokens=150, temperature=1.0, stream=True)
        accepted[i].set()  # the server answered: the request is in flight (or queued) there
        chunks = list(stream)
        results.append(chunks[-1].choices[0].finish_reason)

    threads = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(PROMPTS[:6])]
    for t in threads:
        t.start()
    # SIGTERM only once every request has reached the server: a connection still
    # being made after it is refused, by design, and a loaded machine can be that slow.
    assert all(e.wait(60) for e in accepted), s.logs()
    code = s.stop(signal.SIGTERM)
    for t in threads:
        t.join(60)
    assert code == 0, s.logs()
    assert sorted(results) and len(results) == 6, s.logs()
    assert all(r in ("stop", "length") for r in results)
    with pytest.raises(httpx.ConnectError):
        httpx.get(s.url + "/health")


def test_a_stopped_decoder_answers_503_not_400(tiny_target, tiny_draft) -> None:
    from fastapi.testclient import TestClient

    from specdec_cpu import BatchedDecoder
    from specdec_cpu.server.openai_app import ServerOptions, create_app

    def load():
        dec = BatchedDecoder.from_gguf(tiny_target, tiny_draft, max_sequences=1, n_ctx=128, n_threads=1)
        dec._scheduler.loop._plan = lambda *a, **k: 1 / 0  # a bug: the scheduler's first step fails
        return dec

    with TestClient(create_app(load, ServerOptions(model_name="tiny"))) as http:
        end = time.monotonic() + 30
        while http.get("/health").json().get("status") == "loading" and time.monotonic() < end:
            time.sleep(0.05)
        first = http.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
        assert first.status_code == 500 and first.json()["error"]["type"] == "server_error"
        r = http.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_ready", r.text
        assert http.get("/health").status_code == 503


def test_health_is_503_while_the_model_loads(tiny_target, tiny_draft) -> None:
    from fastapi.testclient import TestClient

    from specdec_cpu import BatchedDecoder
    from specdec_cpu.server.openai_app import ServerOptions, create_app

    go = threading.Event()

    def load():
        go.wait(30)
        return BatchedDecoder.from_gguf(tiny_target, tiny_draft, max_sequences=1, n_ctx=128, n_threads=1)

    with TestClient(create_app(load, ServerOptions(model_name="tiny"))) as http:
        r = http.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "loading"
        r = http.post("/v1/completions", json={"model": "tiny", "prompt": "x"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_ready"
        go.set()
        end = time.monotonic() + 30
        while http.get("/health").status_code != 200 and time.monotonic() < end:
            time.sleep(0.05)
        assert http.post("/v1/completions", json={"model": "tiny", "prompt": "x"}).status_code == 200


def test_a_model_that_fails_to_load_stops_the_server(tmp_path, non_gguf) -> None:
    s = ServerProcess([non_gguf, "--threads", "1"], tmp_path, ready=False)
    assert s.proc.wait(60) == 1
    assert "not a GGUF file" in s.logs()


def test_a_port_in_use_stops_the_server_before_the_model_loads(tiny_target) -> None:
    import socket
    import subprocess
    import sys

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "specdec_cpu.cli", "serve", tiny_target, "--port", str(port)],
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last == f"specdec-cpu: error: cannot listen on 127.0.0.1:{port}: Address already in use"


@pytest.mark.real_model
@pytest.mark.slow
def test_the_default_pair_serves_chat(tmp_path) -> None:
    from real_models import default_pair

    target, draft = default_pair()
    with ServerProcess(["--threads", "2", "--n-ctx", "1024", "--max-sequences", "2"], tmp_path,
                       timeout=600) as s:
        ref = SpeculativeDecoder.from_gguf(target, draft, n_ctx=1024)
        messages = [{"role": "user", "content": "Write a Python function that reverses a string."}]
        want = ref.chat(messages, max_tokens=32, params=GREEDY)
        r = client(s).chat.completions.create(model=Path(target).stem, messages=messages, max_tokens=32,
                                              temperature=0)
        assert_same_greedy_text(r.choices[0].message.content, ref, ref.chat_prompt(messages), want.tokens)
