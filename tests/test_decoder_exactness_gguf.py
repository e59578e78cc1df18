"""Whole-sequence exactness through llama.cpp: a real (tiny) transformer.

The synthetic Markov tests pin the decoding loop; this one runs the same
check where real bugs would hide: batched target passes over γ + 1 rows,
KV-cache rollback after a rejection in both models, and distributions over a
4,096-id vocabulary.  The target has two transformer layers, so its
next-token law depends on the whole context (checked below): feeding a
wrong context after a rollback changes the joint law of the output.

The exact joint law of the first three emitted tokens is enumerated from the
target's own one-row logits and the float64 reference of the sampling chain
(``stats_helpers.expected_distribution``); end-of-generation tokens end a
sequence early and are one outcome; tails too thin to enumerate are one
"other" cell whose probability is what the enumeration leaves.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np
import pytest
from stats_helpers import assert_matches_distribution, expected_distribution

from specdec_cpu import SamplingParams, SpeculativeDecoder, engine
from specdec_cpu.drafters.vocab_map import DraftVocab

EOG = "eog"
FLOOR = 0.01  # branches below this probability are left to the "other" cell
#: The ids a cut of tiny_draft keeps, of 384: its control tokens (ids 310-313)
#: come after a gap, so its q rows are scattered run by run.
CUT = 300
Cell = Tuple[object, ...]

# (sampling parameters, γ): truncated supports of a few ids, and a sharp
# temperature over the whole vocabulary.
CASES = [
    (SamplingParams(temperature=1.0, top_k=4), 2),
    (SamplingParams(temperature=0.8, top_p=0.7), 3),
    (SamplingParams(temperature=0.5), 2),
]


@pytest.fixture(scope="module")
def target_ctx(tiny_wide_target):
    weights = engine.LlamaWeights(tiny_wide_target)
    ctx = engine.LlamaContext(weights, n_ctx=64, n_batch=16, n_threads=1)
    tok = engine.LlamaTokenizer(weights)
    yield ctx, tok
    weights.close()


def next_law(ctx, seq: List[int], params: SamplingParams, eog: List[int]) -> Tuple[np.ndarray, float]:
    """(p over ids with the EOG ids zeroed, total EOG probability) after ``seq``."""
    ctx.reset()
    p = expected_distribution(np.array(ctx.eval(seq, 1)[0]), params=params)
    eog_mass = float(p[eog].sum())
    p[eog] = 0.0
    return p, eog_mass


def exact_joint(ctx, tok, prompt: List[int], params: SamplingParams) -> Dict[Cell, float]:
    """P(first three emitted tokens), over the branches above FLOOR."""
    eog = sorted(tok.eog_ids)
    cells: Dict[Cell, float] = {}

    def walk(prefix: Tuple[int, ...], prob: float) -> None:
        p, eog_mass = next_law(ctx, prompt + list(prefix), params, eog)
        if eog_mass > 0:
            cells[prefix + (EOG,)] = prob * eog_mass
        for t in np.flatnonzero(p >= FLOOR):
            if len(prefix) == 2:
                cells[prefix + (int(t),)] = prob * p[t]
            else:
                walk(prefix + (int(t),), prob * p[t])

    walk((), 1.0)
    return cells


def observed_cell(tokens: List[int], finish_reason: str) -> Cell:
    if len(tokens) >= 3:
        return tuple(tokens[:3])
    assert finish_reason == "stop", (tokens, finish_reason)  # ended at an EOG token
    return tuple(tokens) + (EOG,)


def check_joint_law(target: str, draft: str, ctx, tok, params: SamplingParams, gamma: int, n: int,
                    seed: int, draft_vocab: Optional[int] = None) -> List[List[int]]:
    """Chi-square of the first three tokens of ``n`` generations against the
    exact law; returns the generations' tokens."""
    prompt = tok.tokenize("hello world")
    cells = exact_joint(ctx, tok, prompt, params)
    keys = list(cells)
    index = {k: i for i, k in enumerate(keys)}
    probs = np.array([cells[k] for k in keys] + [max(0.0, 1.0 - sum(cells.values()))])
    probs /= probs.sum()

    decoder = SpeculativeDecoder.from_gguf(target, draft, gamma=gamma, n_ctx=64, n_batch=16,
                                           n_threads=1, seed=seed, calibration=None, draft_vocab=draft_vocab)
    counts = np.zeros(len(probs))
    bonus = 0
    outputs = []
    assert gamma >= 2
    max_tokens = gamma + 1  # the first step drafts all γ tokens; all accepted = one step
    for _ in range(n):
        gen = decoder.generate(prompt, max_tokens=max_tokens, params=params)
        assert gen.stats.gammas[0] == gamma, gen.stats.gammas
        bonus += gen.stats.steps == 1 and len(gen.tokens) == max_tokens
        counts[index.get(observed_cell(gen.tokens, gen.finish_reason), len(keys))] += 1
        outputs.append(gen.tokens)
    print(f"γ={gamma} {params}: {len(keys)} cells (+ other {probs[-1]:.2e}); "
          f"all {gamma} drafts accepted in the first step in {bonus}/{n} runs")
    assert 0 < bonus < n  # both the bonus path and rejections ran
    assert_matches_distribution(counts, probs, what=f"first three tokens, γ={gamma}, {params}")
    return outputs


def test_target_depends_on_more_than_the_last_token(target_ctx):
    ctx, tok = target_ctx
    params = SamplingParams(temperature=1.0)
    a, c, b = tok.tokenize("hello", add_special=False)[0], tok.tokenize("the", add_special=False)[0], 300
    p_ab, _ = next_law(ctx, [a, b], params, [])
    p_cb, _ = next_law(ctx, [c, b], params, [])
    assert 0.5 * np.abs(p_ab - p_cb).sum() > 0.2


def test_supports_take_the_sorted_support_path(target_ctx):
    """The truncated cases below keep at most V/8 ids (the kernels then work on
    a sorted support list, see csrc/kernels/truncate.cpp); the untruncated one
    keeps every id."""
    ctx, tok = target_ctx
    prompt = tok.tokenize("hello world")
    ctx.reset()
    row = np.array(ctx.eval(prompt, 1)[0])
    v = row.size
    for params, limit in ((CASES[0][0], v // 8), (CASES[1][0], v // 8), (CASES[2][0], v)):
        support = np.count_nonzero(expected_distribution(row, params=params))
        assert support <= limit and (limit < v or support == v), (params, support)


@pytest.mark.parametrize("params,gamma", CASES, ids=lambda c: c if isinstance(c, int) else
                         f"T{c.temperature}-k{c.top_k}-p{c.top_p}")
def test_first_three_tokens_follow_target(tiny_wide_target, tiny_wide_draft, target_ctx, params, gamma):
    ctx, tok = target_ctx
    check_joint_law(tiny_wide_target, tiny_wide_draft, ctx, tok, params, gamma, n=2500, seed=100 + gamma)


@pytest.mark.slow
@pytest.mark.parametrize("params,gamma", [(SamplingParams(temperature=1.0, top_k=4), 6),
                                          (SamplingParams(temperature=0.7, top_p=0.9), 4)],
                         ids=["T1.0-k4-g6", "T0.7-p0.9-g4"])
def test_first_three_tokens_follow_target_long_drafts(tiny_wide_target, tiny_wide_draft, target_ctx,
                                                      params, gamma):
    ctx, tok = target_ctx
    check_joint_law(tiny_wide_target, tiny_wide_draft, ctx, tok, params, gamma, n=3000, seed=200 + gamma)


@pytest.mark.parametrize("params,gamma", [CASES[0], CASES[2]], ids=["T1.0-k4", "T0.5"])
def test_a_draft_cut_to_part_of_the_vocabulary_keeps_the_law(tiny_target, tiny_draft, params, gamma,
                                                             tmp_path, monkeypatch):
    """A draft cut to its first CUT ids (engine/vocab_cut.py) never proposes
    the others: they come only from the residual, and the law must hold."""
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))  # where the cut is written
    with engine.LlamaWeights(engine.cached_cut(tiny_draft, CUT)) as cut:
        assert len(DraftVocab(cut.n_vocab, 384, cut.source_ids).runs) == 2
    with engine.LlamaWeights(tiny_target) as weights:
        ctx, tok = engine.LlamaContext(weights, n_ctx=64, n_batch=16, n_threads=1), engine.LlamaTokenizer(weights)
        outputs = check_joint_law(tiny_target, tiny_draft, ctx, tok, params, gamma, n=2500,
                                  seed=300 + gamma, draft_vocab=CUT)
        lacking = sum(t >= CUT and not tok.is_eog(t) for out in outputs for t in out)
    assert lacking > 100, f"only {lacking} emitted tokens the cut draft lacks: the residual-only ids untested"
