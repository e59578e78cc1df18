"""``POST /v1/embeddings`` through real clients (the ``openai`` SDK, LangChain's
OpenAIEmbeddings): vectors as llama-cpp-python's own embedding path computes
them, in every input shape and encoding, ``dimensions``, a separate
``--embedding-model``, and every bad request a 400 naming its field."""

from __future__ import annotations

import base64
import threading

import httpx
import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from server_thread import ThreadServer  # noqa: E402

TEXTS = ["def reverse(s): return s[::-1]", "the cat sat on the mat", "hello world"]
MAX_TOKENS = 24


def _loader(target, draft, **kw):
    from specdec_cpu import BatchedDecoder

    return lambda: BatchedDecoder.from_gguf(target, draft, max_sequences=2, n_ctx=256, n_threads=1, gamma=3,
                                            embedding_max_tokens=MAX_TOKENS, **kw)


@pytest.fixture(scope="module")
def server(tiny_target, tiny_draft):
    from specdec_cpu.server.openai_app import ServerOptions

    with ThreadServer(_loader(tiny_target, tiny_draft), ServerOptions(model_name="tiny")) as s:
        yield s


@pytest.fixture(scope="module")
def with_embedding_model(tiny_target, tiny_draft, tiny_large_vocab):
    """The tiny pair serving; another model (its own vocabulary, 32 values a vector) embedding."""
    from specdec_cpu.server.openai_app import ServerOptions

    with ThreadServer(_loader(tiny_target, tiny_draft, embedding_model=tiny_large_vocab),
                      ServerOptions(model_name="tiny")) as s:
        yield s


def client(server) -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def reference(path: str, texts) -> np.ndarray:
    """llama-cpp-python's own embedding (its Llama class, mean pooling, L2-normalised): code we did not write."""
    import llama_cpp

    llm = llama_cpp.Llama(path, embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, n_ctx=64,
                          n_batch=64, n_ubatch=64, n_threads=1, verbose=False)
    try:
        return np.array([llm.embed(t, normalize=True) for t in texts], dtype=np.float32)
    finally:
        llm.close()


def assert_same_directions(got, want) -> None:
    """Row by row the same vectors up to float rounding (llama.cpp's batch layouts differ in the last
    digits): cosine > 0.99995, where another pooling or a missing normalisation is far off."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    cosines = np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert np.all(cosines > 0.99995), cosines
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), np.linalg.norm(want, axis=1), atol=1e-5)


def post(server, **body) -> httpx.Response:
    return httpx.post(server.url + "/v1/embeddings", json=body, timeout=60)


def refused(r: httpx.Response, param: str, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    return err


def test_the_sdk_gets_llama_cpp_python_s_vectors(server, tiny_target) -> None:
    got = client(server).embeddings.create(model="tiny", input=TEXTS)  # the SDK asks for base64 and decodes it
    assert [d.index for d in got.data] == [0, 1, 2] and got.model == "tiny"
    vectors = np.array([d.embedding for d in got.data], dtype=np.float32)
    assert vectors.shape == (3, 64)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert_same_directions(vectors, reference(tiny_target, TEXTS))
    n_tokens = sum(len(httpx.post(server.url + "/tokenize", json={"content": t, "add_special": True}).json()["tokens"])
                   for t in TEXTS)
    assert got.usage.prompt_tokens == got.usage.total_tokens == n_tokens


def _metric(server, name: str) -> float:
    lines = httpx.get(server.url + "/metrics").text.splitlines()
    return float(next(line.split()[1] for line in lines if line.startswith(name + " ")))


def test_metrics_count_inputs_tokens_and_seconds(server) -> None:
    names = ("specdec_embedding_inputs_total", "specdec_embedding_tokens_total", "specdec_embedding_seconds_total")
    before = [_metric(server, n) for n in names]
    texts = post(server, input=TEXTS).json()["usage"]["prompt_tokens"]
    ids = post(server, input=[[1, 2, 3]]).json()["usage"]["prompt_tokens"]
    after = [_metric(server, n) for n in names]
    assert after[0] - before[0] == len(TEXTS) + 1 and after[1] - before[1] == texts + ids == texts + 3
    assert after[2] > before[2]
    refused(post(server, input=["ok", "word " * 40]), "input")  # refused: nothing counted
    assert [_metric(server, n) for n in names[:2]] == after[:2]


def test_every_input_shape_and_encoding_gives_the_same_vector(server) -> None:
    ids = httpx.post(server.url + "/tokenize", json={"content": TEXTS[1], "add_special": True}).json()["tokens"]
    one = np.array(post(server, input=TEXTS[1]).json()["data"][0]["embedding"], dtype=np.float32)
    for body in ({"input": [TEXTS[0], TEXTS[1]]}, {"input": ids}, {"input": [ids, ids]},
                 {"input": [TEXTS[2], TEXTS[1]], "encoding_format": "base64"}):
        data = post(server, **body).json()["data"]
        index = 0 if body["input"] is ids else 1
        value = data[index]["embedding"]
        if body.get("encoding_format") == "base64":
            value = np.frombuffer(base64.b64decode(value), dtype="<f4")
        np.testing.assert_allclose(value, one, atol=1e-5, err_msg=str(body)[:80])


def test_dimensions_keeps_the_first_values_normalised_again(server) -> None:
    full = np.array(post(server, input=TEXTS[0]).json()["data"][0]["embedding"])
    short = np.array(post(server, input=TEXTS[0], dimensions=16).json()["data"][0]["embedding"])
    assert short.shape == (16,)
    np.testing.assert_allclose(short, full[:16] / np.linalg.norm(full[:16]), atol=1e-6)
    assert "64 values" in refused(post(server, input="x", dimensions=65), "dimensions")["message"]


def test_bad_requests_are_400s_naming_the_field(server) -> None:
    long = refused(post(server, input=["ok", "word " * 40]), "input")
    assert long["code"] == "context_length_exceeded" and "input 1" in long["message"]
    assert f"at most {MAX_TOKENS}" in long["message"]
    refused(post(server, input=""), "input")
    refused(post(server, input=[]), "input")
    refused(post(server, input=["a", ""]), "input")
    refused(post(server, input=[[1, 2], [-1]]), "input")
    refused(post(server, input=[2**64]), "input")  # more than any C integer holds: a 400 all the same
    refused(post(server, input=[[1], [10**20]]), "input")
    assert "out of range" in refused(post(server, input=[1, 10_000]), "input")["message"]
    assert "at most 2048 inputs" in refused(post(server, input=["x"] * 2049), "input")["message"]
    assert "only texts or only token-id lists" in refused(post(server, input=[[1, 2], "x"]), "input")["message"]
    refused(post(server, input="x", encoding_format="int8"), "encoding_format")
    refused(post(server, input="x", dimensions=0), "dimensions")
    refused(post(server, input="x", temperature=1), "temperature")
    lone_surrogate = httpx.post(server.url + "/v1/embeddings", content=b'{"input": "\\ud800"}',
                                headers={"content-type": "application/json"}, timeout=60)
    refused(lone_surrogate, "input")
    assert refused(post(server, input="x", model="gpt-4"), "model", 404)["code"] == "model_not_found"


def test_the_model_card_says_the_served_model_embeds(server) -> None:
    cards = httpx.get(server.url + "/v1/models").json()["data"]
    assert len(cards) == 1 and cards[0]["embedding"] == {"dimensions": 64, "max_tokens": MAX_TOKENS}


def test_an_embedding_model_of_its_own_answers_under_its_name(with_embedding_model, tiny_large_vocab) -> None:
    cards = httpx.get(with_embedding_model.url + "/v1/models").json()["data"]
    assert [c["id"] for c in cards] == ["tiny", "large_vocab"], cards
    assert cards[0]["embedding"] is None and cards[1]["embedding"] == {"dimensions": 32, "max_tokens": MAX_TOKENS}
    got = client(with_embedding_model).embeddings.create(model="large_vocab", input=TEXTS)
    assert got.model == "large_vocab"
    assert_same_directions([d.embedding for d in got.data], reference(tiny_large_vocab, TEXTS))
    assert client(with_embedding_model).models.retrieve("large_vocab").embedding == cards[1]["embedding"]
    same = client(with_embedding_model).embeddings.create(model="tiny", input=TEXTS)  # the served name works too
    np.testing.assert_allclose([d.embedding for d in same.data], [d.embedding for d in got.data], atol=1e-6)


def test_langchain_embeds_documents_and_queries(server) -> None:
    lc = pytest.importorskip("langchain_openai")
    # check_embedding_ctx_length=False: LangChain would otherwise send OpenAI's own token ids (tiktoken)
    emb = lc.OpenAIEmbeddings(model="tiny", base_url=server.url + "/v1", api_key="unused",
                              check_embedding_ctx_length=False, max_retries=0)
    docs = emb.embed_documents(TEXTS)
    query = emb.embed_query(TEXTS[2])
    assert len(docs) == 3 and len(query) == 64
    np.testing.assert_allclose(docs[2], query, atol=1e-5)
    assert int(np.argmax(np.array(docs) @ np.array(query))) == 2


def test_embedding_beside_a_generation_leaves_its_text_unchanged(server) -> None:
    """The embedding context is not the decoder's: a greedy completion streamed while embeddings run
    is the completion alone."""
    body = {"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 48, "temperature": 0}
    alone = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    done = threading.Event()
    answers = []

    def embed_meanwhile() -> None:
        while not done.is_set():
            answers.append(post(server, input=TEXTS).status_code)

    worker = threading.Thread(target=embed_meanwhile)
    worker.start()
    try:
        beside = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    finally:
        done.set()
        worker.join()
    assert beside == alone and answers and set(answers) == {200}


def _documented_bounds(server) -> tuple:
    schema = httpx.get(server.url + "/openapi.json").json()["components"]["schemas"]["EmbeddingRequest"]
    ids = next(c for c in schema["properties"]["input"]["anyOf"] if c.get("items", {}).get("type") == "integer")
    dims = next(c for c in schema["properties"]["dimensions"]["anyOf"] if c.get("type") == "integer")
    return ids["items"]["maximum"], dims["maximum"]


def test_the_document_bounds_token_ids_and_dimensions_by_the_model_that_embeds(server, with_embedding_model) -> None:
    from conftest import LARGE_VOCAB, TARGET_VOCAB

    assert _documented_bounds(server) == (TARGET_VOCAB - 1, 64)
    assert _documented_bounds(with_embedding_model) == (LARGE_VOCAB - 1, 32)


def test_a_decoder_with_nothing_to_embed_with_still_lists_itself(tiny_target) -> None:
    """A decoder built from its contexts (not loaded from files) has no embedder: /v1/models and the
    document say nothing of embeddings, and /v1/embeddings is a 400."""
    from specdec_cpu import BatchedDecoder
    from specdec_cpu.engine import LlamaMultiContext, LlamaTokenizer, LlamaWeights
    from specdec_cpu.server.openai_app import ServerOptions

    weights = LlamaWeights(tiny_target)

    def load():
        return BatchedDecoder(LlamaMultiContext(weights, n_seq=2, n_ctx=64, n_threads=1), LlamaTokenizer(weights),
                              gamma=0)

    try:
        with ThreadServer(load, ServerOptions(model_name="bare")) as s:
            cards = httpx.get(s.url + "/v1/models").json()["data"]
            assert [c["id"] for c in cards] == ["bare"] and cards[0]["embedding"] is None
            assert httpx.get(s.url + "/v1/models/bare").status_code == 200
            assert httpx.get(s.url + "/openapi.json").status_code == 200
            assert refused(post(s, input="hi"), "model")["code"] == "embeddings_unsupported"
    finally:
        weights.close()


@pytest.fixture()
def slow_passes(monkeypatch):
    """Every embedding pass takes 0.5 s more; the passes run are counted."""
    from specdec_cpu.engine import LlamaEmbedder

    passes: list = []
    real = LlamaEmbedder._decode
    monkeypatch.setattr(LlamaEmbedder, "_decode", lambda self, ctx, arrays, out: (
        passes.append(len(arrays)), real(self, ctx, arrays, out), threading.Event().wait(0.5)))
    return passes


def test_the_server_s_timeout_ends_an_embedding_between_passes_with_a_504(tiny_target, tiny_draft,
                                                                          slow_passes) -> None:
    from specdec_cpu.server.openai_app import ServerOptions

    with ThreadServer(_loader(tiny_target, tiny_draft), ServerOptions(model_name="tiny", request_timeout=1.2)) as s:
        ids = [list(range(1 + i, 21 + i)) for i in range(6)]  # 20 tokens each: one a pass of 32 rows
        r = post(s, input=ids)
        assert r.status_code == 504, r.text
        assert r.json()["error"]["code"] == "timeout" and "limit of 1.2 s" in r.json()["error"]["message"]
        assert 1 <= len(slow_passes) < 6, slow_passes
        assert post(s, input="hello").status_code == 200  # the next request is whole again


def test_a_client_that_leaves_stops_its_embedding(server, slow_passes) -> None:
    ids = [list(range(1 + i, 21 + i)) for i in range(8)]  # eight passes: 4 s
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/embeddings", json={"input": ids}, timeout=1.0)
    threading.Event().wait(2.0)  # the pass running when it left ends; no other starts
    ran = len(slow_passes)
    threading.Event().wait(1.0)
    assert ran == len(slow_passes) and ran < 8, slow_passes
    assert post(server, input="hello").status_code == 200
