"""A grammar that applies after a trigger token (``constraints.Triggered``,
llama.cpp's lazy grammar) is exact under speculation.

The law: every position up to and including the first trigger token is
drawn from the target; every later one from the target masked by the
grammar, run from the position after the trigger.  A step whose accepted
drafts hold the trigger keeps its tokens up to it (the ones after were
verified unmasked), so the case asserts that such cuts happened, besides
γ ≥ 2 drafts, rejections and forced tokens drafted for free after the
trigger.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from stats_helpers import assert_matches_distribution, expected_distribution, tally_outcomes
from synthetic import GrammarByteTokenizer, MarkovLM

from specdec_cpu import BatchedDecoder, SamplingParams, SpeculativeDecoder
from specdec_cpu.constraints import Grammar, Triggered, bitmask, compile_grammar
from specdec_cpu.core import step

V, EOS = 6, 5  # tokens a..e, and an end-of-generation token
PROMPT = [0, 1]
TRIGGER = 4  # "e": free text before it, the grammar after it
AFTER = Grammar.regex("[ab]d[ab]?")  # a choice, a forced "d", a choice or the end
N = 4  # the tokens whose joint law is checked (an end before them counts as a token)


def triggered_law(model: MarkovLM, tok: GrammarByteTokenizer, params: SamplingParams) -> dict:
    """Exact P(first N tokens) of plain sampling from ``model``, masked by AFTER after the first TRIGGER."""
    compiled = compile_grammar(AFTER, tok.grammar_tokenizer())
    law: dict = {}

    def walk(prefix: tuple, prob: float) -> None:
        if len(prefix) == N or (prefix and prefix[-1] == EOS):
            law[prefix] = law.get(prefix, 0.0) + prob
            return
        logits = model.row(PROMPT + list(prefix))
        if TRIGGER in prefix:
            after = list(prefix[prefix.index(TRIGGER) + 1:])
            state = compiled.new_state()
            assert state.consume(after) == len(after)
            logits = np.where(bitmask.to_bool(state.mask(), V), logits, -np.inf)
        p = expected_distribution(logits, params=params)
        for t in np.flatnonzero(p > 0):
            walk(prefix + (int(t),), prob * float(p[t]))

    walk((), 1.0)
    return law


@pytest.mark.parametrize("gamma,params", [(3, SamplingParams(temperature=1.0)),
                                          (5, SamplingParams(temperature=0.8, top_p=0.9))], ids=["g3", "g5-T0.8-p0.9"])
def test_triggered_grammar_follows_the_target_then_the_masked_target(gamma, params, monkeypatch) -> None:
    tok = GrammarByteTokenizer(V, EOS)
    target = MarkovLM(V, order=1, seed=3, scale=1.5)
    draft = MarkovLM(V, order=1, seed=4, scale=1.5)  # another model: rejections
    cuts = []

    def counting(new, n_acc, trigger):
        kept = step_cut(new, n_acc, trigger)
        cuts.append(len(new) - len(kept[0]))
        return kept

    step_cut = step._cut_after
    monkeypatch.setattr(step, "_cut_after", counting)
    dec = SpeculativeDecoder(target, tok, draft, gamma=gamma, seed=200 + gamma)

    def first_tokens(gen) -> tuple:
        first = tuple(gen.tokens[:N])
        if len(first) < N:  # an end before N tokens counts as one
            assert gen.finish_reason == "stop"
            first += (EOS,)
        return first

    t = tally_outcomes(lambda: dec.generate(PROMPT, max_tokens=8, params=params, grammar=Triggered(AFTER, TRIGGER)),
                       triggered_law(target, tok, params), 6000, first_tokens)
    cut = sum(1 for c in cuts if c > 0)
    print(f"γ={gamma}: {cut} steps cut after the trigger, {t.forced} forced, {t.drafted} drafted, "
          f"{t.accepted} accepted")
    assert t.longest == gamma  # steps drafted γ tokens
    assert cut > 200  # accepted drafts after a trigger were dropped and sampled again under the grammar
    assert t.forced > 500  # the forced "d" after the trigger was drafted for free
    assert t.drafted - t.accepted > 500  # rejections
    assert_matches_distribution(t.counts, t.probs, what=f"triggered grammar, γ={gamma}, {params}")


def test_before_the_trigger_nothing_is_masked_and_after_it_the_grammar_holds() -> None:
    tok = GrammarByteTokenizer(V, EOS)
    dec = SpeculativeDecoder(MarkovLM(V, order=1, seed=3), tok, MarkovLM(V, order=1, seed=4), gamma=4, seed=1)
    seen_free = False
    for _ in range(300):
        gen = dec.generate(PROMPT, max_tokens=12, params=SamplingParams(temperature=1.0),
                           grammar=Triggered(AFTER, TRIGGER))
        text = gen.text
        if "e" in text:
            after = text[text.index("e") + 1:]
            if gen.finish_reason == "stop":
                assert re.fullmatch("[ab]d[ab]?", after), text
            else:  # max_tokens came first: a beginning of the grammar's language
                assert gen.finish_reason == "length" and re.fullmatch("([ab](d[ab]?)?)?", after), text
        seen_free |= "c" in text or "d" in text.split("e")[0]
    assert seen_free  # the text before the trigger is not held to the grammar
    with pytest.raises(ValueError, match=r"Triggered.token must be a token id"):
        Triggered(AFTER, -1)
    assert Triggered(AFTER, np.int64(TRIGGER)).token == TRIGGER
    with pytest.raises(ValueError, match=r"grammar: trigger token id 6 is outside the vocabulary \[0, 6\)"):
        dec.generate(PROMPT, max_tokens=4, grammar=Triggered(AFTER, 6))


def test_triggered_grammar_in_a_batch_of_gguf_requests(tiny_target, tiny_draft) -> None:
    """Through llama.cpp with other requests in the same passes: after the trigger token every output follows
    the grammar; requests without it are untouched."""
    with BatchedDecoder.from_gguf(tiny_target, tiny_draft, gamma=3, max_sequences=4, n_ctx=256, n_threads=1,
                                  seed=4, calibration=None) as dec:
        params = SamplingParams(temperature=1.0)
        free = [t for _ in range(4) for t in dec.generate("the cat is on", max_tokens=40, params=params).tokens]
        trigger = [max(set(free), key=free.count)]  # the token the model writes most: triggers often
        grammar = Triggered(Grammar.regex(" (yes|no)\\."), trigger[0])
        triggered = 0
        for _ in range(8):
            streams = [dec.stream("the cat is on", max_tokens=40, params=params, grammar=grammar),
                       dec.stream("and then", max_tokens=20, params=params)]
            for s in streams:
                "".join(s)
            gen = streams[0].result
            if trigger[0] in gen.tokens:
                triggered += 1
                after = gen.tokens[gen.tokens.index(trigger[0]) + 1:]
                text = b"".join(dec.tokenizer.token_bytes(t) for t in after).decode()
                if gen.finish_reason == "stop":
                    assert text in (" yes.", " no."), gen.text
                else:  # max_tokens came first: a beginning of one
                    assert gen.finish_reason == "length" and any(w.startswith(text) for w in (" yes.", " no.")), text
        assert triggered > 0


def test_drafts_dropped_after_a_trigger_count_neither_as_drafted_nor_as_rejected() -> None:
    """A draft that is the target accepts everything: with the cuts, still every counted draft is accepted
    (the rows after a trigger were abandoned, not rejected), and α stays 1."""
    tok = GrammarByteTokenizer(V, EOS)
    model = MarkovLM(V, order=1, seed=3, scale=1.5)
    dec = SpeculativeDecoder(model, tok, model, gamma=4, seed=9)
    drafted = accepted = triggered = 0
    for _ in range(200):
        gen = dec.generate(PROMPT, max_tokens=10, params=SamplingParams(temperature=1.0),
                           grammar=Triggered(AFTER, TRIGGER))
        drafted, accepted = drafted + gen.stats.drafted, accepted + gen.stats.accepted
        triggered += TRIGGER in gen.tokens
        assert gen.stats.mean_alpha == pytest.approx(1.0) or gen.stats.drafted == 0
    assert triggered > 50 and drafted > 0 and accepted == drafted
