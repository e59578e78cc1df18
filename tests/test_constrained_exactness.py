"""Constrained decoding is exact under speculation (docs/math.md §11).

A grammar gives each position an allowed set m; the output must follow the
target's sampling distribution of the logits masked to m (mask first, then
temperature, top-k, top-p, min-p), whatever the draft and γ.  Synthetic
Markov models with a small grammar (forced tokens and choice points): the
first tokens' joint law is checked by chi-square, and each case asserts
what it exercised: γ ≥ 2 drafts, rejections (hence rollbacks of the
grammar's state) and forced tokens drafted for free.
"""

from __future__ import annotations

import numpy as np
import pytest
from stats_helpers import assert_matches_distribution, expected_distribution, tally_outcomes
from synthetic import GrammarByteTokenizer, MarkovLM

from specdec_cpu import SamplingParams, SpeculativeDecoder
from specdec_cpu.constraints import Grammar, bitmask, compile_grammar

V, EOS = 6, 5  # tokens a..e, and an end-of-generation token
PROMPT = [0, 1]
#: a choice (a|b|c), a forced "d", a choice (a|b|d), a forced "e", then a
#: choice of "a", "b", or the end: rows with singleton masks between rows of
#: two or three tokens.
GRAMMAR = Grammar.regex("[abc]d[abd]e[ab]?")
N = 4  # the tokens whose joint law is checked (the first four)


def masked_law(model: MarkovLM, tok: GrammarByteTokenizer, params: SamplingParams) -> dict:
    """Exact P(first N tokens) of plain sampling from ``model`` masked by GRAMMAR."""
    compiled = compile_grammar(GRAMMAR, tok.grammar_tokenizer())
    law: dict = {}

    def walk(prefix: tuple, prob: float) -> None:
        if len(prefix) == N or prob == 0.0:
            law[prefix] = law.get(prefix, 0.0) + prob
            return
        state = compiled.new_state()
        assert state.consume(list(prefix)) == len(prefix)
        allowed = bitmask.to_bool(state.mask(), V)
        logits = np.where(allowed, model.row(PROMPT + list(prefix)), -np.inf)
        p = expected_distribution(logits, params=params)
        for t in np.flatnonzero(p > 0):
            walk(prefix + (int(t),), prob * float(p[t]))

    walk((), 1.0)
    return law


CASES = [(2, SamplingParams(temperature=1.0), True), (4, SamplingParams(temperature=1.0), True),
         (3, SamplingParams(temperature=0.7, top_p=0.9), True), (3, SamplingParams(temperature=1.0), False)]


@pytest.mark.parametrize("gamma,params,mask_draft", CASES, ids=["g2", "g4", "g3-T0.7-p0.9", "g3-unmasked-draft"])
def test_constrained_output_follows_the_masked_target(gamma: int, params: SamplingParams, mask_draft: bool) -> None:
    """``mask_draft`` off (the draft samples from its own logits, as a
    measurement of what the mask buys): draft tokens outside the grammar are
    proposed and always rejected, and the output is still exact."""
    tok = GrammarByteTokenizer(V, EOS)
    target = MarkovLM(V, order=1, seed=3, scale=1.5)
    draft = MarkovLM(V, order=1, seed=4, scale=1.5)  # another model: rejections at the choice points
    dec = SpeculativeDecoder(target, tok, draft, gamma=gamma, seed=100 + gamma)
    dec._loop.core.mask_draft = mask_draft
    n = 6000
    t = tally_outcomes(lambda: dec.generate(PROMPT, max_tokens=8, params=params, grammar=GRAMMAR),
                       masked_law(target, tok, params), n, lambda gen: tuple(gen.tokens[:N]))
    print(f"γ={gamma}: {t.forced} forced tokens, {t.drafted} drafted, {t.accepted} accepted")
    assert t.longest >= 2  # steps verified forced and drafted rows together
    assert t.forced > n  # the forced "d" and "e" were drafted for free
    assert t.drafted - t.accepted > 500  # rejections: the grammar's state was rolled back
    assert_matches_distribution(t.counts, t.probs, what=f"constrained, γ={gamma}, {params}")


def test_every_output_is_in_the_language_and_greedy_equals_plain() -> None:
    tok = GrammarByteTokenizer(V, EOS)
    greedy = SamplingParams(temperature=0.0)
    plain = SpeculativeDecoder(MarkovLM(V, order=1, seed=3), tok, gamma=0)
    want = plain.generate(PROMPT, max_tokens=8, params=greedy, grammar=GRAMMAR).tokens
    for gamma in (1, 3, 6):
        spec = SpeculativeDecoder(MarkovLM(V, order=1, seed=3), tok, MarkovLM(V, order=1, seed=4), gamma=gamma)
        assert spec.generate(PROMPT, max_tokens=8, params=greedy, grammar=GRAMMAR).tokens == want
    import re

    sampled = SpeculativeDecoder(MarkovLM(V, order=1, seed=3), tok, MarkovLM(V, order=1, seed=4), gamma=4, seed=1)
    for _ in range(200):
        gen = sampled.generate(PROMPT, max_tokens=8, params=SamplingParams(temperature=1.0), grammar=GRAMMAR)
        assert re.fullmatch("[abc]d[abd]e[ab]?", gen.text) and gen.finish_reason == "stop", gen.text


#: Grammar.choice: options sharing prefixes ("b", "ba", "bad"), so that both a
#: token and the end are allowed at some positions, and forced runs ("cde").
OPTIONS = ["abd", "abe", "b", "ba", "bad", "cdea", "dd"]


def test_a_choice_of_texts_follows_the_masked_target() -> None:
    """``Grammar.choice`` (the server's ``structured_outputs.choice``): the
    law of the whole output, end included, over the options, at γ = 3."""
    choice = Grammar.choice(OPTIONS)
    tok = GrammarByteTokenizer(V, EOS)
    target = MarkovLM(V, order=1, seed=5, scale=1.5)
    compiled = compile_grammar(choice, tok.grammar_tokenizer())
    params = SamplingParams(temperature=1.0)
    law: dict = {}

    def walk(prefix: tuple, prob: float) -> None:  # to the end token: the option is complete
        if prefix and prefix[-1] == EOS:
            law[prefix[:-1]] = law.get(prefix[:-1], 0.0) + prob
            return
        state = compiled.new_state()
        assert state.consume(list(prefix)) == len(prefix)
        allowed = bitmask.to_bool(state.mask(), V)
        p = expected_distribution(np.where(allowed, target.row(PROMPT + list(prefix)), -np.inf), params=params)
        for t in np.flatnonzero(p > 0):
            walk(prefix + (int(t),), prob * float(p[t]))

    walk((), 1.0)
    assert sorted("".join(chr(ord("a") + t) for t in o) for o in law) == sorted(OPTIONS)
    dec = SpeculativeDecoder(target, tok, MarkovLM(V, order=1, seed=6, scale=1.5), gamma=3, seed=7)
    n = 6000

    def generate():
        gen = dec.generate(PROMPT, max_tokens=8, params=params, grammar=choice)
        assert gen.finish_reason == "stop" and gen.text in OPTIONS, gen.text
        return gen

    t = tally_outcomes(generate, law, n, lambda gen: tuple(gen.tokens))
    print(f"choice: {t.forced} forced tokens, {t.drafted} drafted, {t.accepted} accepted")
    assert t.longest == 3 and t.forced > 500 and t.drafted - t.accepted > 500
    assert_matches_distribution(t.counts, t.probs, what="Grammar.choice, γ=3")
