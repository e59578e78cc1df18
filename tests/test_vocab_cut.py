"""A draft cut to part of its vocabulary (engine/vocab_cut.py, drafters/vocab_map.py).

The exactness of decoding with a cut draft is checked by chi-square in
test_decoder_exactness_gguf.py (SpeculativeDecoder) and below (BatchedDecoder).
"""

from __future__ import annotations

import numpy as np
import pytest
from stats_helpers import assert_matches_distribution, expected_distribution
from test_batched_exactness import _first_counts, _merge_eog

from specdec_cpu import BatchedDecoder, ModelLoadError, SamplingParams, SpeculativeDecoder, engine, sampling
from specdec_cpu.drafters.vocab_map import DraftVocab

CUT = 300  # of tiny_draft's 384 ids; its control tokens (310-313) come after a gap
CONTROLS = [310, 311, 312, 313]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def cut(tiny_draft, cache) -> str:
    return engine.cached_cut(tiny_draft, CUT)


def test_a_cut_keeps_the_first_ids_and_the_control_tokens(tiny_target, tiny_draft, cut, cache) -> None:
    with engine.LlamaWeights(cut) as w, engine.LlamaWeights(tiny_draft) as full, \
            engine.LlamaWeights(tiny_target) as target:
        assert list(w.source_ids) == list(range(CUT)) + CONTROLS and w.n_vocab == CUT + 4
        assert w.n_input_ids == 384 and full.source_ids is None and full.input_map is None
        # Source ids read as the cut's own; an id it lacks as the stand-in (the space "Ġ": id 32 here).
        assert w.input_map[5] == 5 and w.input_map[312] == CUT + 2 and w.input_map[350] == 32
        engine.check_vocab_compatible(target, w)  # each token's text matches its source id's
        # The same logits over the ids it keeps, for a text of kept ids.
        tokens = [5, 77, 220, 310, 140, 9, 299]
        ctx_a, ctx_b = engine.LlamaContext(w, n_ctx=64, n_threads=1), engine.LlamaContext(full, n_ctx=64, n_threads=1)
        a, b = ctx_a.eval(tokens, len(tokens)), ctx_b.eval(tokens, len(tokens))
        np.testing.assert_allclose(a, b[:, w.source_ids], rtol=1e-5, atol=1e-5)
    assert engine.cached_cut(tiny_draft, CUT) == cut  # written once, then reused
    assert len(list((cache / "drafts").iterdir())) == 1


def test_bad_cuts_are_refused_with_the_argument_named(tiny_target, tiny_draft, cut) -> None:
    for n in (0, 384, 10**6):
        with pytest.raises(ValueError, match=f"draft_vocab={n}|draft_vocab must be"):
            SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, draft_vocab=n)
    with pytest.raises(TypeError, match="draft_vocab must be an int"):
        BatchedDecoder.from_gguf(tiny_target, tiny_draft, draft_vocab="300")
    with pytest.raises(ValueError, match="draft_vocab needs a draft model"):
        BatchedDecoder.from_gguf(tiny_target, None, draft_vocab=CUT)
    with pytest.raises(ModelLoadError, match="already a cut"):
        engine.cut_vocab(cut, cut + ".again.gguf", 100)
    with pytest.raises(ValueError, match="draft_vocab=10: a cut to 10 ids keeps none of the tokenizer merges"):
        SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, draft_vocab=10)


def test_q_rows_are_laid_out_over_the_target_ids() -> None:
    ids = np.array(list(range(6)) + [9, 10, 14])
    vocab = DraftVocab(len(ids), 16, ids)
    assert vocab.runs == [(0, 0, 6), (9, 6, 2), (14, 8, 1)]
    logits = np.linspace(-1.0, 1.5, len(ids)).astype(np.float32)
    params = SamplingParams(temperature=0.9, top_k=7)
    want = expected_distribution(logits.astype(np.float64), params=params)
    rng = sampling.Rng(7, sampling.DRAFT_STREAM)
    q = np.zeros((400, 16), dtype=np.float32)
    drawn = [vocab.sample_into(logits, params, rng, q[i]) for i in range(400)]
    for row, tok in zip(q, drawn):
        np.testing.assert_allclose(row[ids], want, atol=1e-6)  # q over the draft's columns, at their ids
        assert row.sum() == pytest.approx(1.0, abs=1e-5) and row[tok] > 0
    assert set(drawn) <= set(ids[want > 0].tolist()) and {9, 10, 14} & set(drawn)
    with pytest.raises(ValueError, match="source_ids"):
        DraftVocab(3, 16, np.array([0, 1, 16]))


def test_batched_requests_with_a_cut_draft_follow_the_target(tiny_target, tiny_draft, cache) -> None:
    """First tokens of T = 1 requests drafted by a cut draft, many in flight,
    against the target's own law; ids the cut lacks come from the residual."""
    prompt, params, gamma, n = "the world is", SamplingParams(temperature=1.0), 3, 2000
    with engine.LlamaWeights(tiny_target) as w:
        ctx = engine.LlamaContext(w, n_ctx=64, n_threads=1, flash_attn=True)  # the batched context's kernel
        tok = engine.LlamaTokenizer(w)
        p = expected_distribution(ctx.eval(tok.tokenize(prompt), 1)[0].astype(np.float64), params=params)
        eog = sorted(tok.eog_ids)
    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, draft_vocab=CUT, max_sequences=8, n_ctx=128,
                                  n_threads=1, seed=11, max_queue=10**6) as dec:
        gens = [dec.stream(prompt, max_tokens=gamma + 1, params=params, gamma=gamma) for _ in range(n)]
        for s in gens:
            list(s)
        gens = [s.result for s in gens]
    drafted_first = [g for g in gens if g.stats.gammas and g.stats.gammas[0] == gamma]
    assert len(drafted_first) > 0.6 * n, f"γ = {gamma} ran first in {len(drafted_first)} requests"
    rejected = sum(g.stats.drafted - g.stats.accepted for g in gens)
    assert rejected > 100, f"only {rejected} rejections: the residual path untested"
    counts = _first_counts(gens, p.size, eog)
    assert counts[CUT:].sum() - counts[CONTROLS].sum() > 50, "ids the cut lacks were not emitted"
    assert_matches_distribution(counts, _merge_eog(p, eog), what="first tokens, cut draft")
