"""The llama.cpp engine on tiny random-weight GGUF models."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

pytest.importorskip("llama_cpp")
pytest.importorskip("gguf")

import tiny_gguf  # noqa: E402

from specdec_cpu.core.protocols import CausalLM, Tokenizer  # noqa: E402
from specdec_cpu.engine import (  # noqa: E402
    DecodeError,
    LlamaContext,
    LlamaTokenizer,
    LlamaWeights,
    check_vocab_compatible,
    quantize,
)
from specdec_cpu.engine import context as context_mod  # noqa: E402
from specdec_cpu.engine import vocab as vocab_mod  # noqa: E402
from specdec_cpu.errors import (  # noqa: E402
    ContextOverflowError,
    ModelLoadError,
    SpecDecError,
    UnsupportedModelError,
    VocabMismatchError,
)

TEXT = "hello world, the end of it and the world is in print for that"


@pytest.fixture(scope="module")
def target(tiny_target):
    with LlamaWeights(tiny_target) as w:
        yield w


@pytest.fixture(scope="module")
def tok(target):
    return LlamaTokenizer(target)


@pytest.fixture
def ctx(target):
    c = LlamaContext(target, n_ctx=256, n_batch=64, n_threads=1, kv_type="f32")
    yield c
    c.close()


@pytest.fixture(scope="module")
def ids(tok):
    out = tok.tokenize(TEXT)
    assert len(out) >= 12
    return out


# -- loading ---------------------------------------------------------------


def test_weights_properties(target, tiny_target):
    assert target.path == tiny_target
    assert target.n_vocab == 384
    assert target.n_ctx_train == 512
    assert target.n_embd == 64 and target.n_layer == 2
    assert target.architecture == "llama"
    assert target.size > 0 and target.n_params > 0
    assert isinstance(target.description, str) and target.description
    assert target.can_truncate and not target.is_recurrent and not target.is_hybrid
    assert "target.gguf" in repr(target)


def test_weights_context_manager_and_close_closes_contexts(tiny_target):
    with LlamaWeights(tiny_target) as w:
        c1 = LlamaContext(w, n_ctx=64, n_batch=16, n_threads=1)
        c2 = LlamaContext(w, n_ctx=64, n_batch=16, n_threads=1)
        c1.eval([1, 2, 3])
        c2.eval([4])
        assert c1.n_past == 3 and c2.n_past == 1  # separate caches
    assert w.closed and c1.closed and c2.closed
    w.close()  # idempotent
    c1.close()
    with pytest.raises(ValueError, match="closed"):
        c1.eval([1])
    with pytest.raises(ValueError, match="closed"):
        LlamaContext(w)


@pytest.mark.parametrize("arg, kwargs", [
    ("n_ctx", {"n_ctx": 0}),
    ("n_ctx", {"n_ctx": -5}),
    ("n_batch", {"n_batch": 0}),
    ("n_threads", {"n_threads": 0}),
    ("n_threads", {"n_threads": -1}),
])
def test_new_context_rejects_bad_arguments(target, arg, kwargs):
    with pytest.raises(ValueError, match=arg):
        LlamaContext(target, **kwargs)


def test_new_context_rejects_bad_kv_type(target):
    with pytest.raises(ValueError, match="kv_type"):
        LlamaContext(target, n_ctx=64, kv_type="q4")


def test_default_threads_is_cpu_count(target):
    with LlamaContext(target, n_ctx=64, n_batch=16) as c:
        assert c.n_threads == (os.cpu_count() or 1)


def _load_error(path):
    with pytest.raises(ModelLoadError) as info:
        LlamaWeights(path)
    assert str(path) in str(info.value)
    return str(info.value)


def test_load_errors_name_the_path_and_leave_contexts_usable(
    ctx, tmp_path, empty_gguf, non_gguf, truncated_gguf, unknown_arch_gguf
):
    before = ctx.eval([5, 6, 7]).copy()
    assert "not found" in _load_error(tmp_path / "missing.gguf")
    assert "directory" in _load_error(tmp_path)
    assert "empty" in _load_error(empty_gguf)
    assert "not a GGUF" in _load_error(non_gguf)
    msg = _load_error(truncated_gguf)
    assert "file bounds" in msg or "truncated" in msg
    assert "nosucharch" in _load_error(unknown_arch_gguf)
    # the existing context still works and gives the same numbers
    ctx.truncate(0)
    np.testing.assert_array_equal(ctx.eval([5, 6, 7]), before)


def test_short_gguf_header(tmp_path):
    path = tmp_path / "short.gguf"
    path.write_bytes(b"GGUF\x03\x00")
    assert "truncated" in _load_error(path)


def test_loading_is_silent_by_default(tiny_target, capfd):
    with LlamaWeights(tiny_target) as w:
        with LlamaContext(w, n_ctx=64, n_batch=16, n_threads=1) as c:
            c.eval([1, 2])
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_llama_log_can_be_shown(tiny_target, capfd, monkeypatch):
    from specdec_cpu.engine import backend

    monkeypatch.setattr(backend, "_verbose", True)
    with LlamaWeights(tiny_target):
        pass
    _, err = capfd.readouterr()
    assert "llama" in err


def test_metadata_and_gc_without_close(tiny_target):
    import gc

    w = LlamaWeights(tiny_target)
    assert w.metadata("general.architecture") == "llama"
    assert w.metadata("no.such.key") is None
    c = LlamaContext(w, n_ctx=64, n_batch=16, n_threads=1)
    c.eval([1, 2])
    del w, c
    gc.collect()  # freed by __del__ without crashing


# -- CausalLM --------------------------------------------------------------


def test_context_implements_protocols(ctx, tok):
    assert isinstance(ctx, CausalLM)
    assert isinstance(tok, Tokenizer)
    assert isinstance(ctx, LlamaContext)


def test_eval_shapes_and_dtype(ctx, ids):
    out = ctx.eval(ids, n_logits=3)
    assert out.shape == (3, 384) and out.dtype == np.float32
    assert out.flags.c_contiguous and not out.flags.writeable
    assert np.isfinite(out).all()
    assert ctx.n_past == len(ids) and ctx.tokens == ids
    one = ctx.eval([ids[0]])
    assert one.shape == (1, 384)
    assert ctx.n_past == len(ids) + 1


def test_rows_equal_one_by_one(ctx, ids):
    batched = ctx.eval(ids, n_logits=len(ids)).copy()
    ctx.truncate(0)
    single = np.stack([ctx.eval([t])[0].copy() for t in ids])
    np.testing.assert_allclose(batched, single, atol=1e-4, rtol=0)
    # the last-n rows of a partial request are the same rows
    ctx.truncate(0)
    last3 = ctx.eval(ids, n_logits=3)
    np.testing.assert_allclose(last3, batched[-3:], atol=1e-4, rtol=0)


def test_default_f16_cache_rows_close(target, ids):
    with LlamaContext(target, n_ctx=128, n_batch=64, n_threads=1) as c:
        batched = c.eval(ids, n_logits=len(ids)).copy()
        c.truncate(0)
        single = np.stack([c.eval([t])[0].copy() for t in ids])
    np.testing.assert_allclose(batched, single, atol=2e-3, rtol=0)


def test_truncate_and_redecode_equals_fresh(target, ctx, ids):
    other = [7, 8, 9, 10]
    ctx.eval(ids)
    ctx.truncate(5)
    assert ctx.n_past == 5 and ctx.tokens == ids[:5]
    rolled = ctx.eval(other, n_logits=len(other)).copy()
    with LlamaContext(target, n_ctx=256, n_batch=64, n_threads=1, kv_type="f32") as fresh:
        want = fresh.eval(ids[:5] + other, n_logits=len(other))
        np.testing.assert_allclose(rolled, want, atol=1e-5, rtol=0)
    assert ctx.tokens == ids[:5] + other


def test_truncate_bounds(ctx, ids):
    ctx.eval(ids[:4])
    ctx.truncate(4)  # no-op
    with pytest.raises(ValueError, match="n_past=4"):
        ctx.truncate(5)
    with pytest.raises(ValueError):
        ctx.truncate(-1)
    with pytest.raises(TypeError):
        ctx.truncate(1.5)
    ctx.reset()
    assert ctx.n_past == 0 and ctx.tokens == []


def test_truncate_unsupported_raises(ctx, ids, monkeypatch):
    ctx.eval(ids)
    monkeypatch.setattr(context_mod.lib, "llama_memory_seq_rm", lambda *a: False)
    with pytest.raises(UnsupportedModelError, match="target.gguf"):
        ctx.truncate(3)
    assert ctx.n_past == len(ids)


def test_chunked_eval_matches_single_batch(target, ids):
    with LlamaContext(target, n_ctx=256, n_batch=4, n_threads=1, kv_type="f32") as small, \
            LlamaContext(target, n_ctx=256, n_batch=64, n_threads=1, kv_type="f32") as big:
        a = small.eval(ids, n_logits=3).copy()
        b = big.eval(ids, n_logits=3)
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)
        assert small.n_past == len(ids) and small.tokens == ids
        with pytest.raises(ValueError, match="n_batch"):
            small.eval(ids, n_logits=5)
        # the cache is intact after the refused call
        assert small.n_past == len(ids)


def test_eval_without_logits(ctx, ids):
    out = ctx.eval(ids[:5], n_logits=0)
    assert out.shape == (0, 384)
    assert ctx.n_past == 5
    got = ctx.eval(ids[5:6]).copy()
    ctx.truncate(0)
    np.testing.assert_allclose(ctx.eval(ids[:6]), got, atol=1e-5)


def test_eval_accepts_numpy_and_rejects_bad_tokens(ctx):
    ctx.eval(np.array([1, 2, 3], dtype=np.int32))
    assert ctx.tokens == [1, 2, 3]
    with pytest.raises(ValueError, match="out of range"):
        ctx.eval([1, 384])
    with pytest.raises(ValueError, match="out of range"):
        ctx.eval([-1])
    with pytest.raises(ValueError, match="empty"):
        ctx.eval([])
    with pytest.raises(TypeError):
        ctx.eval([1.5])
    with pytest.raises(ValueError, match="n_logits"):
        ctx.eval([1, 2], n_logits=3)
    assert ctx.tokens == [1, 2, 3]


def test_context_overflow(target):
    with LlamaContext(target, n_ctx=16, n_batch=16, n_threads=1) as c:
        c.eval(list(range(10)))
        with pytest.raises(ContextOverflowError) as info:
            c.eval(list(range(7)))
        msg = str(info.value)
        assert "10" in msg and "7" in msg and "16" in msg
        assert c.n_past == 10
        c.eval(list(range(6)))  # exactly fills the context
        assert c.n_past == 16


def test_decode_failure_rolls_back(ctx, ids, monkeypatch):
    real = context_mod.lib.llama_decode
    ctx.eval(ids[:3])
    small = LlamaContext(ctx.weights, n_ctx=256, n_batch=4, n_threads=1, kv_type="f32")
    small.eval(ids[:3])
    calls = []

    def flaky(c, batch):
        calls.append(batch.n_tokens)
        if len(calls) == 2:
            return 1
        return real(c, batch)

    monkeypatch.setattr(context_mod.lib, "llama_decode", flaky)
    with pytest.raises(DecodeError) as info:
        small.eval(ids[3:])  # first chunk succeeds, second fails
    assert info.value.code == 1 and isinstance(info.value, SpecDecError)
    assert "code 1" in str(info.value)
    monkeypatch.setattr(context_mod.lib, "llama_decode", real)
    assert small.n_past == 3 and small.tokens == ids[:3]
    got = small.eval(ids[3:], n_logits=2)
    want = ctx.eval(ids[3:], n_logits=2)
    np.testing.assert_allclose(got, want, atol=1e-4)
    small.close()


@pytest.fixture(scope="module")
def recurrent(tmp_path_factory):
    """A tiny Mamba model: llama.cpp's own recurrent-model code paths."""
    from tiny_mamba import write_tiny_mamba

    with LlamaWeights(write_tiny_mamba(tmp_path_factory.mktemp("mamba") / "mamba.gguf")) as w:
        yield w


def test_a_recurrent_model_reports_it_cannot_truncate(recurrent, ids):
    assert recurrent.architecture == "mamba"
    assert recurrent.is_recurrent and not recurrent.can_truncate
    with LlamaContext(recurrent, n_ctx=64, n_batch=8, n_threads=1) as c:
        assert not c.can_truncate
        c.eval(ids[:6])
        with pytest.raises(UnsupportedModelError, match=r"mamba.gguf \(mamba\).*cannot drop a suffix"):
            c.truncate(3)
        assert c.n_past == 6 and c.tokens == ids[:6]  # a refused truncate changes nothing
        c.truncate(0)  # dropping everything is always possible
        assert c.n_past == 0


def test_a_failed_decode_of_a_recurrent_model_starts_over(recurrent, ids, monkeypatch):
    """The state has absorbed the chunks decoded before the failure and
    cannot give them back: the context drops the whole sequence (n_past 0)
    rather than keep a state that disagrees with its tokens."""
    real = context_mod.lib.llama_decode
    fresh = LlamaContext(recurrent, n_ctx=64, n_batch=4, n_threads=1)
    want = fresh.eval(ids, n_logits=2).copy()
    fresh.close()
    c = LlamaContext(recurrent, n_ctx=64, n_batch=4, n_threads=1)
    c.eval(ids[:3])
    calls = []

    def flaky(ctx, batch):
        calls.append(batch.n_tokens)
        return 1 if len(calls) == 2 else real(ctx, batch)

    monkeypatch.setattr(context_mod.lib, "llama_decode", flaky)
    with pytest.raises(DecodeError):
        c.eval(ids[3:])  # the first chunk is decoded, the second fails
    monkeypatch.setattr(context_mod.lib, "llama_decode", real)
    assert c.n_past == 0 and c.tokens == []
    np.testing.assert_allclose(c.eval(ids, n_logits=2), want, atol=1e-4)
    c.close()


def test_zero_copy_logits(ctx, ids):
    out = ctx.eval(ids, n_logits=4)
    assert out.ctypes.data == ctx.logits_address() != 0
    assert out.base is not None  # a view, not an owning copy
    out1 = ctx.eval([3])
    assert out1.ctypes.data == ctx.logits_address()


def test_sync_reuses_prefix(ctx, ids):
    ctx.eval(ids)
    calls = []
    real = ctx.eval

    def spy(tokens, n_logits=1):
        calls.append(len(tokens))
        return real(tokens, n_logits)

    ctx.eval = spy
    new = ids[:-2] + [20, 21]
    got = ctx.sync(new).copy()
    assert calls == [2] and ctx.tokens == new
    got_same = ctx.sync(new).copy()  # fully cached: re-decodes the last token only
    assert calls == [2, 1]
    np.testing.assert_allclose(got, got_same, atol=1e-5)
    del ctx.eval


def test_large_vocab_rows(tiny_large_vocab):
    with LlamaWeights(tiny_large_vocab) as w, \
            LlamaContext(w, n_ctx=64, n_batch=16, n_threads=1) as c:
        assert w.n_vocab == 50_000
        out = c.eval([1, 2, 3, 4], n_logits=4)
        assert out.shape == (4, 50_000) and np.isfinite(out).all()
        assert out.std() > 0.5  # not a flat distribution


# -- Tokenizer -------------------------------------------------------------


def test_tokenize_round_trip(tok):
    for text in ["hello world", TEXT, "héllo wörld ✓ 日本語 \n\t  x", "a" * 3000]:
        ids = tok.tokenize(text, add_special=False)
        assert b"".join(tok.token_bytes(i) for i in ids).decode("utf-8") == text
        assert tok.detokenize(ids) == text


def test_tokenize_special_handling(tok):
    ids = tok.tokenize("hello", add_special=True)
    assert ids[0] == tok.bos and tok.add_bos
    assert tok.tokenize("hello", add_special=False)[0] != tok.bos
    im_start = tok.tokenize("<|im_start|>", add_special=False, parse_special=True)
    assert len(im_start) == 1 and tok.token_bytes(im_start[0]) == b"<|im_start|>"
    plain = tok.tokenize("<|im_start|>", add_special=False, parse_special=False)
    assert len(plain) > 1


def test_token_bytes_partial_utf8(tok):
    ids = tok.tokenize("é", add_special=False)
    assert [tok.token_bytes(i) for i in ids] == [b"\xc3", b"\xa9"]


def test_tokenize_rejects_bad_input(tok):
    with pytest.raises(TypeError):
        tok.tokenize(b"bytes")
    with pytest.raises(ValueError, match="surrogate"):
        tok.tokenize("bad \ud800 text")
    with pytest.raises(ValueError, match="out of range"):
        tok.token_bytes(384)
    with pytest.raises(TypeError):
        tok.token_bytes("a")


def test_special_ids_and_eog(tok):
    texts = tiny_gguf.vocab_texts(384)
    assert tok.bos == texts.index("<|begin_of_text|>")
    assert tok.eos == texts.index("<|im_end|>")
    assert tok.is_eog(tok.eos)
    assert tok.is_eog(texts.index("<|endoftext|>"))  # detected as end-of-turn
    assert not tok.is_eog(tok.tokenize("hello", add_special=False)[0])
    assert not tok.is_eog(10_000)
    assert tok.eog_ids == {tok.eos, texts.index("<|endoftext|>")}
    assert tok.vocab_type_name == "bpe" and tok.n_vocab == 384


def test_chat_prompt(tok):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi ✓"}]
    text = tok.chat_prompt(msgs)
    assert text == ("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi ✓<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert tok.chat_prompt(msgs, add_generation_prompt=False).endswith("hi ✓<|im_end|>\n")
    ids = tok.tokenize(text, add_special=True)
    assert tok.tokenize("<|im_start|>", add_special=False)[0] in ids
    with pytest.raises(TypeError):
        tok.chat_prompt([{"role": "user"}])
    with pytest.raises(TypeError):
        tok.chat_prompt("hello")


def test_no_chat_template(tiny_no_template):
    with LlamaWeights(tiny_no_template) as w:
        t = LlamaTokenizer(w)
        assert t.chat_template is None
        assert t.chat_prompt([{"role": "user", "content": "hi"}]) is None


def test_spm_tokenizer(tiny_spm):
    with LlamaWeights(tiny_spm) as w:
        t = LlamaTokenizer(w)
        assert t.vocab_type_name == "spm" and t.bos == 1 and t.eos == 2
        ids = t.tokenize("hello world")
        assert ids[0] == 1
        assert t.detokenize(ids[1:]).strip() == "hello world"
        assert t.is_eog(2)


# -- vocabulary compatibility ------------------------------------------------


def test_vocab_same_ok(target, tiny_draft, tiny_small_draft):
    for path in (tiny_draft, tiny_small_draft):
        with LlamaWeights(path) as d:
            check_vocab_compatible(target, d)


def test_vocab_padded_ok(target, tiny_padded_draft):
    with LlamaWeights(tiny_padded_draft) as d:
        assert d.n_vocab == 512
        check_vocab_compatible(target, d)
        check_vocab_compatible(d, target)


def test_vocab_mismatch_names_ids(target, tiny_mismatched_draft):
    bad = tiny_gguf.mismatched_ids(384)
    with LlamaWeights(tiny_mismatched_draft) as d:
        with pytest.raises(VocabMismatchError) as info:
            check_vocab_compatible(target, d)
    msg = str(info.value)
    assert f"id {bad[0]}" in msg
    assert f"<changed{bad[0]}>" in msg
    assert tiny_gguf.vocab_texts(384)[bad[0]] in msg


def test_vocab_type_mismatch(target, tiny_spm):
    with LlamaWeights(tiny_spm) as d:
        with pytest.raises(VocabMismatchError, match="types differ"):
            check_vocab_compatible(target, d)


def test_vocab_check_is_fast(tiny_large_vocab, tiny_large_vocab_draft):
    with LlamaWeights(tiny_large_vocab) as a, LlamaWeights(tiny_large_vocab_draft) as b:
        t0 = time.perf_counter()
        check_vocab_compatible(a, b)
        elapsed = time.perf_counter() - t0
    # ~0.05 s here for 2 x 50k ids; generous bound for a loaded machine
    assert elapsed < 2.0
    assert vocab_mod.token_texts(a) is not None


# -- quantize --------------------------------------------------------------


@pytest.mark.parametrize("ftype", [1, 7])  # F16, Q8_0
def test_quantize(tiny_target, tmp_path, ids, ftype):
    dst = tmp_path / f"q{ftype}.gguf"
    assert quantize(tiny_target, dst, ftype, n_threads=1) == str(dst)
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    with LlamaWeights(tiny_target) as ref_w, LlamaWeights(dst) as q_w:
        assert q_w.size < ref_w.size
        with LlamaContext(ref_w, n_ctx=64, n_batch=32, n_threads=1) as a, \
                LlamaContext(q_w, n_ctx=64, n_batch=32, n_threads=1) as b:
            la = a.eval(ids, 1)
            lb = b.eval(ids, 1)
            assert np.corrcoef(la[0], lb[0])[0, 1] > 0.99


def test_quantize_errors(tmp_path, non_gguf, tiny_target):
    with pytest.raises(ModelLoadError, match="not found"):
        quantize(tmp_path / "nope.gguf", tmp_path / "out.gguf", 7)
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        quantize(non_gguf, tmp_path / "out.gguf", 7)
    with pytest.raises(ModelLoadError, match="does not exist"):
        quantize(tiny_target, tmp_path / "no_dir" / "out.gguf", 7)
    with pytest.raises(ValueError):
        quantize(tiny_target, tmp_path / "out.gguf", -1)
    assert not (tmp_path / "out.gguf").exists()
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


# -- llama.cpp built with AMX ----------------------------------------------


@pytest.mark.parametrize("info, env, expected", [
    (b"CPU : AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 | ", None, False),
    (b"CPU : AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 | ", "1", True),
    (b"CPU : AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 0 | REPACK = 1 | ", None, True),
    (b"CPU : AVX2 = 1 | REPACK = 1 | ", None, True),
])
def test_repacked_buffers_are_off_when_llama_cpp_has_amx(monkeypatch, info, env, expected):
    """A llama.cpp with AMX compiled in crashes in its AMX matrix product on
    some machines: models then load without the extra buffer types, unless
    the user says AMX works."""
    from specdec_cpu.engine import backend
    monkeypatch.setattr(backend.lib, "llama_print_system_info", lambda: info)
    if env is None:
        monkeypatch.delenv(backend.AMX_ENV, raising=False)
    else:
        monkeypatch.setenv(backend.AMX_ENV, env)
    assert backend.use_extra_buffers() is expected
