"""Embeddings below the server: LlamaEmbedder packing texts into shared
passes, its refusals, its lifetime with the weights, and a BatchedDecoder's
``embeddings`` (the target's own, or an ``embedding_model`` of its own)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from specdec_cpu import BatchedDecoder, DecoderClosedError, GenerationCancelled, InvalidPromptError, ModelLoadError
from specdec_cpu.engine import LlamaEmbedder, LlamaMultiContext, LlamaTokenizer, LlamaWeights
from specdec_cpu.errors import UnsupportedModelError
from specdec_cpu.settings import BatchedSettings


def _texts(n: int, seed: int = 0, n_vocab: int = 300, longest: int = 24) -> list:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n_vocab, size=int(rng.integers(1, longest + 1))).tolist() for _ in range(n)]


def test_texts_packed_into_shared_passes_get_their_own_vectors(tiny_target, monkeypatch) -> None:
    """33 texts in passes of at most 4 sequences and 24 rows are the vectors each text gets alone, and
    so with 16 sequences a pass (24 is no multiple of 16: llama.cpp's graph needs the rows rounded up)."""
    with LlamaWeights(tiny_target) as w:
        emb = LlamaEmbedder(w, n_batch=24, n_seq=4, n_threads=1)
        texts = _texts(30, longest=6) + _texts(3, seed=1, longest=24)
        alone = np.vstack([emb.embed([t]) for t in texts])
        passes = []
        real = LlamaEmbedder._decode
        monkeypatch.setattr(LlamaEmbedder, "_decode", lambda self, ctx, arrays, out: (
            passes.append(len(arrays)), real(self, ctx, arrays, out))[1])
        together = emb.embed(texts)
        assert max(passes) == 4 and len(passes) < 20 and sum(passes) == 33, passes
        np.testing.assert_allclose(together, alone, atol=2e-5)
        np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
        assert emb.dimensions == 64 and emb.pooling == "mean" and emb.n_batch == 24
        odd = LlamaEmbedder(w, n_batch=24, n_seq=16, n_threads=1)  # llama.cpp aborted on 24 rows / 16 sequences
        np.testing.assert_allclose(odd.embed(texts), alone, atol=2e-5)


def test_bad_texts_are_refused_by_index_before_any_pass(tiny_target, monkeypatch) -> None:
    with LlamaWeights(tiny_target) as w:
        emb = LlamaEmbedder(w, n_batch=8, n_seq=2, n_threads=1)
        monkeypatch.setattr(LlamaEmbedder, "_decode", lambda *a: pytest.fail("decoded a refused batch"))
        with pytest.raises(InvalidPromptError, match="input 1 has no tokens"):
            emb.embed([[1], []])
        with pytest.raises(InvalidPromptError, match="input 2 has 9 tokens; at most 8"):
            emb.embed([[1], [2], [3] * 9])
        with pytest.raises(InvalidPromptError, match=r"input 0: token id 384 out of range \[0, 384\)"):
            emb.embed([[1, 384]])
        with pytest.raises(InvalidPromptError, match="token id -1"):
            emb.embed([[-1]])
        with pytest.raises(ValueError, match="n_seq must be <= 256"):
            LlamaEmbedder(w, n_seq=257)


def test_closing_the_weights_closes_the_embedder(tiny_target) -> None:
    w = LlamaWeights(tiny_target)
    emb = LlamaEmbedder(w, n_batch=16, n_threads=1)
    w.close()
    assert emb.closed and "closed" in repr(emb)
    with pytest.raises(ValueError, match="closed"):
        emb.embed([[1, 2]])


def test_a_decoder_embeds_with_its_target_or_its_embedding_model(tiny_target, tiny_draft, tiny_large_vocab) -> None:
    with LlamaWeights(tiny_target) as w:
        want = LlamaEmbedder(w, n_batch=32, n_threads=1).embed([LlamaTokenizer(w).tokenize("hello world")])
    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, max_sequences=2, n_ctx=128, n_threads=1,
                                  embedding_max_tokens=32) as dec:
        emb = dec.embeddings
        assert emb.model_path == dec.target_path and emb.max_tokens == 32 and emb.dimensions == 64
        np.testing.assert_allclose(emb.embed(["hello world"]), want, atol=2e-5)
        np.testing.assert_allclose(emb.embed([emb.tokens("hello world")]), want, atol=2e-5)
    with pytest.raises(DecoderClosedError):
        emb.embed(["hello"])
    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, max_sequences=2, n_ctx=128, n_threads=1,
                                  embedding_model=tiny_large_vocab) as dec:
        assert dec.embeddings.model_path.endswith("large_vocab.gguf") and dec.embeddings.dimensions == 32
        assert dec.embeddings.embed(["hello", [5, 6]]).shape == (2, 32)
        own = dec.embeddings._weights
    assert own.closed  # the decoder's own embedding model goes with it


def test_an_embedding_stops_before_a_pass_at_its_cancel_or_its_deadline(tiny_target, tiny_draft,
                                                                       monkeypatch) -> None:
    """Three 20-token inputs take three passes (32 rows each); a cancel or a deadline ends the call before
    the next pass, and the next call is whole again."""
    texts = [list(range(1 + i, 21 + i)) for i in range(3)]
    passes: list = []
    real = LlamaEmbedder._decode
    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, max_sequences=2, n_ctx=128, n_threads=1,
                                  embedding_max_tokens=32) as dec:
        emb = dec.embeddings
        alone = np.vstack([emb.embed([t]) for t in texts])
        cancel = threading.Event()
        monkeypatch.setattr(LlamaEmbedder, "_decode", lambda self, ctx, arrays, out: (
            passes.append(len(arrays)), real(self, ctx, arrays, out), cancel.set()))
        with pytest.raises(GenerationCancelled) as stopped:
            emb.embed(texts, cancel=cancel)
        assert stopped.value.reason == "cancelled" and stopped.value.partial is None and passes == [1]

        passes.clear()
        with pytest.raises(GenerationCancelled) as stopped:
            emb.embed(texts, timeout=0)
        assert stopped.value.reason == "timeout" and passes == []
        monkeypatch.setattr(LlamaEmbedder, "_decode", lambda self, ctx, arrays, out: (
            passes.append(len(arrays)), real(self, ctx, arrays, out), time.sleep(1.0)))
        with pytest.raises(GenerationCancelled, match="longer than 1.5 s") as stopped:
            emb.embed(texts, timeout=1.5)  # the third pass would start after 2 s
        assert stopped.value.reason == "timeout" and 1 <= len(passes) <= 2, passes

        monkeypatch.setattr(LlamaEmbedder, "_decode", real)
        before = emb.counts()
        np.testing.assert_allclose(emb.embed(texts, cancel=threading.Event(), timeout=60), alone, atol=2e-5)
        assert emb.counts().inputs == before.inputs + 3
        with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0"):
            emb.embed(texts, timeout=-1)


def test_a_missing_embedding_model_fails_the_load_by_name(tiny_target, tmp_path) -> None:
    with pytest.raises(ModelLoadError, match="model file not found: .*none.gguf"):
        BatchedDecoder.from_gguf(tiny_target, max_sequences=2, n_ctx=128, n_threads=1,
                                 embedding_model=str(tmp_path / "none.gguf"))


def test_a_decoder_not_loaded_from_files_has_nothing_to_embed_with(tiny_target) -> None:
    with LlamaWeights(tiny_target) as w:
        with BatchedDecoder(LlamaMultiContext(w, n_seq=2, n_ctx=64, n_threads=1), LlamaTokenizer(w),
                            gamma=0) as dec:
            with pytest.raises(UnsupportedModelError, match="not loaded from GGUF files"):
                dec.embeddings


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"embedding_max_tokens": 4}, ValueError, r"embedding_max_tokens must be an int in \[8, 65536\], got 4"),
    ({"embedding_model": 3}, TypeError, "embedding_model must be a file path or None, got 3"),
    ({"embedding_model": ""}, TypeError, "embedding_model must be a file path or None"),
])
def test_bad_embedding_settings_name_the_setting(kwargs, exc, match) -> None:
    with pytest.raises(exc, match=match):
        BatchedSettings(**kwargs)
