"""Log-probabilities of emitted tokens (core/logprobs.py), through llama.cpp.

Each reported value is compared with a reference computed here from the
target's one-sequence logits after the same prefix: the model's own
distribution (log softmax at T = 1) or the sampling distribution (the
pipeline, with penalties).  Both decoders, drafting at γ = 3 (so values
come from rows of verified drafts, bonus and residual rows alike).
"""

from __future__ import annotations

import numpy as np
import pytest
from stats_helpers import expected_distribution

from specdec_cpu import BatchedDecoder, SamplingParams, SpeculativeDecoder, engine
from specdec_cpu.core.logprobs import TokenLogprob, row_logprobs

TOL = 0.05  # batched and one-row passes round differently (F16 KV cache): ~1e-2 in a logit


@pytest.fixture(scope="module")
def reference(tiny_target):
    w = engine.LlamaWeights(tiny_target)
    ctx = engine.LlamaContext(w, n_ctx=256, n_batch=64, n_threads=1)

    def row(ids: list) -> np.ndarray:
        ctx.reset()
        return np.array(ctx.eval(ids, 1)[0], dtype=np.float64)

    yield row
    w.close()


def log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def check(gen, prompt: list, reference, mode: str, params: SamplingParams, top: int) -> None:
    assert gen.logprobs is not None and len(gen.logprobs) == len(gen.tokens) > 0
    for i, entry in enumerate(gen.logprobs):
        assert entry.token == gen.tokens[i] and len(entry.top) == top
        x = reference(prompt + gen.tokens[:i])
        if mode == "model":
            want = log_softmax(x)
        else:  # the pipeline after the presence penalty of the output so far
            x[list(set(gen.tokens[:i]))] -= params.presence_penalty
            with np.errstate(divide="ignore"):
                want = np.log(expected_distribution(x, params=params))
        assert abs(entry.logprob - want[entry.token]) < TOL, (i, entry.logprob, want[entry.token])
        values = [lp for _, lp in entry.top]
        assert values == sorted(values, reverse=True)
        for t, lp in entry.top:
            assert abs(lp - want[t]) < TOL or (lp == -np.inf and want[t] < -20)
        assert entry.top[0][0] == int(np.argmax(want)) or abs(entry.top[0][1] - want.max()) < TOL


@pytest.mark.parametrize("mode", ["model", "sampling"])
def test_logprobs_of_speculative_decoding(tiny_target, tiny_draft, reference, mode):
    params = SamplingParams(temperature=0.9, top_k=12, presence_penalty=0.5)
    dec = SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, gamma=3, n_ctx=256, n_threads=1, seed=3,
                                       calibration=None)
    prompt = dec.tokenize("hello world")
    drafted = rejected = 0
    for _ in range(6):
        gen = dec.generate(prompt, max_tokens=24, params=params, logprobs=4, logprob_mode=mode)
        check(gen, prompt, reference, mode, params, 4)
        drafted, rejected = drafted + gen.stats.drafted, rejected + gen.stats.drafted - gen.stats.accepted
    assert drafted > 0 and rejected > 0
    plain = dec.generate(prompt, max_tokens=8, params=params)
    assert plain.logprobs is None  # not asked: not computed
    dec.close()


def test_logprobs_in_a_batch_and_when_a_stop_string_cuts_the_output(tiny_target, tiny_draft, reference):
    params = SamplingParams(temperature=1.0)
    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, gamma=3, max_sequences=4, n_ctx=256, n_threads=1,
                                  seed=8, calibration=None) as dec:
        prompts = ["hello world", "the cat is", "def f(x):", "and the"]
        streams = [dec.stream(p, max_tokens=20, params=params, logprobs=2) for p in prompts]
        for p, s in zip(prompts, streams):
            "".join(s)
            check(s.result, dec.tokenize(p), reference, "model", params, 2)
        gen = dec.generate("hello world", max_tokens=40, params=SamplingParams(temperature=0.0), logprobs=0)
        cut = dec.generate("hello world", max_tokens=40, params=SamplingParams(temperature=0.0), logprobs=0,
                           stop=[gen.text[5:8]])
        assert len(cut.logprobs) == len(cut.tokens) < len(gen.tokens)
        assert [e.logprob for e in cut.logprobs] == pytest.approx([e.logprob for e in gen.logprobs[:len(cut.tokens)]],
                                                                  abs=TOL)


def test_bad_logprobs_arguments_are_refused(tiny_target):
    dec = SpeculativeDecoder.from_gguf(tiny_target, None, gamma=0, n_ctx=64, n_threads=1, calibration=None)
    with pytest.raises(ValueError, match=r"logprobs must be None or an int in \[0, 20\]"):
        dec.generate("hi", logprobs=21)
    with pytest.raises(ValueError, match="logprob_mode must be one of model, sampling"):
        dec.generate("hi", logprobs=1, logprob_mode="raw")
    dec.close()


def test_the_kernel_against_numpy():
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(3, 5000)) * 4).astype(np.float32)
    x[1, 10:20] = -np.inf
    tokens = [7, 10, 4999]
    got = row_logprobs(x, tokens, 6, "model", SamplingParams())
    want = np.array([log_softmax(r.astype(np.float64)) for r in x])
    for r, e in enumerate(got):
        assert e.logprob == pytest.approx(want[r, tokens[r]], abs=1e-4)
        assert [t for t, _ in e.top] == list(np.argsort(-want[r], kind="stable")[:6])
    assert got[1].logprob == -np.inf
    p = SamplingParams(temperature=0.7, top_p=0.5)
    got = row_logprobs(x, tokens, 3, "sampling", p)
    dist = expected_distribution(x[0].astype(np.float64), params=p)
    assert [t for t, _ in got[0].top] == list(np.argsort(-dist, kind="stable")[:3])
    assert got[0].top[0][1] == pytest.approx(np.log(dist.max()), abs=1e-4)


@pytest.mark.parametrize("cls", [SpeculativeDecoder, BatchedDecoder])
def test_ignore_eos_leaves_the_models_logprobs_alone(tiny_target, tiny_draft, reference, cls):
    """ignore_eos bans the end-of-generation ids from sampling; "model"
    log-probabilities are still the model's own, end-of-generation included
    (checked where the model itself had ended: its end is likely there)."""
    from specdec_cpu.core.protocols import eog_id_array

    dec = cls.from_gguf(tiny_target, tiny_draft, gamma=3, n_ctx=256, n_threads=1, seed=4, calibration=None)
    eog = eog_id_array(dec.tokenizer, dec.n_vocab)
    prompt, p_end = dec.tokenize("hello"), 0.0
    for seed in range(40):  # a prefix after which the model ended, with its end most likely
        gen = dec.generate(prompt, max_tokens=60, params=SamplingParams(temperature=1.0, seed=seed))
        if gen.finish_reason == "stop":
            ids = prompt + gen.tokens
            p = float(np.exp(log_softmax(reference(ids)))[eog].sum())
            if p > p_end:
                p_end, ended = p, ids
    assert p_end > 0.2  # the ban has something to hide
    params = SamplingParams(temperature=1.0, ignore_eos=True)
    for _ in range(3):
        gen = dec.generate(ended, max_tokens=8, params=params, logprobs=3)
        assert not set(gen.tokens) & set(eog.tolist())
        check(gen, ended, reference, "model", params, 3)
    dec.close()


def test_legacy_offsets_count_characters_of_the_text() -> None:
    """text_offset indexes the completion's text: a character whose bytes span
    two tokens counts once, and chunks of a stream continue one another."""
    from types import SimpleNamespace

    from specdec_cpu.server.responses import LogprobFormatter

    pieces = [b"a", "é".encode()[:1], "é".encode()[1:], "😀".encode()[:2], "😀".encode()[2:], b"b"]
    tokenizer = SimpleNamespace(token_bytes=lambda t: pieces[t])
    fmt = LogprobFormatter(tokenizer, 1, offset=3)
    entries = [TokenLogprob(t, -0.5, ((t, -0.5),)) for t in range(len(pieces))]
    first, rest = fmt.legacy(entries[:2]), fmt.legacy(entries[2:])
    assert first["text_offset"] + rest["text_offset"] == [3, 4, 4, 5, 5, 6]  # "a", "é", "😀" then "b"
    text = "xyz" + b"".join(pieces).decode()
    assert text[6] == "b"
