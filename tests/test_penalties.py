"""Penalties, biases, min_tokens and stop tokens are exact under speculation
(docs/math.md §12).

The reference is written here from the definitions, independently of
core/penalties.py: at each position the logits are changed from the
tokens before it (presence and frequency over the output, the repeat
penalty over the last ``repeat_last_n`` tokens of prompt and output, the
bias, and a ban of the end token before ``min_tokens``), then sampled
with the pipeline.  The joint law of the first tokens is enumerated and
compared by chi-square with speculative decoding at γ ≥ 2, asserting that
drafts were rejected (so rows continued drafted prefixes with their own
penalties); greedy decoding with penalties is the same at γ = 4 and 0.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from stats_helpers import assert_matches_distribution, expected_distribution
from synthetic import ByteTokenizer, MarkovLM

from specdec_cpu import SamplingParams, SpeculativeDecoder
from specdec_cpu.core.penalties import Penalties

V, EOS = 6, 5
PROMPT = [0, 1, 1]
N = 3  # tokens whose joint law is checked


def penalised(logits: np.ndarray, prompt: list, out: list, p: SamplingParams) -> np.ndarray:
    """The definition: repeat penalty (scale), then presence, frequency, bias; min_tokens bans EOS."""
    x = logits.astype(np.float64).copy()
    if p.repeat_penalty != 1.0 and p.repeat_last_n != 0:
        window = (prompt + out)[-p.repeat_last_n:] if p.repeat_last_n > 0 else prompt + out
        for t in set(window):
            x[t] = x[t] / p.repeat_penalty if x[t] > 0 else x[t] * p.repeat_penalty
    for t, c in Counter(out).items():
        x[t] -= p.presence_penalty + p.frequency_penalty * c
    for t, b in p.logit_bias or ():
        x[t] += b
    if len(out) < p.min_tokens:
        x[[EOS, *p.stop_token_ids]] = -np.inf
    return x


def joint_law(model: MarkovLM, params: SamplingParams) -> dict:
    law: dict = {}

    def walk(out: tuple, prob: float) -> None:
        if len(out) == N:
            law[out] = law.get(out, 0.0) + prob
            return
        p = expected_distribution(penalised(model.row(PROMPT + list(out)), PROMPT, list(out), params),
                                  params=params)
        for t in np.flatnonzero(p > 0):
            if t == EOS:
                law[out + ("end",)] = law.get(out + ("end",), 0.0) + prob * p[t]
            else:
                walk(out + (int(t),), prob * float(p[t]))

    walk((), 1.0)
    return law


PENALTIES = dict(presence_penalty=0.8, frequency_penalty=0.6, repeat_penalty=1.6, repeat_last_n=3,
                 logit_bias={2: 1.2, 3: -1.0})
CASES = [
    (3, SamplingParams(temperature=1.0, **PENALTIES)),
    (4, SamplingParams(temperature=0.8, top_p=0.9, min_tokens=2, **PENALTIES)),
    (2, SamplingParams(temperature=1.0, frequency_penalty=-1.5, repeat_penalty=0.7, repeat_last_n=-1)),
]


@pytest.mark.parametrize("gamma,params", CASES, ids=["T1-g3", "T0.8-p0.9-min2-g4", "negative-g2"])
def test_penalised_output_follows_the_penalised_target(gamma: int, params: SamplingParams) -> None:
    target = MarkovLM(V, order=2, seed=21, scale=1.2)
    draft = MarkovLM(V, order=2, seed=22, scale=1.2)
    law = joint_law(target, params)
    cells = {c: i for i, c in enumerate(law)}
    dec = SpeculativeDecoder(target, ByteTokenizer(eog=EOS), draft, gamma=gamma, seed=40 + gamma)
    counts = np.zeros(len(cells))
    drafted = accepted = longest = 0
    n = 6000
    for _ in range(n):
        gen = dec.generate(PROMPT, max_tokens=gamma + 1, params=params)  # room for γ drafts in the first step
        key = tuple(gen.tokens[:N]) + (("end",) if len(gen.tokens) < N else ())
        assert key in cells, key
        counts[cells[key]] += 1
        drafted, accepted = drafted + gen.stats.drafted, accepted + gen.stats.accepted
        longest = max(longest, max(gen.stats.gammas))
    assert longest == gamma and drafted - accepted > 1000  # rejections: rows after drafted prefixes mattered
    assert_matches_distribution(counts, np.array([law[c] for c in cells]), what=f"penalised, γ={gamma}")


def test_greedy_with_penalties_is_the_same_with_and_without_drafting(tiny_target, tiny_draft) -> None:
    params = SamplingParams(temperature=0.0, presence_penalty=1.0, frequency_penalty=0.5, repeat_penalty=1.3,
                            logit_bias={100: 3.0, 101: -5.0}, min_tokens=5)
    outs = []
    for gamma in (0, 4):
        dec = SpeculativeDecoder.from_gguf(tiny_target, tiny_draft if gamma else None, gamma=gamma, n_ctx=256,
                                           n_threads=1, calibration=None)
        gens = [dec.generate(p, max_tokens=40, params=params) for p in ("hello world", "the cat is")]
        outs.append([g.tokens for g in gens])
        if gamma:
            assert all(g.stats.drafted > 0 and max(g.stats.gammas) == 4 for g in gens)
        dec.close()
    plain = SpeculativeDecoder.from_gguf(tiny_target, None, gamma=0, n_ctx=256, n_threads=1, calibration=None)
    unpenalised = plain.generate("hello world", max_tokens=40, params=SamplingParams(temperature=0.0)).tokens
    plain.close()
    assert outs[0] == outs[1]
    assert outs[0][0] != unpenalised  # the penalties changed the output


def test_stop_token_ids_end_the_generation_and_min_tokens_holds_them_off() -> None:
    target = MarkovLM(V, order=1, seed=3, scale=0.5)
    dec = SpeculativeDecoder(target, ByteTokenizer(eog=EOS), MarkovLM(V, order=1, seed=4), gamma=3, seed=1)
    for _ in range(200):
        gen = dec.generate(PROMPT, max_tokens=20, params=SamplingParams(stop_token_ids=(2,), min_tokens=4))
        assert 2 not in gen.tokens and EOS not in gen.tokens
        assert gen.finish_reason == "length" or len(gen.tokens) >= 4
    with pytest.raises(ValueError, match="stop_token_ids: token id 99 is outside the vocabulary"):
        dec.generate(PROMPT, params=SamplingParams(stop_token_ids=(99,)))
    with pytest.raises(ValueError, match="logit_bias: token id 6 is outside"):
        dec.generate(PROMPT, params=SamplingParams(logit_bias={6: 1.0}))


@pytest.mark.parametrize("extra", [{"min_tokens": 16}, {"min_tokens": 2}, {"min_tokens": 3}, {"ignore_eos": True}],
                         ids=["min_tokens", "min_tokens_within_a_draft", "min_tokens_at_a_draft_end", "ignore_eos"])
def test_a_complete_grammar_output_ends_before_min_tokens(tiny_target, tiny_draft, extra) -> None:
    """A grammar's end outranks min_tokens and ignore_eos: once the output is
    a complete document its mask allows only the end ids, which those would
    ban, leaving no token at all (the request failed with "every token is
    masked").  There the ends stay allowed, the same for p and q; also when
    min_tokens falls inside a draft (its first rows below it, its last not)."""
    from specdec_cpu import Grammar

    dec = SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, gamma=3, n_ctx=256, n_threads=1, calibration=None)
    try:
        for seed in range(6):
            gen = dec.generate("answer:", max_tokens=40, grammar=Grammar.regex("(yes|no)"),
                               params=SamplingParams(temperature=1.0, seed=seed, **extra))
            assert gen.text in ("yes", "no") and gen.finish_reason == "stop", gen
        assert gen.stats.drafted > 0 or gen.stats.forced > 0
    finally:
        dec.close()


def test_penalty_rows_follow_the_draft_prefix() -> None:
    """Unit check of the sparse rows: row j counts the output and draft[:j]."""
    params = SamplingParams(presence_penalty=1.0, frequency_penalty=0.5, repeat_penalty=2.0, repeat_last_n=2,
                            logit_bias={4: 0.25})
    pen = Penalties(params, [3, 3], end_ids=[EOS])
    pen.append([1])
    offsets, ids, pos, neg, add = pen.rows([2, 2], 3)
    rows = [dict(zip(ids[a:b].tolist(), zip(pos[a:b], neg[a:b], add[a:b])))
            for a, b in zip(offsets[:-1], offsets[1:])]
    assert rows[0] == {1: (0.5, 2.0, -1.5), 3: (0.5, 2.0, 0.0), 4: (1.0, 1.0, 0.25)}
    assert rows[1] == {1: (0.5, 2.0, -1.5), 2: (0.5, 2.0, -1.5), 4: (1.0, 1.0, 0.25)}  # window [1, 2]
    assert rows[2] == {1: (1.0, 1.0, -1.5), 2: (0.5, 2.0, -2.0), 4: (1.0, 1.0, 0.25)}  # window [2, 2]
