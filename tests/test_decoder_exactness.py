"""Whole-sequence exactness of the decoder over synthetic Markov models.

The first three emitted tokens must follow the target's joint distribution
p(a | prompt) p(b | a) p(c | b) under the sampling parameters, whatever the
draft and γ: that is the whole promise of exact speculative sampling.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from stats_helpers import assert_matches_distribution, expected_distribution
from synthetic import ByteTokenizer, MarkovLM

from specdec_cpu import SamplingParams, SpeculativeDecoder

V = 5
PROMPT = [1, 2]


def joint_of_three(model: MarkovLM, params: SamplingParams) -> np.ndarray:
    """Exact P(first three tokens) of plain sampling from ``model``."""
    joint = np.zeros((V, V, V))
    for a, b, c in itertools.product(range(V), repeat=3):
        pa = expected_distribution(model.row(PROMPT), params=params)[a]
        pb = expected_distribution(model.row(PROMPT + [a]), params=params)[b]
        pc = expected_distribution(model.row(PROMPT + [a, b]), params=params)[c]
        joint[a, b, c] = pa * pb * pc
    return joint


def sample_three(decoder: SpeculativeDecoder, params: SamplingParams, n: int) -> np.ndarray:
    counts = np.zeros((V, V, V))
    for _ in range(n):
        out = decoder.generate(PROMPT, max_tokens=3, params=params).tokens
        counts[tuple(out)] += 1
    return counts


CASES = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=3),
    SamplingParams(temperature=1.0, top_p=0.8),
    SamplingParams(temperature=0.7, top_p=0.9, min_p=0.05),
]


# max_tokens=3 caps γ at 2 (one more token is always emitted): γ = 3 and 6 are
# exercised by test_first_three_tokens_follow_target_at_full_gamma below.
@pytest.mark.parametrize("gamma", [1, 2])
@pytest.mark.parametrize("params", CASES, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}-m{p.min_p}")
def test_first_three_tokens_follow_target(params: SamplingParams, gamma: int) -> None:
    target = MarkovLM(V, order=1, seed=11, scale=1.5)
    draft = MarkovLM(V, order=1, seed=12, scale=1.5)  # a different model: α well below 1
    decoder = SpeculativeDecoder(target, ByteTokenizer(), draft, gamma=gamma, seed=1234 + gamma)
    counts = sample_three(decoder, params, 8000)
    assert_matches_distribution(counts, joint_of_three(target, params), what=f"γ={gamma} {params}")
    stats = decoder.generate(PROMPT, max_tokens=3, params=params).stats
    assert 0.0 < stats.mean_alpha < 1.0


def test_plain_decoding_is_exact() -> None:
    params = SamplingParams(temperature=0.9)
    target = MarkovLM(V, order=1, seed=21)
    decoder = SpeculativeDecoder(target, ByteTokenizer(), None, gamma=0, seed=5)
    counts = sample_three(decoder, params, 8000)
    assert_matches_distribution(counts, joint_of_three(target, params))


def test_draft_with_fewer_vocab_rows_stays_exact() -> None:
    """A draft lacking the target's last ids gives q = 0 there; still exact."""
    params = SamplingParams(temperature=1.0)
    target = MarkovLM(V, order=1, seed=31)
    small = MarkovLM(V - 1, order=1, seed=32)
    draft = MarkovLM(V - 1, order=1, table=np.pad(small.table, ((0, 1), (0, 0))))  # rows for every context id
    decoder = SpeculativeDecoder(target, ByteTokenizer(), draft, gamma=3, seed=7)
    counts = sample_three(decoder, params, 8000)
    assert_matches_distribution(counts, joint_of_three(target, params))


def test_greedy_speculation_equals_greedy_plain() -> None:
    target = MarkovLM(12, order=2, seed=41)
    draft = MarkovLM(12, order=2, seed=42)
    params = SamplingParams(temperature=0.0)
    plain = SpeculativeDecoder(target, ByteTokenizer(), None, gamma=0).generate([3, 4], max_tokens=40, params=params)
    for gamma in (1, 4, 8):
        spec = SpeculativeDecoder(MarkovLM(12, order=2, seed=41), ByteTokenizer(), draft, gamma=gamma)
        assert spec.generate([3, 4], max_tokens=40, params=params).tokens == plain.tokens


FULL_GAMMA_CASES = [
    (3, SamplingParams(temperature=1.0, top_p=0.8)),
    (6, SamplingParams(temperature=1.0)),
    (6, SamplingParams(temperature=0.7, top_p=0.9, min_p=0.05)),
]


@pytest.mark.parametrize("gamma,params", FULL_GAMMA_CASES,
                         ids=lambda c: c if isinstance(c, int) else f"T{c.temperature}-p{c.top_p}-m{c.min_p}")
def test_first_three_tokens_follow_target_at_full_gamma(gamma: int, params: SamplingParams) -> None:
    """With ``max_tokens=3`` the decoder caps the first step's γ at 2 (it never
    drafts past the last token it may emit); ``max_tokens=γ+1`` lets the first
    step draft all γ tokens, which ``stats.gammas`` confirms run by run."""
    target = MarkovLM(V, order=1, seed=11, scale=1.5)
    # A draft close to the target (α ≈ 0.8), so that long drafts are often
    # accepted whole and often rejected part-way.
    noise = np.random.default_rng(13).normal(0.0, 0.4, size=target.table.shape)
    draft = MarkovLM(V, order=1, table=target.table + noise)
    decoder = SpeculativeDecoder(target, ByteTokenizer(), draft, gamma=gamma, seed=4321 + gamma)
    counts = np.zeros((V, V, V))
    all_accepted = 0  # first step accepted all γ drafts (+ bonus): one step in all
    n = 8000
    for _ in range(n):
        gen = decoder.generate(PROMPT, max_tokens=gamma + 1, params=params)
        assert gen.stats.gammas[0] == gamma, gen.stats.gammas
        all_accepted += gen.stats.steps == 1
        counts[tuple(gen.tokens[:3])] += 1
    # Both the bonus path and the rejection (residual) path carry many samples.
    print(f"γ={gamma}: first step accepted all {gamma} drafts in {all_accepted}/{n} runs")
    assert 0.1 * n < all_accepted < 0.9 * n
    assert_matches_distribution(counts, joint_of_three(target, params), what=f"γ={gamma} {params}")


@pytest.mark.parametrize("gamma", [0, 2])
def test_ignore_eos_follows_the_target_without_its_end_token(gamma: int) -> None:
    """``ignore_eos``: token 4 ends generation (it would end ~12% of the 3-token runs);
    with it banned every run emits all 3 tokens, whose joint law is the
    target's with token 4 at probability 0 (renormalised), on the plain path
    and on the drafted one (whose draft still proposes token 4), rejections
    included."""
    eog = 4
    params = SamplingParams(temperature=1.0, ignore_eos=True)
    target = MarkovLM(V, order=1, seed=11, scale=1.5)
    draft = MarkovLM(V, order=1, seed=12, scale=1.5)
    masked = MarkovLM(V, order=1, table=np.where(np.arange(V) == eog, -np.inf, target.table))
    decoder = SpeculativeDecoder(target, ByteTokenizer(eog=eog), draft if gamma else None, gamma=gamma,
                                 seed=99 + gamma)
    counts = np.zeros((V, V, V))
    drafted = accepted = 0
    for _ in range(8000):
        gen = decoder.generate(PROMPT, max_tokens=3, params=params)
        assert len(gen.tokens) == 3 and gen.stats.finish_reason == "length", gen
        counts[tuple(gen.tokens)] += 1
        drafted += gen.stats.drafted
        accepted += gen.stats.accepted
    want = joint_of_three(masked, params)
    unmasked = joint_of_three(target, params)
    assert want[eog].sum() == want[:, eog].sum() == want[:, :, eog].sum() == 0
    assert 1.0 - unmasked[:eog, :eog, :eog].sum() > 0.05  # without the ban, runs would end early
    if gamma:
        assert drafted - accepted > 1000, f"{drafted - accepted} rejections: residual path untested"
    assert_matches_distribution(counts, want, what=f"ignore_eos γ={gamma}")
