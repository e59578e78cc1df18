"""The rest of the HTTP contract: lenient spellings clients send (null,
seed/top_k -1, n_predict, 16 stop strings, echo), /tokenize and
/detokenize, /v1/models, CORS, request ids and system_fingerprint, the
speculation statistics in usage, Ray's readiness hook, the chat template
override, and /openapi.json (every status with the error schema, /metrics as
text, the constraints the server enforces)."""

from __future__ import annotations

import json
import re

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from server_thread import ThreadServer  # noqa: E402

N_CTX = 512


@pytest.fixture(scope="module")
def decoder_loader(tiny_target, tiny_draft):
    from specdec_cpu import BatchedDecoder

    return lambda **kw: BatchedDecoder.from_gguf(tiny_target, tiny_draft, max_sequences=2, n_ctx=N_CTX,
                                                 n_threads=1, **kw)


@pytest.fixture(scope="module")
def server(decoder_loader):
    from specdec_cpu.server.openai_app import ServerOptions

    with ThreadServer(lambda: decoder_loader(gamma=3), ServerOptions(model_name="tiny")) as s:
        yield s


def client(server) -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def ok(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


def refused(r: httpx.Response, param: str) -> dict:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    return err


# ---------------------------------------------------------------------------
# leniency
# ---------------------------------------------------------------------------


def test_null_means_default_and_minus_one_means_off(server) -> None:
    nulls = {k: None for k in ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "stream", "max_tokens",
                               "n", "presence_penalty", "logprobs", "ignore_eos", "gamma", "response_format")}
    r = ok(server.post("/v1/completions", {"model": "tiny", "prompt": "hello", **nulls}))
    assert r["usage"]["completion_tokens"] <= 16  # the completions default
    greedy = {"model": "tiny", "prompt": "the quick", "max_tokens": 12, "temperature": 0}
    want = ok(server.post("/v1/completions", greedy))["choices"][0]["text"]
    lenient = ok(server.post("/v1/completions", {**greedy, "top_k": -1, "seed": -1}))["choices"][0]["text"]
    assert lenient == want
    # seed -1 is random: the same request differs between calls
    texts = {ok(server.post("/v1/completions", {"model": "tiny", "prompt": "the", "max_tokens": 12,
                                                "temperature": 1.0, "seed": -1}))["choices"][0]["text"]
             for _ in range(4)}
    assert len(texts) > 1
    same = {ok(server.post("/v1/completions", {"model": "tiny", "prompt": "the", "max_tokens": 12, "gamma": 0,
                                               "temperature": 1.0, "seed": 7}))["choices"][0]["text"]
            for _ in range(2)}
    assert len(same) == 1
    refused(server.post("/v1/completions", {"model": "tiny", "prompt": "x", "top_k": -2}), "top_k")
    refused(server.post("/v1/completions", {"model": "tiny", "prompt": "x", "seed": -2}), "seed")


def test_n_predict_and_stop_lists(server) -> None:
    body = {"model": "tiny", "prompt": "hello", "temperature": 1.0, "ignore_eos": True}
    assert ok(server.post("/v1/completions", {**body, "n_predict": 7}))["usage"]["completion_tokens"] == 7
    assert ok(server.post("/v1/completions", {**body, "n_predict": 7, "max_tokens": 7}))["usage"][
        "completion_tokens"] == 7
    r = ok(server.post("/v1/completions", {**body, "n_predict": -1}))  # up to the context
    assert r["usage"]["total_tokens"] == N_CTX and r["choices"][0]["finish_reason"] == "length"
    err = refused(server.post("/v1/completions", {**body, "n_predict": 5, "max_tokens": 6}), "n_predict")
    assert "conflicting" in err["message"]
    refused(server.post("/v1/completions", {**body, "n_predict": 0}), "n_predict")
    r = ok(server.post("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                                                 "n_predict": 3, "ignore_eos": True}))
    assert r["usage"]["completion_tokens"] == 3
    # 16 stop strings, as Continue sends; the output ends before the first one
    greedy = {"model": "tiny", "prompt": "the quick", "max_tokens": 20, "temperature": 0}
    text = ok(server.post("/v1/completions", greedy))["choices"][0]["text"]
    cut = text[len(text) // 2:][:2]
    stops = [f"never{i}" for i in range(15)] + [cut]
    r = ok(server.post("/v1/completions", {**greedy, "stop": stops}))
    assert r["choices"][0]["text"] == text[:text.index(cut)] and r["choices"][0]["finish_reason"] == "stop"
    refused(server.post("/v1/completions", {**greedy, "stop": stops + ["x"]}), "stop")


def test_echo_prepends_the_prompt_streamed_too(server, decoder_loader) -> None:
    body = {"model": "tiny", "prompt": "hello world", "max_tokens": 6, "temperature": 0, "gamma": 0}
    plain = ok(server.post("/v1/completions", body))["choices"][0]["text"]
    echoed = ok(server.post("/v1/completions", {**body, "echo": True}))["choices"][0]["text"]
    assert echoed == "hello world" + plain
    chunks = list(client(server).completions.create(model="tiny", prompt="hello world", max_tokens=6, temperature=0,
                                                    echo=True, stream=True, extra_body={"gamma": 0}))
    # (greedy texts of a random tiny model may differ at near-ties once a prefix is cached: compare shapes)
    assert chunks[0].choices[0].text == "hello world"
    streamed = "".join(c.choices[0].text for c in chunks)
    assert streamed.startswith("hello world") and len(streamed) > len("hello world")
    tokens = ok(server.post("/tokenize", {"content": "hello world"}))["tokens"]
    r = ok(server.post("/v1/completions", {**body, "prompt": tokens, "echo": True}))
    assert r["choices"][0]["text"].startswith("hello world") and r["usage"]["prompt_tokens"] == len(tokens)


# ---------------------------------------------------------------------------
# small endpoints
# ---------------------------------------------------------------------------


def test_tokenize_detokenize_and_models(server, tiny_target, tiny_draft) -> None:
    r = ok(server.post("/tokenize", {"content": "hello world<|im_end|>"}))
    ids = r["tokens"]
    assert all(isinstance(t, int) for t in ids) and len(ids) >= 3
    assert ok(server.post("/detokenize", {"tokens": ids}))["content"] == "hello world<|im_end|>"
    plain = ok(server.post("/tokenize", {"content": "hello world<|im_end|>", "parse_special": False}))["tokens"]
    assert len(plain) > len(ids)  # the control token's text spelt out
    with_bos = ok(server.post("/tokenize", {"content": "hello", "add_special": True}))["tokens"]
    assert len(with_bos) == len(ok(server.post("/tokenize", {"content": "hello"}))["tokens"]) + 1
    pieces = ok(server.post("/tokenize", {"content": "hello é", "with_pieces": True}))["tokens"]
    assert "".join(p["piece"] if isinstance(p["piece"], str) else bytes(p["piece"]).decode("latin-1")
                   for p in pieces)  # pieces are text, or bytes as ints where they are not UTF-8
    assert all(set(p) == {"id", "piece"} for p in pieces)
    err = refused(server.post("/detokenize", {"tokens": [1, 10**6]}), "tokens")
    assert "vocabulary" in err["message"]
    refused(server.post("/tokenize", {"content": 5}), "content")
    m = client(server).models.list().data[0]
    assert m.id == "tiny" and m.max_model_len == N_CTX
    assert m.meta["n_ctx"] == N_CTX and m.meta["draft"] == tiny_draft.rsplit("/", 1)[-1]
    assert m.meta["target"] == tiny_target.rsplit("/", 1)[-1] and m.meta["n_vocab"] == 384
    assert client(server).models.retrieve("tiny") == m  # OpenAI's GET /v1/models/{model}
    r = httpx.get(server.url + "/v1/models/gpt-4")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_ids_fingerprint_and_speculation_usage(server) -> None:
    c = client(server)
    replies = [c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=24,
                                         temperature=1.0, seed=s, extra_body={"gamma": 3, "ignore_eos": True})
               for s in range(3)]
    ids = [r.id for r in replies]
    assert len(set(ids)) == 3 and all(re.fullmatch(r"chatcmpl-[0-9a-f]{24}", i) for i in ids)
    assert len({r.system_fingerprint for r in replies}) == 1 and replies[0].system_fingerprint.startswith("fp_")
    spec = replies[0].usage.model_extra["speculation"]
    assert set(spec) >= {"drafted", "accepted", "acceptance", "mean_alpha", "forced", "steps"}
    drafted = sum(r.usage.model_extra["speculation"]["drafted"] for r in replies)
    assert drafted > 0  # γ = 3 with a draft model drafts
    for r in replies:
        s = r.usage.model_extra["speculation"]
        assert 0 <= s["accepted"] <= s["drafted"] and 0 <= s["mean_alpha"] <= 1
        assert s["steps"] <= r.usage.completion_tokens
    completion = c.completions.create(model="tiny", prompt="x", max_tokens=2)
    assert re.fullmatch(r"cmpl-[0-9a-f]{24}", completion.id)
    stream = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                       stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert len({ch.id for ch in chunks}) == 1 and chunks[-1].usage.model_extra["speculation"]["steps"] >= 1


# ---------------------------------------------------------------------------
# CORS
# ---------------------------------------------------------------------------


def test_cors_is_off_by_default_and_answers_preflights_when_on(decoder_loader, server) -> None:
    from specdec_cpu.server.openai_app import ServerOptions

    preflight = {"Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    r = httpx.options(server.url + "/v1/chat/completions", headers=preflight)
    assert r.status_code == 405 and "access-control-allow-origin" not in r.headers
    assert "access-control-allow-origin" not in httpx.get(server.url + "/v1/models",
                                                          headers={"Origin": "http://localhost:3000"}).headers
    options = ServerOptions(model_name="tiny", api_key="k", cors_origins=("http://localhost:3000",))
    with ThreadServer(lambda: decoder_loader(), options) as s:
        r = httpx.options(s.url + "/v1/chat/completions", headers=preflight)  # no key: a browser sends none
        assert r.status_code == 200, r.text
        assert r.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert "POST" in r.headers["access-control-allow-methods"]
        assert "authorization" in r.headers["access-control-allow-headers"].lower()
        r = httpx.options(s.url + "/v1/chat/completions", headers={**preflight, "Origin": "http://evil.example"})
        assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
        r = httpx.get(s.url + "/v1/models", headers={"Origin": "http://localhost:3000", "Authorization": "Bearer k"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
        r = httpx.get(s.url + "/v1/models", headers={"Origin": "http://localhost:3000"})
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == "http://localhost:3000"


# ---------------------------------------------------------------------------
# Ray's readiness hook, and the chat template override
# ---------------------------------------------------------------------------


def test_health_waits_for_the_readiness_hook(decoder_loader) -> None:
    """Ray Serve's replicas pass a hook reporting the other replicas: /health
    is 503 until it reports none missing."""
    from specdec_cpu.server.openai_app import ServerOptions
    from specdec_cpu.server.ray_deployment import replicas_problem

    class Status:
        def __init__(self, status, states):
            dep = type("D", (), {"status": status, "replica_states": states})
            self.applications = {"specdec": type("A", (), {"deployments": {"specdec": dep}})}

    assert replicas_problem(Status("HEALTHY", {"RUNNING": 2}), "specdec", "specdec") is None
    assert replicas_problem(Status("HEALTHY", {"RUNNING": 2, "STOPPING": 1}), "specdec", "specdec") is None
    assert "1 starting" in replicas_problem(Status("UPDATING", {"RUNNING": 1, "STARTING": 1}), "specdec", "specdec")
    assert "unhealthy" in replicas_problem(Status("UNHEALTHY", {"RUNNING": 2}), "specdec", "specdec")
    assert "not found" in replicas_problem(Status("HEALTHY", {"RUNNING": 1}), "other", "specdec")

    answer = ["1 of 2 replicas running"]

    async def readiness():
        return answer[0]

    s = ThreadServer.__new__(ThreadServer)  # started below once /health may say 503
    import threading
    import time

    import uvicorn
    from server_helpers import free_port

    from specdec_cpu.server.openai_app import create_app

    app = create_app(lambda: decoder_loader(), ServerOptions(model_name="tiny"), readiness=readiness)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{port}"
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                r = httpx.get(url + "/health")
                if r.json().get("replicas"):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        assert r.status_code == 503 and r.json() == {"status": "loading", "replicas": "1 of 2 replicas running"}
        answer[0] = None
        assert httpx.get(url + "/health").json() == {"status": "ok"}
    finally:
        server.should_exit = True
        thread.join(30)
    del s


def test_chat_template_override(tiny_target, tmp_path, monkeypatch) -> None:
    from specdec_cpu import BatchedDecoder, SpeculativeDecoder
    from specdec_cpu.settings import DecoderSettings, add_flags, from_flags

    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                    "{% if tools %}[{{ tools | length }} tools]{% endif %}{% if add_generation_prompt %}>{% endif %}")
    messages = [{"role": "user", "content": "hi"}]
    with BatchedDecoder.from_gguf(tiny_target, max_sequences=1, n_ctx=128, n_threads=1,
                                  chat_template=str(path)) as dec:
        assert dec.chat_prompt(messages) == "<user>hi>"
        tools = [{"type": "function", "function": {"name": "f"}}]
        assert dec.chat_prompt(messages, tools=tools) == "<user>hi[1 tools]>"
    dec = SpeculativeDecoder.from_gguf(tiny_target, n_ctx=128, n_threads=1, chat_template=str(path))
    try:
        assert dec.chat_prompt(messages, add_generation_prompt=False) == "<user>hi"
    finally:
        dec.close()
    with pytest.raises(ValueError, match="cannot read chat template"):
        DecoderSettings(chat_template=str(tmp_path / "missing.jinja"))
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}")
    with pytest.raises(ValueError, match="not valid Jinja"):
        DecoderSettings(chat_template=str(bad))
    import argparse

    monkeypatch.setenv("SPECDEC_CHAT_TEMPLATE", str(path))
    parser = argparse.ArgumentParser()
    add_flags(parser, DecoderSettings)
    assert from_flags(parser.parse_args([]), DecoderSettings).chat_template == str(path)
    assert from_flags(parser.parse_args(["--chat-template", str(bad).replace("bad", "t")]),
                      DecoderSettings).chat_template == str(path)


def test_a_grammar_the_matcher_cannot_follow_is_a_400_and_the_server_goes_on(server) -> None:
    """A grammar that never ends goes past llguidance's fast-forward limit
    while decoding: its request gets a 400 (invalid_grammar), the others and
    /health are untouched."""
    body = {"model": "tiny", "prompt": "x", "temperature": 0}
    ok(server.post("/v1/completions", {**body, "max_tokens": 2}))  # cached: the limit is hit while drafting
    for prompt in ("x", "a fresh prompt"):
        r = server.post("/v1/completions", {**body, "prompt": prompt, "max_tokens": 16, "gamma": 2,
                                            "grammar": 'root ::= "a" root'})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_grammar", r.text
        assert "Too many items" in r.json()["error"]["message"] and r.json()["error"]["param"] == "grammar"
    r = server.post("/v1/completions", {**body, "max_tokens": 16, "stream": True,
                                        "structured_outputs": {"grammar": 'root ::= "a" root'}})
    error = json.loads(next(x for x in r.text.splitlines() if '"error"' in x)[len("data: "):])["error"]
    assert error["code"] == "invalid_grammar" and error["param"] == "structured_outputs.grammar", r.text
    assert httpx.get(server.url + "/health").status_code == 200
    ok(server.post("/v1/completions", {**body, "max_tokens": 2}))


def test_a_gamma_without_a_drafter_is_a_400_naming_gamma(tiny_target) -> None:
    from specdec_cpu import BatchedDecoder
    from specdec_cpu.server.openai_app import ServerOptions

    def load():
        return BatchedDecoder.from_gguf(tiny_target, max_sequences=1, n_ctx=N_CTX, n_threads=1)

    with ThreadServer(load, ServerOptions(model_name="tiny")) as s:
        body = {"model": "tiny", "prompt": "x", "max_tokens": 2}
        assert "needs a drafter" in refused(s.post("/v1/completions", {**body, "gamma": 2}), "gamma")["message"]
        ok(s.post("/v1/completions", {**body, "gamma": 0}))


def test_chat_template_kwargs_that_break_the_template_are_the_clients_400(decoder_loader, tmp_path) -> None:
    """The template fails with the client's variables but not without: 400
    naming chat_template_kwargs; it fails on its own (here, on any second
    message): 500, the server's fault, whatever variables came along."""
    from specdec_cpu.server.openai_app import ServerOptions

    path = tmp_path / "dated.jinja"
    path.write_text("{% if messages | length > 1 %}{{ 1 / 0 }}{% endif %}"
                    "{% if date_string is defined %}{{ 'Today: ' + date_string }}{% endif %}"
                    "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}>")
    one = [{"role": "user", "content": "hi"}]
    body = {"model": "tiny", "messages": one, "max_tokens": 2}
    with ThreadServer(lambda: decoder_loader(chat_template=str(path)), ServerOptions(model_name="tiny")) as s:
        ok(s.post("/v1/chat/completions", {**body, "chat_template_kwargs": {"date_string": "1 May"}}))
        err = refused(s.post("/v1/chat/completions", {**body, "chat_template_kwargs": {"date_string": 20250101}}),
                      "chat_template_kwargs")
        assert err["code"] == "chat_template_failed" and "TypeError" in err["message"]
        r = s.post("/v1/chat/completions", {**body, "messages": one * 2, "chat_template_kwargs": {"date_string": 1}})
        assert r.status_code == 500 and r.json()["error"]["code"] == "chat_template_failed"
        assert "ZeroDivisionError" in r.json()["error"]["message"]


# ---------------------------------------------------------------------------
# /openapi.json
# ---------------------------------------------------------------------------


def test_openapi_documents_every_status_and_the_constraints(server) -> None:
    doc = httpx.get(server.url + "/openapi.json").json()
    paths = doc["paths"]
    error_ref = "#/components/schemas/ErrorResponse"
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = paths[path]["post"]["responses"]
        assert set(responses) == {"200", "400", "401", "404", "413", "429", "500", "503", "504"}, path
        for status, entry in responses.items():
            if status != "200":
                assert entry["content"]["application/json"]["schema"]["$ref"] == error_ref
        assert set(responses["200"]["content"]) == {"application/json", "text/event-stream"}
        # each streamed event: its data a chunk (or an error) as JSON, or the last "[DONE]"
        data = responses["200"]["content"]["text/event-stream"]["schema"]["properties"]["data"]["anyOf"]
        chunk = "#/components/schemas/" + ("ChatCompletionChunk" if "chat" in path else "CompletionChunk")
        assert data[0] == {"const": "[DONE]"} and data[1]["contentMediaType"] == "application/json"
        assert data[1]["contentSchema"]["anyOf"] == [{"$ref": chunk}, {"$ref": error_ref}]
    assert "422" not in json.dumps(doc) or '"422"' not in json.dumps(doc)
    metrics = paths["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain"]
    assert set(paths["/health"]["get"]["responses"]) == {"200", "503"}
    for path in ("/tokenize", "/detokenize"):
        assert {"400", "401", "413", "503"} <= set(paths[path]["post"]["responses"])
    schemas = doc["components"]["schemas"]
    completion = schemas["CompletionRequest"]["properties"]
    prompt = completion["prompt"]["anyOf"]
    assert {"type": "string", "minLength": 1} in prompt
    ids = next(p for p in prompt if p.get("items", {}).get("type") == "integer")
    assert ids["items"]["maximum"] == 383 and ids["minItems"] == 1  # the live model's vocabulary
    temp = completion["temperature"]["anyOf"][0]
    assert temp["minimum"] == 0 and temp["maximum"] == 2
    assert completion["stop"]["anyOf"][1]["maxItems"] == 16
    # n: at most 4 choices per sequence the server decodes at once (2 here)
    assert completion["n"]["anyOf"][0] == {"type": "integer", "minimum": 1, "maximum": 8}
    assert completion["presence_penalty"]["anyOf"][0] == {"type": "number", "minimum": -2, "maximum": 2}
    assert completion["logprobs"]["anyOf"][0] == {"type": "integer", "minimum": 0, "maximum": 5}
    bias = completion["logit_bias"]["anyOf"][0]["additionalProperties"]
    assert bias["minimum"] == -100 and bias["maximum"] == 100
    assert completion["stop_token_ids"]["anyOf"][0]["items"]["maximum"] == 383
    assert "sampling" in completion["logprob_mode"]["description"]
    chat = schemas["ChatCompletionRequest"]["properties"]
    assert chat["top_logprobs"]["anyOf"][0] == {"type": "integer", "minimum": 0, "maximum": 20}
    assert completion["typical_p"]["enum"] == [None, 1]  # still refused: only its neutral value
    assert "suffix" in completion and "best_of" in completion
    infill = schemas["InfillRequest"]["properties"]
    assert {"input_prefix", "input_suffix", "input_extra", "prompt", "n_probs"} <= set(infill)
    assert infill["n"]["anyOf"][0]["maximum"] == 1
    assert {"ChatCompletionChunk", "CompletionChunk", "InfillPartial"} <= set(schemas)
    assert set(paths["/infill"]["post"]["responses"]) == set(paths["/v1/completions"]["post"]["responses"])
    assert schemas["CompletionRequest"].get("additionalProperties") is False
    assert schemas["ChatCompletionRequest"]["properties"]["messages"]["minItems"] == 1
    assert schemas["ErrorResponse"]["required"] == ["error"]


def test_a_served_name_with_a_slash_is_retrieved() -> None:
    """A model found in the Hugging Face cache is served as org/repo:file.gguf."""
    from fastapi.testclient import TestClient

    from specdec_cpu.server.openai_app import ServerOptions, create_app

    def load():
        raise RuntimeError("no model is needed to name it")

    with TestClient(create_app(load, ServerOptions(model_name="org/Repo-GGUF:f.gguf"))) as http:
        r = http.get("/v1/models/org/Repo-GGUF:f.gguf")
        assert r.status_code == 200 and r.json()["id"] == "org/Repo-GGUF:f.gguf"
        assert http.get("/v1/models/org/Other-GGUF:f.gguf").json()["error"]["code"] == "model_not_found"
