"""Log-probabilities, penalties and biases, n choices and fill-in-the-middle
through a live server: their shapes (OpenAI's, the legacy completions' and
llama-server's), streamed and whole, their effect on greedy output, and a
400 naming the field for every value out of range.  Speculation is on (a
fixed gamma with a draft model) wherever the output is checked."""

from __future__ import annotations

import json
import math

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from server_thread import ThreadServer  # noqa: E402

from specdec_cpu.server.openapi import Completion  # noqa: E402

N_CTX = 512
GAMMA = 2
FIM = ("pre", "suf", "mid", "pad", "rep", "sep")


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft):
    from specdec_cpu import BatchedDecoder
    from specdec_cpu.server.openai_app import ServerOptions

    def load():
        return BatchedDecoder.from_gguf(tiny_target, tiny_draft, max_sequences=2, n_ctx=N_CTX, n_threads=1,
                                        gamma=GAMMA)

    with ThreadServer(load, ServerOptions(model_name="tiny")) as s:
        yield s


@pytest.fixture(scope="module")
def fim_server(tiny_dir, tiny_draft):
    """The tiny target's weights with fill-in-the-middle tokens declared (the draft shares its vocabulary)."""
    from tiny_gguf import write_tiny_model

    from specdec_cpu import BatchedDecoder
    from specdec_cpu.server.openai_app import ServerOptions

    path = tiny_dir / "fim_server.gguf"
    if not path.exists():
        write_tiny_model(path, n_vocab=384, seed=0, n_layer=2, fim=FIM)

    def load():
        return BatchedDecoder.from_gguf(str(path), tiny_draft, max_sequences=2, n_ctx=N_CTX, n_threads=1,
                                        gamma=GAMMA)

    with ThreadServer(load, ServerOptions(model_name="fim")) as s:
        yield s


def client(server) -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def ok(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


def refused(r: httpx.Response, param: str, words: str = "") -> dict:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err
    assert err["type"] == "invalid_request_error"
    return err


def sse(r: httpx.Response) -> list:
    """The JSON events of a server-sent event stream ([DONE] left out)."""
    assert r.status_code == 200, r.text
    events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
    return [json.loads(e) for e in events if e != "[DONE]"]


def speculated(body: dict) -> None:
    spec = body["usage"]["speculation"]
    assert spec["drafted"] > 0 and spec["steps"] > 0, spec


USER = [{"role": "user", "content": "tell me a story"}]
GREEDY = {"model": "tiny", "temperature": 0, "gamma": GAMMA}


def completion(server, prompt: str = "the quick brown", **extra) -> dict:
    return ok(server.post("/v1/completions", {**GREEDY, "prompt": prompt, "max_tokens": 16, **extra}))


def token_ids(server, text: str) -> list:
    return ok(server.post("/tokenize", {"content": text, "add_special": False}))["tokens"]


def ids_of(body: dict, index: int = 0) -> list:
    """The token ids of a legacy choice asked with ``return_tokens_as_token_ids``."""
    return [int(t.split(":")[1]) for t in body["choices"][index]["logprobs"]["tokens"]]


def detokenize(server, ids: list) -> str:
    return ok(server.post("/detokenize", {"tokens": ids}))["content"]


# ---------------------------------------------------------------------------
# logprobs
# ---------------------------------------------------------------------------


def check_entry(entry, top: int) -> None:
    """One chat logprobs entry: values <= 0, ``top`` alternatives most likely
    first, the token's own value equal to its entry among them."""
    assert entry.logprob <= 0 and bytes(entry.bytes).decode("utf-8", "replace") == entry.token
    assert len(entry.top_logprobs) == top
    values = [a.logprob for a in entry.top_logprobs]
    assert all(v <= 0 for v in values) and values == sorted(values, reverse=True)
    for alt in entry.top_logprobs:
        if alt.bytes == entry.bytes:  # tokens are told apart by their bytes (a byte may be half a character)
            assert alt.logprob == pytest.approx(entry.logprob, abs=1e-5)


def test_chat_logprobs_are_well_formed_and_the_greedy_token_is_the_most_likely(server) -> None:
    r = client(server).chat.completions.create(model="tiny", messages=USER, max_tokens=12, temperature=0,
                                               logprobs=True, top_logprobs=3, extra_body={"gamma": GAMMA})
    choice = r.choices[0]
    content = choice.logprobs.content
    assert len(content) == r.usage.completion_tokens > 0
    assert b"".join(bytes(e.bytes) for e in content).decode("utf-8", "replace") == choice.message.content
    for entry in content:
        check_entry(entry, 3)
        # greedy: the emitted token is the model's argmax, the first alternative
        assert entry.top_logprobs[0].bytes == entry.bytes
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-5)
    assert r.usage.model_extra["speculation"]["drafted"] > 0
    # without logprobs: none reported; logprobs alone: no alternatives
    plain = client(server).chat.completions.create(model="tiny", messages=USER, max_tokens=4, temperature=0)
    assert plain.choices[0].logprobs is None
    bare = client(server).chat.completions.create(model="tiny", messages=USER, max_tokens=4, temperature=0,
                                                  logprobs=True)
    assert all(e.top_logprobs == [] for e in bare.choices[0].logprobs.content)


def test_streamed_chat_logprobs_carry_each_chunks_tokens(server) -> None:
    kwargs = dict(model="tiny", messages=USER, max_tokens=12, temperature=0, logprobs=True, top_logprobs=2,
                  extra_body={"gamma": GAMMA})
    whole = client(server).chat.completions.create(**kwargs)
    chunks = list(client(server).chat.completions.create(stream=True, stream_options={"include_usage": True},
                                                         **kwargs))
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [e.bytes for e in entries] == [e.bytes for e in whole.choices[0].logprobs.content]
    for mine, theirs in zip(entries, whole.choices[0].logprobs.content):
        check_entry(mine, 2)
        assert mine.logprob == pytest.approx(theirs.logprob, abs=1e-3)
    # the first text carries its tokens' logprobs (they are not kept for the end)
    first = next(c for c in chunks if c.choices and c.choices[0].delta.content)
    assert first.choices[0].logprobs is not None and first.choices[0].logprobs.content
    assert chunks[-1].usage.model_extra["speculation"]["drafted"] > 0


def test_completion_logprobs_have_the_legacy_shape(server) -> None:
    body = completion(server, logprobs=3)
    speculated(body)
    choice = body["choices"][0]
    lp = choice["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    n = body["usage"]["completion_tokens"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    ids = ids_of(completion(server, logprobs=0, return_tokens_as_token_ids=True))
    assert len(ids) == n and detokenize(server, ids) == choice["text"]
    # Each offset is where the token's text starts in the completion's text (a character
    # whose bytes span tokens belongs to the token that completes it).
    text, offsets = choice["text"], lp["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets) and offsets[-1] <= len(text)
    for i in range(1, n):
        before = detokenize(server, ids[:i])
        if "\ufffd" not in before:  # not cut inside a character
            assert offsets[i] == len(before) and text.startswith(before)
    for tok, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert value <= 0 and 1 <= len(top) <= 4 and all(v <= 0 for v in top.values())
        assert max(top.values()) == pytest.approx(value, abs=1e-5)  # greedy: the most likely token
        assert top[tok] == pytest.approx(value, abs=1e-5)  # the sampled token is always there
    # logprobs 0: the sampled token alone (OpenAI: the sampled token always, up to logprobs + 1)
    alone = completion(server, logprobs=0)["choices"][0]["logprobs"]
    assert alone["top_logprobs"] == [{t: v} for t, v in zip(alone["tokens"], alone["token_logprobs"])]
    # streamed: the chunks' tokens and offsets continue one another
    r = server.post("/v1/completions", {**GREEDY, "prompt": "the quick brown", "max_tokens": 16, "logprobs": 3,
                                        "stream": True})
    events = sse(r)
    streamed = [c["choices"][0]["logprobs"] for c in events if c["choices"][0]["logprobs"]]
    assert sum((s["tokens"] for s in streamed), []) == lp["tokens"]
    assert sum((s["text_offset"] for s in streamed), []) == lp["text_offset"]
    # llama-server's n_probs means the same
    assert completion(server, n_probs=3)["choices"][0]["logprobs"]["tokens"] == lp["tokens"]


def test_echo_with_logprobs_scores_the_prompt_as_the_completion_was_scored(server) -> None:
    """lm-evaluation-harness's loglikelihood request: token-id prompts, echo, max_tokens 1, logprobs 1.  A
    prompt's entries after its first are the model's log-probabilities of its tokens: scoring a prompt that is
    an earlier prompt and its greedy completion gives the completion's own logprobs back (one pass over the
    prompt, against the rows that verified drafts)."""
    context = token_ids(server, "the quick brown")
    first = ok(server.post("/v1/completions", {**GREEDY, "prompt": context, "max_tokens": 12, "logprobs": 2,
                                                "return_tokens_as_token_ids": True}))
    speculated(first)
    out, out_lp = ids_of(first), first["choices"][0]["logprobs"]["token_logprobs"]
    scored = ok(server.post("/v1/completions", {**GREEDY, "prompt": [context + out, context], "max_tokens": 1,
                                                 "logprobs": 1, "echo": True, "return_tokens_as_token_ids": True}))
    Completion.model_validate(scored)  # the answer /openapi.json documents (its first entries null)
    for choice, prompt in zip(scored["choices"], (context + out, context)):
        lp = choice["logprobs"]
        assert [int(t.split(":")[1]) for t in lp["tokens"]][:len(prompt)] == prompt
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(prompt) + 1
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # nothing predicts it
        assert all(v <= 0 and len(top) <= 2 for v, top in zip(lp["token_logprobs"][1:], lp["top_logprobs"][1:]))
    lp = scored["choices"][0]["logprobs"]["token_logprobs"]
    assert lp[len(context):-1] == pytest.approx(out_lp, abs=0.05)  # batched rows round apart: ~1e-2
    tops = scored["choices"][0]["logprobs"]["top_logprobs"][len(context):-1]
    assert all(t[f"token_id:{tok}"] == pytest.approx(max(t.values()), abs=1e-5) for t, tok in zip(tops, out))  # greedy
    assert scored["usage"]["prompt_tokens"] == 2 * len(context) + len(out)
    # text prompts: the echo and the tokens' offsets agree; streamed, the echo's chunk carries the prompt's entries
    body = {**GREEDY, "prompt": "the quick brown", "max_tokens": 6, "logprobs": 3, "echo": True}
    whole = ok(server.post("/v1/completions", body))["choices"][0]
    assert whole["text"].startswith("the quick brown")
    lp = whole["logprobs"]
    bos = lp["tokens"][0]  # the tokenizer's, not in the echoed text: its offset is 0 and it takes no room
    assert bos == "<|begin_of_text|>" and lp["text_offset"][:2] == [0, 0]
    assert "".join(lp["tokens"][1:]) == whole["text"]
    n = len(context) + 1  # the prompt's tokens; then the output's, whose characters may span tokens
    assert lp["text_offset"][1:n + 1] == [sum(len(t) for t in lp["tokens"][1:i]) for i in range(1, n + 1)]
    assert lp["text_offset"][n] == len("the quick brown") and lp["text_offset"] == sorted(lp["text_offset"])
    events = sse(server.post("/v1/completions", {**body, "stream": True}))
    assert events[0]["choices"][0]["text"] == "the quick brown"
    assert events[0]["choices"][0]["logprobs"]["tokens"] == lp["tokens"][:len(context) + 1]
    streamed = [e["choices"][0]["logprobs"] for e in events if e["choices"][0]["logprobs"]]
    for key in ("tokens", "text_offset", "top_logprobs"):
        assert sum((s[key] for s in streamed), []) == lp[key]
    assert sum((s["token_logprobs"] for s in streamed), []) == pytest.approx(lp["token_logprobs"], abs=1e-5)
    # an end token drawn as the generated one has its entry too: lm-eval's [ctxlen:-1] drops it, not the prompt's last
    eos = token_ids(server, "<|im_end|>")
    assert len(eos) == 1
    ended = ok(server.post("/v1/completions", {**GREEDY, "prompt": context, "max_tokens": 1, "logprobs": 1,
                                                "echo": True, "logit_bias": {str(eos[0]): 100},
                                                "return_tokens_as_token_ids": True}))["choices"][0]
    assert ended["finish_reason"] == "stop" and ended["text"] == detokenize(server, context)
    assert ended["logprobs"]["tokens"] == [f"token_id:{t}" for t in context + eos]
    assert ended["logprobs"]["token_logprobs"][:-1] == pytest.approx(scored["choices"][1]["logprobs"][
        "token_logprobs"][:-1], abs=1e-5)
    streamed_end = sse(server.post("/v1/completions", {**GREEDY, "prompt": context, "max_tokens": 1, "logprobs": 1,
                                                        "echo": True, "logit_bias": {str(eos[0]): 100},
                                                        "return_tokens_as_token_ids": True, "stream": True}))
    assert sum((e["choices"][0]["logprobs"]["tokens"] for e in streamed_end if e["choices"][0]["logprobs"]),
               []) == ended["logprobs"]["tokens"]
    # a prompt whose first token is part of a character: offsets count the character once, where it ends
    euro = token_ids(server, "€ hello")
    assert detokenize(server, euro[:1]) == "\ufffd"  # "€" is split across tokens
    cut = ok(server.post("/v1/completions", {**GREEDY, "prompt": euro, "max_tokens": 0, "logprobs": 0,
                                              "echo": True}))["choices"][0]
    assert cut["text"] == "€ hello"
    after = next(i for i in range(1, len(euro) + 1) if detokenize(server, euro[:i]) == "€")
    assert cut["logprobs"]["text_offset"][after] == 1 and cut["logprobs"]["text_offset"][-1] <= len("€ hello")
    # OpenAI's SDK reads it
    sdk = client(server).completions.create(model="tiny", prompt=context, max_tokens=1, temperature=0, logprobs=1,
                                            echo=True, extra_body={"gamma": GAMMA}).choices[0].logprobs
    assert sdk.token_logprobs[0] is None and sdk.top_logprobs[0] is None and len(sdk.tokens) == len(context) + 1
    assert sdk.token_logprobs[1:-1] == pytest.approx(scored["choices"][1]["logprobs"]["token_logprobs"][1:-1],
                                                     abs=1e-5)
    # max_tokens 0: the prompt scored, nothing generated (whole and streamed); without echo and logprobs, a 400
    only = ok(server.post("/v1/completions", {**body, "max_tokens": 0}))
    assert only["choices"][0]["text"] == "the quick brown" and only["choices"][0]["finish_reason"] == "length"
    assert only["choices"][0]["logprobs"]["tokens"] == lp["tokens"][:len(context) + 1]
    assert only["usage"]["completion_tokens"] == 0 and only["usage"]["prompt_tokens"] == len(context) + 1
    events = sse(server.post("/v1/completions", {**body, "max_tokens": 0, "stream": True}))
    assert "".join(e["choices"][0]["text"] for e in events) == "the quick brown"
    assert events[0]["choices"][0]["logprobs"]["tokens"] == lp["tokens"][:len(context) + 1]
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    refused(server.post("/v1/completions", {**GREEDY, "prompt": "the quick brown", "max_tokens": 0, "echo": True}),
            "max_tokens", "only with echo and logprobs")
    # with suffix the prompt is fill-in-the-middle tokens: scoring it is refused, not answered in part
    refused(server.post("/v1/completions", {**body, "suffix": "fox"}), "suffix", "echo with logprobs")


def test_sampling_logprob_mode_reports_the_truncated_distribution(server) -> None:
    def ask(mode: str) -> list:
        r = ok(server.post("/v1/chat/completions", {**GREEDY, "messages": USER, "max_tokens": 6, "temperature": 1,
                                                    "top_k": 2, "seed": 3, "logprobs": True, "top_logprobs": 4,
                                                    "logprob_mode": mode}))
        speculated(r)
        return r["choices"][0]["logprobs"]["content"]

    for entry in ask("sampling"):
        tops = [a["logprob"] for a in entry["top_logprobs"]]
        assert tops[2:] == [-9999.0, -9999.0]  # outside top-k: probability 0
        assert sum(math.exp(v) for v in tops[:2]) == pytest.approx(1.0, abs=1e-4)
        assert entry["bytes"] in [a["bytes"] for a in entry["top_logprobs"][:2]]  # drawn from the kept two
    for entry in ask("model"):  # the model's own distribution: the other tokens keep some mass
        tops = [a["logprob"] for a in entry["top_logprobs"]]
        assert tops[3] > -9999.0 and sum(math.exp(v) for v in tops[:2]) < 1.0
    refused(server.post("/v1/chat/completions", {**GREEDY, "messages": USER, "logprobs": True,
                                                 "logprob_mode": "raw"}), "logprob_mode")


# ---------------------------------------------------------------------------
# penalties and biases
# ---------------------------------------------------------------------------


def test_a_large_logit_bias_forces_a_token_and_a_ban_removes_it(server) -> None:
    forced = token_ids(server, " cat")[0]
    body = completion(server, max_tokens=8, logit_bias={str(forced): 100}, logprobs=0,
                      return_tokens_as_token_ids=True)
    speculated(body)
    assert ids_of(body) == [forced] * 8
    assert body["choices"][0]["text"] == detokenize(server, [forced]) * 8
    first = ids_of(completion(server, logprobs=0, return_tokens_as_token_ids=True))[0]
    banned = completion(server, logprobs=0, return_tokens_as_token_ids=True, logit_bias={str(first): -100})
    speculated(banned)
    assert first not in ids_of(banned)


def test_penalties_change_a_repetitive_greedy_output(server) -> None:
    prompt = "the the the the"
    plain = completion(server, prompt, max_tokens=32, logprobs=0)
    tokens = plain["choices"][0]["logprobs"]["tokens"]
    assert len(set(tokens)) < len(tokens)  # greedy decoding of the tiny model repeats itself
    for penalty in ({"frequency_penalty": 2}, {"presence_penalty": 2}, {"repeat_penalty": 1.5}):
        body = completion(server, prompt, max_tokens=32, logprobs=0, **penalty)
        speculated(body)
        changed = body["choices"][0]["logprobs"]["tokens"]
        assert changed != tokens, penalty
        assert len(set(changed)) >= len(set(tokens)), penalty
    # vLLM's spelling is the same penalty
    a = completion(server, prompt, max_tokens=32, repeat_penalty=1.5, repeat_last_n=16)["choices"][0]["text"]
    b = completion(server, prompt, max_tokens=32, repetition_penalty=1.5, repeat_last_n=16)["choices"][0]["text"]
    assert a == b
    # zero penalties are the plain output
    assert completion(server, prompt, max_tokens=32, frequency_penalty=0, presence_penalty=0,
                      repeat_penalty=1)["choices"][0]["text"] == plain["choices"][0]["text"]


def test_stop_token_ids_end_the_output_and_min_tokens_delays_them(server) -> None:
    plain = ids_of(completion(server, logprobs=0, return_tokens_as_token_ids=True))
    stop_id = plain[0]
    stopped = completion(server, stop_token_ids=[stop_id])
    assert stopped["choices"][0]["text"] == "" and stopped["choices"][0]["finish_reason"] == "stop"
    later = completion(server, stop_token_ids=[stop_id], min_tokens=3, logprobs=0, return_tokens_as_token_ids=True)
    speculated(later)
    out = ids_of(later)
    assert len(out) >= 3 and stop_id not in out


BAD = [
    ({"presence_penalty": 2.5}, "presence_penalty", "less than or equal to 2"),
    ({"frequency_penalty": -2.01}, "frequency_penalty", "greater than or equal to -2"),
    ({"repeat_penalty": 0}, "repeat_penalty", "greater than or equal to 0.001"),
    ({"repetition_penalty": -1}, "repetition_penalty", "greater than or equal to 0.001"),
    ({"repeat_penalty": 1e218}, "repeat_penalty", "less than or equal to 1000"),
    ({"repeat_penalty": 1.1, "repetition_penalty": 1.2}, "repetition_penalty", "give one"),
    ({"repeat_last_n": -2}, "repeat_last_n", "greater than or equal to -1"),
    ({"logit_bias": {"abc": 1}}, "logit_bias", "'abc'"),
    ({"logit_bias": {"-3": 1}}, "logit_bias", "'-3'"),
    ({"logit_bias": {"5": 101}}, "logit_bias", "[-100, 100]"),
    ({"logit_bias": {"5": "x"}}, "logit_bias", "must be a number"),
    ({"logit_bias": {"99999": 1}}, "logit_bias", "99999"),
    ({"stop_token_ids": [99999]}, "stop_token_ids", "99999"),
    ({"stop_token_ids": [-1]}, "stop_token_ids[0]", "greater than or equal to 0"),
    ({"min_tokens": -1}, "min_tokens", "greater than or equal to 0"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens", "exceeds"),
    ({"logprobs": 6}, "logprobs", "less than or equal to 5"),
    ({"logprobs": True}, "logprobs", "integer"),
    ({"n_probs": 21}, "n_probs", "less than or equal to 20"),
    ({"logprobs": 2, "n_probs": 3}, "n_probs", "give one"),
    ({"n": 0}, "n", "greater than or equal to 1"),
    ({"n": 17}, "n", "less than or equal to 16"),
    ({"n": 9}, "n", "limit of 8"),
    ({"n": 2, "best_of": 3}, "best_of", "best_of=3"),
    ({"best_of": 2}, "best_of", "equal to n"),
    ({"max_tokens": 4.5}, "max_tokens", "valid integer"),
    ({"max_tokens": "4"}, "max_tokens", "valid integer"),
    ({"top_k": 2**31}, "top_k", "less than or equal to 1073741824"),
    ({"stop_token_ids": [2**31 - 2]}, "stop_token_ids", "2**30"),
]


def test_integral_numbers_are_integers(server) -> None:
    """JSON Schema's integer admits 4.0, and clients that build bodies from floats send it."""
    body = completion(server, max_tokens=4.0, n=2.0, top_k=5.0, seed=7.0, temperature=1.0)
    assert len(body["choices"]) == 2 and body["usage"]["completion_tokens"] <= 8
    assert ok(server.post("/detokenize", {"tokens": [104.0, 105]}))["content"]


@pytest.mark.parametrize("extra, param, words", BAD, ids=[f"{b[1]}:{b[2]}" for b in BAD])
def test_values_out_of_range_get_a_400_naming_the_field(server, extra, param, words) -> None:
    body = {"model": "tiny", "prompt": "x", "max_tokens": 4, **extra}
    refused(server.post("/v1/completions", body), param, words)


def test_chat_logprob_fields_are_checked(server) -> None:
    def post(**extra):
        return server.post("/v1/chat/completions", {"model": "tiny", "messages": USER, "max_tokens": 2, **extra})

    refused(post(top_logprobs=21, logprobs=True), "top_logprobs", "less than or equal to 20")
    refused(post(top_logprobs=2), "top_logprobs", "needs logprobs")
    refused(post(logprobs=2), "logprobs", "boolean")
    refused(post(logprobs=True, top_logprobs=2, n_probs=5), "n_probs", "conflicting top_logprobs=2 and n_probs=5")
    assert len(ok(post(logprobs=True, top_logprobs=2, n_probs=2))["choices"][0]["logprobs"]["content"][0][
        "top_logprobs"]) == 2
    with pytest.raises(openai.BadRequestError) as info:
        client(server).chat.completions.create(model="tiny", messages=USER, max_tokens=2, presence_penalty=3)
    assert info.value.param == "presence_penalty"


# ---------------------------------------------------------------------------
# n choices
# ---------------------------------------------------------------------------


def test_n_choices_share_the_prompt(server) -> None:
    r = client(server).completions.create(model="tiny", prompt="once upon a time", max_tokens=10, n=3,
                                          temperature=1.0, seed=5, logprobs=1, extra_body={"gamma": GAMMA})
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.text for c in r.choices}) > 1  # independent samples
    assert r.usage.completion_tokens == sum(len(c.logprobs.tokens) for c in r.choices)
    assert r.usage.model_extra["speculation"]["drafted"] > 0
    chat = client(server).chat.completions.create(model="tiny", messages=USER, max_tokens=6, n=2, temperature=0,
                                                  extra_body={"gamma": GAMMA, "best_of": 2})
    assert [c.index for c in chat.choices] == [0, 1]
    assert chat.choices[0].message.content == chat.choices[1].message.content  # greedy: the same


def test_n_choices_streamed(server) -> None:
    body = {**GREEDY, "messages": USER, "max_tokens": 8, "n": 3, "temperature": 1.0, "seed": 9, "logprobs": True,
            "stream": True, "stream_options": {"include_usage": True}}
    events = sse(server.post("/v1/chat/completions", body))
    texts = {0: "", 1: "", 2: ""}
    finished = []
    lp_tokens = {0: 0, 1: 0, 2: 0}
    for e in events[:-1]:
        (choice,) = e["choices"]
        texts[choice["index"]] += choice["delta"].get("content") or ""
        if choice["logprobs"]:
            lp_tokens[choice["index"]] += len(choice["logprobs"]["content"])
        if choice["finish_reason"]:
            finished.append(choice["index"])
    assert sorted(finished) == [0, 1, 2]
    roles = [e["choices"][0]["index"] for e in events if e["choices"] and e["choices"][0]["delta"].get("role")]
    assert roles == [0, 1, 2]
    usage = events[-1]["usage"]
    assert events[-1]["choices"] == [] and usage["completion_tokens"] == sum(lp_tokens.values())
    assert usage["speculation"]["drafted"] > 0
    assert all(texts.values())
    # the legacy endpoint streams choices too
    events = sse(server.post("/v1/completions", {**GREEDY, "prompt": "hello", "max_tokens": 6, "n": 2,
                                                 "stream": True}))
    assert {e["choices"][0]["index"] for e in events} == {0, 1}
    assert sum(1 for e in events if e["choices"][0]["finish_reason"]) == 2


def test_several_prompts_are_answered_in_order(server) -> None:
    """OpenAI's list of prompts: choice i * n + j is prompt i's choice j, each as
    the prompt alone would get it; usage counts each prompt once.  langchain's
    OpenAI LLM sends its batches this way."""
    prompts = ["the quick brown", "once upon a time", "hello"]
    alone = [completion(server, p, max_tokens=6) for p in prompts]
    texts = [a["choices"][0]["text"] for a in alone]
    r = client(server).completions.create(model="tiny", prompt=prompts, max_tokens=6, n=2, temperature=0,
                                          extra_body={"gamma": GAMMA})
    assert [c.index for c in r.choices] == list(range(6))
    assert [c.text for c in r.choices] == [t for t in texts for _ in range(2)]
    assert r.usage.prompt_tokens == sum(a["usage"]["prompt_tokens"] for a in alone)
    assert r.usage.completion_tokens == 2 * sum(a["usage"]["completion_tokens"] for a in alone)
    ids = [token_ids(server, p) for p in prompts[:2]]  # token ids: each list is one prompt
    by_ids = completion(server, ids, max_tokens=6, echo=True)["choices"]
    assert [c["text"] for c in by_ids] == [p + completion(server, i, max_tokens=6)["choices"][0]["text"]
                                           for p, i in zip(prompts, ids)]
    events = sse(server.post("/v1/completions", {**GREEDY, "prompt": prompts, "max_tokens": 6, "stream": True}))
    streamed = {0: "", 1: "", 2: ""}
    for e in events:
        streamed[e["choices"][0]["index"]] += e["choices"][0]["text"]
    assert list(streamed.values()) == texts
    # all of a request's choices must fit what can run and wait at once: 2 sequences + 64 queued
    refused(server.post("/v1/completions", {**GREEDY, "prompt": ["a"] * 34, "n": 2}), "prompt",
            "34 prompts × n=2 choices exceed the 66 requests")
    refused(server.post("/v1/completions", {**GREEDY, "prompt": ["a", ""]}), "prompt", "prompt 1: must not be empty")
    refused(server.post("/v1/completions", {**GREEDY, "prompt": ["a", [1, 2]]}), "prompt",
            "only texts or only token-id lists")
    refused(server.post("/v1/completions", {**GREEDY, "prompt": ["a"] * 257}), "prompt", "at most 256 prompts")
    lc = pytest.importorskip("langchain_openai")
    llm = lc.OpenAI(base_url=server.url + "/v1", api_key="unused", model="tiny", max_tokens=6, temperature=0,
                    max_retries=0)  # the server drafts at GAMMA by default
    assert llm.batch(prompts) == texts
    assert llm.batch(prompts * 7)[-4:] == texts[-1:] + texts  # 21 prompts: one request of its batch size, 20


# ---------------------------------------------------------------------------
# fill in the middle
# ---------------------------------------------------------------------------

PREFIX, SUFFIX = "def add(a, b):\n    ", "\n    return c\n"


def test_suffix_fills_the_middle(fim_server) -> None:
    body = {"model": "fim", "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 8, "temperature": 0, "gamma": GAMMA}
    r = ok(fim_server.post("/v1/completions", body))
    speculated(r)
    text = r["choices"][0]["text"]
    assert r["usage"]["completion_tokens"] > 0
    # the same as /infill, and different from the plain continuation of the prefix
    infill = ok(fim_server.post("/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 8,
                                            "temperature": 0, "gamma": GAMMA}))
    assert infill["content"] == text
    plain = ok(fim_server.post("/v1/completions", {**body, "suffix": None}))
    assert r["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 3  # the suffix and FIM tokens
    assert plain["choices"][0]["text"] != text or plain["usage"]["prompt_tokens"] != r["usage"]["prompt_tokens"]
    refused(fim_server.post("/v1/completions", {**body, "prompt": [1, 2, 3]}), "suffix", "text prompt")


def test_infill_answers_in_llama_servers_shape(fim_server) -> None:
    extra = [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}]
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": extra, "n_predict": 8,
            "temperature": 0, "gamma": GAMMA, "n_probs": 2}
    r = ok(fim_server.post("/infill", body))
    assert r["stop"] is True and r["tokens_predicted"] == len(r["completion_probabilities"]) > 0
    assert r["stop_type"] in ("eos", "limit") and r["model"] == "fim"
    assert r["timings"]["draft_n"] > 0 and r["tokens_evaluated"] > 10
    assert "util.py" in r["prompt"] and r["prompt"].endswith(SUFFIX) is False
    for p in r["completion_probabilities"]:
        assert p["logprob"] <= 0 and len(p["top_logprobs"]) == 2 and isinstance(p["id"], int)
    assert b"".join(bytes(p["bytes"]) for p in r["completion_probabilities"]).decode("utf-8", "replace") \
        == r["content"]
    # the prompt field starts the middle
    start = ok(fim_server.post("/infill", {**body, "prompt": "c = "}))
    assert start["tokens_evaluated"] > r["tokens_evaluated"]
    # streamed: partial results, then the final one; no [DONE]
    stream = fim_server.post("/infill", {**body, "stream": True})
    assert "[DONE]" not in stream.text
    events = sse(stream)
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == r["content"]
    assert sum(len(e.get("completion_probabilities", [])) for e in events) == r["tokens_predicted"]
    refused(fim_server.post("/infill", {**body, "input_extra": [{"filename": "x"}]}), "input_extra[0].text")
    refused(fim_server.post("/infill", {**body, "n": 2}), "n")
    refused(fim_server.post("/infill", {**body, "best_of": 3}), "best_of")
    for value in (True, 0, 0.0):  # only false: JSON's 0 is no boolean
        refused(fim_server.post("/infill", {**body, "return_tokens_as_token_ids": value}),
                "return_tokens_as_token_ids")
        refused(fim_server.post("/infill", {**body, "stream": True, "stream_options": {"include_usage": value}}),
                "stream_options.include_usage")


def with_lone_surrogate(server, path: str, body: dict, field: str) -> httpx.Response:
    """``body`` posted with ``field`` set to a lone surrogate (the JSON escape
    a client may send, which UTF-8 cannot hold)."""
    raw = json.dumps({**body, field: "@"}).replace('"@"', '"\\ud800"')
    return server.post(path, content=raw, headers={"content-type": "application/json"})


def test_a_lone_surrogate_is_a_400_naming_its_field(fim_server) -> None:
    infill = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 4}
    for field in ("input_prefix", "input_suffix", "prompt"):
        refused(with_lone_surrogate(fim_server, "/infill", infill, field), field, "not valid Unicode")
    completion = {"model": "fim", "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 4}
    for field in ("prompt", "suffix"):
        refused(with_lone_surrogate(fim_server, "/v1/completions", completion, field), field, "not valid Unicode")
    r = with_lone_surrogate(fim_server, "/v1/completions", completion, "model")  # echoed in the message
    assert r.status_code == 404 and "The model '\\ud800' does not exist" in r.json()["error"]["message"]
    for field in ("guided_choice", "structured_outputs"):  # a choice's text, inside a list
        choice = ["a", "@"] if field == "guided_choice" else {"choice": ["a", "@"]}
        raw = json.dumps({"model": "fim", "prompt": PREFIX, field: choice}).replace('"@"', '"\\ud800"')
        r = fim_server.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
        param = "guided_choice" if field == "guided_choice" else "structured_outputs.choice"
        assert refused(r, param, "choice 1 is not valid Unicode")["code"] == "invalid_grammar"
    raw = json.dumps({**completion, "@": 1}).replace('"@"', '"\\udc00"')  # an unknown field's name, echoed
    r = fim_server.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    # the server goes on (greedy: a sampled first token is an end token about once in a hundred)
    assert ok(fim_server.post("/infill", {**infill, "temperature": 0}))["tokens_predicted"] > 0


def test_fill_in_the_middle_needs_fim_tokens(server) -> None:
    refused(server.post("/v1/completions", {"model": "tiny", "prompt": "a", "suffix": "b"}), "suffix",
            "fill-in-the-middle")
    err = refused(server.post("/infill", {"input_prefix": "a", "input_suffix": "b"}), "input_suffix",
                  "fill-in-the-middle")
    assert err["code"] == "infill_unsupported"
    # an empty suffix is no suffix
    assert ok(server.post("/v1/completions", {"model": "tiny", "prompt": "a", "suffix": "", "max_tokens": 2}))


def test_an_echo_cut_short_carries_no_partial_prompt_logprobs() -> None:
    """A streamed echo whose request ended (a timeout) before its prompt was in: its chunk carries no
    log-probabilities rather than some of them; once all are in, all of them."""
    from types import SimpleNamespace

    from specdec_cpu.core.logprobs import TokenLogprob
    from specdec_cpu.server.openai_app import LogprobSource

    tokenizer = SimpleNamespace(token_bytes=lambda t: b"ab"[t:t + 1])
    entries = [TokenLogprob(1, -0.5, ((1, -0.5),))]
    cut = SimpleNamespace(result=None, prompt_ids=[0, 1, 1], prompt_logprobs=lambda: entries)
    assert LogprobSource(tokenizer, 1).prompt(0, cut, "abb") is None
    whole = SimpleNamespace(result=None, prompt_ids=[0, 1, 1], prompt_logprobs=lambda: entries * 2)
    lp = LogprobSource(tokenizer, 1).prompt(0, whole, "abb")
    assert lp["tokens"] == ["a", "b", "b"] and lp["token_logprobs"] == [None, -0.5, -0.5]
    assert lp["text_offset"] == [0, 1, 2]


def test_a_seed_is_taken_modulo_2_to_the_64() -> None:
    """Any integer seed from -1 up is accepted (a bound near 2**63 is no exact float, and clients that compare
    numbers as floats disagree with it); one beyond 2**64 draws as its remainder does."""
    from specdec_cpu.server.openai_schema import CompletionRequest

    def params(seed: int):
        return CompletionRequest.model_validate({"prompt": "x", "seed": seed}).params()

    assert params(5 + 2**64).seed == 5 and params(2**63).seed == 2**63 and params(-1).seed is None
    assert params(2**64 - 1).seed == 2**64 - 1


def test_the_same_seed_repeats_the_answer_whatever_its_multiple_of_2_to_the_64(server) -> None:
    completion(server, max_tokens=1)  # the prompt cached: a seed repeats draws with the same cached prefix
    a, b = (completion(server, temperature=1.0, seed=seed)["choices"][0]["text"] for seed in (11, 11 + 3 * 2**64))
    assert a == b
