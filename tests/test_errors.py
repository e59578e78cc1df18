"""Every bad input gives its own error naming the culprit, never a crash or a
hang, and the decoder that saw it gives a fresh decoder's output next."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from synthetic import ByteTokenizer, MarkovLM

from specdec_cpu import (
    BatchedDecoder,
    ContextOverflowError,
    DecoderClosedError,
    GenerationCancelled,
    InvalidLogitsError,
    InvalidPromptError,
    ModelLoadError,
    SamplingParams,
    SpecDecError,
    SpeculativeDecoder,
    VocabMismatchError,
)

V = 8
T1 = SamplingParams(temperature=1.0, seed=5)
GREEDY = SamplingParams(temperature=0.0, seed=5)


class PoisonedLM(MarkovLM):
    """A Markov model whose ``at``-th eval call (0-based) returns ``value``
    at ``token`` in its first row, once (verification stops reading rows at
    the first rejection, but always reads the first)."""

    def __init__(self, *args, at: int, value: float = math.nan, token: int = 3, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.at, self.value, self.token = at, value, token
        self.calls = 0

    def eval(self, tokens, n_logits=1):
        out = super().eval(tokens, n_logits)
        self.calls += 1
        if self.calls - 1 == self.at:
            out = out.copy()
            out[0, self.token] = self.value
        return out


def synthetic(target_cls=MarkovLM, draft_cls=MarkovLM, *, gamma=3, target_kw=None, draft_kw=None, seed=0):
    target = target_cls(V, order=2, seed=1, **(target_kw or {}))
    draft = draft_cls(V, order=2, seed=2, **(draft_kw or {}))
    return SpeculativeDecoder(target, ByteTokenizer(), draft, gamma=gamma, seed=seed)


def fresh_output(prompt, **kwargs):
    return synthetic().generate(prompt, **kwargs).tokens


# ---------------------------------------------------------------------------
# the hierarchy
# ---------------------------------------------------------------------------


def test_error_hierarchy() -> None:
    for cls in (ModelLoadError, VocabMismatchError, ContextOverflowError, InvalidLogitsError,
                InvalidPromptError, GenerationCancelled, DecoderClosedError):
        assert issubclass(cls, SpecDecError)
    assert issubclass(InvalidLogitsError, ValueError) and issubclass(InvalidPromptError, ValueError)
    exc = GenerationCancelled("stopped", partial=None, reason="timeout")
    back = pickle.loads(pickle.dumps(exc))
    assert str(back) == "stopped" and back.reason == "timeout" and back.partial is None
    back = pickle.loads(pickle.dumps(DecoderClosedError("closed", partial="so far")))
    assert isinstance(back, DecoderClosedError) and str(back) == "closed" and back.partial == "so far"


# ---------------------------------------------------------------------------
# model files
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good(tiny_target, tiny_draft):
    """A working decoder loaded before any bad file is tried."""
    return SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, gamma=3, n_ctx=256, n_threads=1, seed=1)


def _bad_files(tmp_path, request):
    return {
        "missing": (str(tmp_path / "missing.gguf"), "not found"),
        "directory": (str(tmp_path), "directory"),
        "empty": (request.getfixturevalue("empty_gguf"), "empty"),
        "not gguf": (request.getfixturevalue("non_gguf"), "not a GGUF"),
        "truncated": (request.getfixturevalue("truncated_gguf"), "file bounds|truncated|corrupt"),
        "unknown architecture": (request.getfixturevalue("unknown_arch_gguf"), "nosucharch"),
    }


@pytest.mark.parametrize("case", ["missing", "directory", "empty", "not gguf", "truncated",
                                  "unknown architecture"])
@pytest.mark.parametrize("role", ["target", "draft"])
def test_bad_model_files(case, role, tmp_path, request, tiny_target, good) -> None:
    path, why = _bad_files(tmp_path, request)[case]
    want = good.generate("hello", max_tokens=12, params=T1).tokens
    args = (path, None) if role == "target" else (tiny_target, path)
    with pytest.raises(ModelLoadError, match=why) as info:
        SpeculativeDecoder.from_gguf(*args, n_ctx=256, n_threads=1)
    assert path in str(info.value)
    with pytest.raises(ModelLoadError, match=why):
        BatchedDecoder.from_gguf(*args, max_sequences=2, n_ctx=256, n_threads=1)
    # nothing else in the process is affected
    assert good.generate("hello", max_tokens=12, params=T1).tokens == want


def test_mismatched_vocabularies(tiny_target, tiny_mismatched_draft) -> None:
    for load in (lambda: SpeculativeDecoder.from_gguf(tiny_target, tiny_mismatched_draft, n_ctx=256),
                 lambda: BatchedDecoder.from_gguf(tiny_target, tiny_mismatched_draft, max_sequences=2, n_ctx=256)):
        with pytest.raises(VocabMismatchError) as info:
            load()
        msg = str(info.value)
        assert "first differing id" in msg
        assert tiny_target in msg and tiny_mismatched_draft in msg


@pytest.mark.parametrize("kwargs, name", [
    ({"n_threads": 0}, "n_threads"), ({"n_threads": -2}, "n_threads"),
    ({"n_ctx": 0}, "n_ctx"), ({"n_ctx": -1}, "n_ctx"),
    ({"n_batch": 0}, "n_batch"),
    ({"gamma": 65}, "gamma"), ({"gamma": -1}, "gamma"), ({"gamma": "fast"}, "gamma"),
    ({"gamma_max": 0}, "gamma_max"), ({"gamma_max": 65}, "gamma_max"),
    ({"calibration": "sometimes"}, "calibration"),
])
def test_bad_load_arguments(tiny_target, tiny_draft, kwargs, name) -> None:
    with pytest.raises(ValueError, match=name):
        SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, **{"n_ctx": 128, **kwargs})
    with pytest.raises(ValueError, match=name):
        BatchedDecoder.from_gguf(tiny_target, tiny_draft, **{"n_ctx": 128, "max_sequences": 2, **kwargs})


@pytest.mark.parametrize("kwargs", [{"n_threads": 1.5}, {"n_ctx": "big"}, {"n_threads": True}])
def test_bad_load_argument_types(tiny_target, kwargs) -> None:
    with pytest.raises(TypeError, match=next(iter(kwargs))):
        SpeculativeDecoder.from_gguf(tiny_target, **kwargs)


@pytest.mark.parametrize("size", [0, -1, 1.5, True, "4", 257])
def test_bad_batch_size(tiny_target, size) -> None:
    with pytest.raises((ValueError, TypeError), match="max_sequences"):
        BatchedDecoder.from_gguf(tiny_target, max_sequences=size)


@pytest.mark.parametrize("load", ["SpeculativeDecoder", "BatchedDecoder"])
def test_unknown_load_keyword(tiny_target, load) -> None:
    cls = {"SpeculativeDecoder": SpeculativeDecoder, "BatchedDecoder": BatchedDecoder}[load]
    with pytest.raises(TypeError, match=r"n_thread \(did you mean n_threads\?\)"):
        cls.from_gguf(tiny_target, n_thread=2)


# ---------------------------------------------------------------------------
# prompts, on a real model and on a synthetic one
# ---------------------------------------------------------------------------


def _prompt_cases(dec):
    n_ctx = dec.target.n_ctx
    return [
        ("", InvalidPromptError, "empty"),
        (b"", InvalidPromptError, "empty"),
        ([], InvalidPromptError, "empty"),
        ("ab\ud800cd", InvalidPromptError, "index 2.*surrogate"),
        ("\udfff", InvalidPromptError, "index 0"),
        (b"ok \xff\xfe", InvalidPromptError, "UTF-8.*byte 3"),
        (b"\xe2\x82", InvalidPromptError, "UTF-8"),
        ([1, dec.target.n_vocab], InvalidPromptError, f"{dec.target.n_vocab}.*prompt\\[1\\].*vocabulary"),
        ([-1], InvalidPromptError, "-1.*vocabulary"),
        ([1, 2.5], TypeError, r"prompt\[1\]"),
        ([1, True], TypeError, r"prompt\[1\]"),
        (["a"], TypeError, r"prompt\[0\]"),
        (None, TypeError, "prompt must be"),
        (7, TypeError, "prompt must be"),
        ([1] * (n_ctx + 1), ContextOverflowError, f"{n_ctx + 1} tokens.*holds {n_ctx}"),
    ]


def _check_prompt_errors(dec, prompt_ok, params, want) -> None:
    for prompt, exc, match in _prompt_cases(dec):
        with pytest.raises(exc, match=match):
            dec.generate(prompt, max_tokens=8, params=params)
        with pytest.raises(exc, match=match):
            dec.stream(prompt, max_tokens=8, params=params)  # raised at the call, not the first piece
        assert dec.generate(prompt_ok, max_tokens=16, params=params).tokens == want


def test_bad_prompts_synthetic() -> None:
    dec = synthetic()
    want = fresh_output([1, 2], max_tokens=16, params=T1)
    _check_prompt_errors(dec, [1, 2], T1, want)


def test_bad_prompts_gguf(tiny_target, tiny_draft) -> None:
    dec = SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, gamma=3, n_ctx=64, n_threads=1)
    want = dec.generate("hello", max_tokens=16, params=T1).tokens
    _check_prompt_errors(dec, "hello", T1, want)
    long_text = "hello world " * 40
    with pytest.raises(ContextOverflowError, match="holds 64"):
        dec.generate(long_text, max_tokens=4)
    # bytes and numpy prompts are what their text / ids say
    assert dec.generate("hello".encode(), max_tokens=16, params=T1).tokens == want
    ids = dec.tokenizer.tokenize("hello")
    assert dec.generate(np.array(ids, dtype=np.int32), max_tokens=16, params=T1).tokens == want


def test_prompt_filling_the_context_exactly(tiny_target) -> None:
    dec = SpeculativeDecoder.from_gguf(tiny_target, None, gamma=0, n_ctx=32, n_threads=1)
    gen = dec.generate(list(range(5, 37)), max_tokens=10, params=T1)
    assert gen.finish_reason in ("context", "stop") and len(gen.tokens) <= 1


# ---------------------------------------------------------------------------
# request arguments
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"max_tokens": 0}, ValueError, "max_tokens"),
    ({"max_tokens": -3}, ValueError, "max_tokens"),
    ({"max_tokens": 2.0}, ValueError, "max_tokens"),
    ({"gamma": 65}, ValueError, "gamma"),
    ({"gamma": -1}, ValueError, "gamma"),
    ({"gamma": 2.5}, ValueError, "gamma"),
    ({"gamma": True}, ValueError, "gamma"),
    ({"gamma": "fast"}, ValueError, "gamma"),
    ({"params": {"temperature": 1}}, TypeError, "SamplingParams"),
    ({"timeout": 0}, ValueError, "timeout"),
    ({"timeout": -1.0}, ValueError, "timeout"),
    ({"timeout": math.nan}, ValueError, "timeout"),
    ({"timeout": "1"}, TypeError, "timeout"),
    ({"cancel": True}, TypeError, "cancel"),
    ({"stop": [""]}, ValueError, "stop"),
    ({"stop": [3]}, ValueError, "stop"),
])
def test_bad_request_arguments(kwargs, exc, match) -> None:
    dec = synthetic()
    with pytest.raises(exc, match=match):
        dec.generate([1, 2], **kwargs)
    with pytest.raises(exc, match=match):
        dec.stream([1, 2], **kwargs)
    assert dec.generate([1, 2], max_tokens=12, params=T1).tokens == fresh_output([1, 2], max_tokens=12, params=T1)


def test_gamma_needs_a_drafter() -> None:
    dec = SpeculativeDecoder(MarkovLM(V, seed=1), ByteTokenizer(), gamma=0)
    with pytest.raises(ValueError, match="drafter"):
        dec.generate([1], gamma=3)
    with pytest.raises(ValueError, match="drafter"):
        SpeculativeDecoder(MarkovLM(V, seed=1), ByteTokenizer(), gamma=2)


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"temperature": -0.1}, ValueError, "temperature"),
    ({"temperature": math.nan}, ValueError, "temperature"),
    ({"temperature": math.inf}, ValueError, "temperature"),
    ({"temperature": "1"}, TypeError, "temperature"),
    ({"temperature": None}, TypeError, "temperature"),
    ({"top_k": -1}, ValueError, "top_k"),
    ({"top_k": 1.5}, TypeError, "top_k"),
    ({"top_k": True}, TypeError, "top_k"),
    ({"top_p": 0.0}, ValueError, "top_p"),
    ({"top_p": -0.5}, ValueError, "top_p"),
    ({"top_p": 1.01}, ValueError, "top_p"),
    ({"top_p": math.nan}, ValueError, "top_p"),
    ({"top_p": "0.9"}, TypeError, "top_p"),
    ({"min_p": -0.01}, ValueError, "min_p"),
    ({"min_p": 1.0}, ValueError, "min_p"),
    ({"min_p": math.inf}, ValueError, "min_p"),
    ({"seed": -1}, ValueError, "seed"),
    ({"seed": 2**64}, ValueError, "seed"),
    ({"seed": 1.0}, TypeError, "seed"),
    ({"seed": False}, TypeError, "seed"),
    ({"logit_bias": "ab"}, TypeError, r"logit_bias must map token ids to numbers .*got 'ab'"),
    ({"logit_bias": [(1,)]}, TypeError, r"logit_bias must map token ids to numbers .*got \[\(1,\)\]"),
    ({"logit_bias": [(1, 2, 3)]}, TypeError, "logit_bias must map token ids to numbers"),
    ({"logit_bias": 5}, TypeError, "logit_bias must map token ids to numbers"),
    ({"logit_bias": {1: 101}}, ValueError, r"logit_bias\[1\] must be in \[-100, 100\]"),
])
def test_sampling_parameters_out_of_range(kwargs, exc, match) -> None:
    with pytest.raises(exc, match=match):
        SamplingParams(**kwargs)


def test_sampling_parameter_edges_are_accepted() -> None:
    for kwargs in ({"temperature": 0.0}, {"top_k": 0}, {"top_p": 1.0}, {"min_p": 0.0},
                   {"seed": 0}, {"seed": 2**64 - 1}, {"temperature": 1e-8}, {"temperature": 1e8},
                   {"top_k": 10**9}):
        dec = synthetic()
        assert len(dec.generate([1, 2], max_tokens=5, params=SamplingParams(**kwargs)).tokens) == 5


# ---------------------------------------------------------------------------
# NaN / inf logits from a model
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", [math.nan, math.inf])
@pytest.mark.parametrize("gamma", [0, 3])
@pytest.mark.parametrize("params", [T1, GREEDY], ids=["T1", "greedy"])
def test_invalid_target_logits(value, gamma, params) -> None:
    dec = synthetic(target_cls=PoisonedLM, target_kw={"at": 4, "value": value, "token": 5}, gamma=gamma)
    with pytest.raises(InvalidLogitsError) as info:
        dec.generate([1, 2, 3], max_tokens=40, params=params)
    msg = str(info.value)
    kind = "NaN" if math.isnan(value) else "inf"
    assert "target model" in msg and kind in msg and "token 5" in msg and "row" in msg
    assert isinstance(info.value, ValueError)
    assert dec.target.n_past == len(dec._target_lm.tokens(0))
    # the decoder is usable and exact again
    got = dec.generate([4, 5, 6], max_tokens=30, params=params, gamma=gamma).tokens
    assert got == synthetic(gamma=gamma).generate([4, 5, 6], max_tokens=30, params=params).tokens


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_invalid_draft_logits(value) -> None:
    dec = synthetic(draft_cls=PoisonedLM, draft_kw={"at": 3, "value": value, "token": 2})
    with pytest.raises(InvalidLogitsError) as info:
        dec.generate([1, 2, 3], max_tokens=40, params=T1)
    msg = str(info.value)
    assert "draft model" in msg and "token 2" in msg
    got = dec.generate([4, 5, 6], max_tokens=30, params=T1).tokens
    assert got == fresh_output([4, 5, 6], max_tokens=30, params=T1)


def test_invalid_logits_in_a_stream() -> None:
    dec = synthetic(target_cls=PoisonedLM, target_kw={"at": 5})
    stream = dec.stream([1, 2], max_tokens=60, params=T1)
    with pytest.raises(InvalidLogitsError):
        for _ in stream:
            pass
    assert stream.result is not None
    assert dec.generate([1, 2], max_tokens=20, params=T1).tokens == fresh_output([1, 2], max_tokens=20, params=T1)


def test_masked_row_is_an_error() -> None:
    """A row that is entirely -inf has no token to sample."""
    table = np.zeros((V, V), dtype=np.float32)
    table[3, :] = -np.inf
    target = MarkovLM(V, order=1, table=table)
    dec = SpeculativeDecoder(target, ByteTokenizer(), gamma=0, seed=0)
    with pytest.raises(InvalidLogitsError, match="-inf"):
        dec.generate([1, 3], max_tokens=4, params=T1)
    assert len(dec.generate([1, 2], max_tokens=1, params=T1).tokens) == 1


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"temperature": -0.1}, ValueError, "temperature"),
    ({"top_k": 1.5}, TypeError, "top_k"),
    ({"top_p": 0.0}, ValueError, "top_p"),
    ({"min_p": 1.0}, ValueError, "min_p"),
    ({"seed": -1}, ValueError, "seed"),
    ({"ignore_eos": "yes"}, TypeError, "ignore_eos"),
    ({"ignore_eos": 1}, TypeError, "ignore_eos"),
])
def test_sampling_params_name_the_bad_field(kwargs, exc, match) -> None:
    from specdec_cpu import SamplingParams

    with pytest.raises(exc, match=match):
        SamplingParams(**kwargs)
