"""Constrained decoding is exact through llama.cpp (docs/math.md §11).

The synthetic test (test_constrained_exactness.py) pins the loop; this one
runs where real bugs would hide: a byte-level BPE vocabulary (one text has
several tokenizations, and the grammar allows all of them), llguidance's
masks and fast-forward tokens over that vocabulary, batched target passes
and KV rollback after a rejection in both models.

The grammar's language is finite, so the exact law of whole outputs (as
token sequences: a text's several tokenizations are different outcomes)
is enumerated from the target's own one-row logits masked by the grammar
(mask first, then the sampling chain), branch by branch; branches below
FLOOR are one "other" cell.  Each case asserts γ ≥ 2 ran, rejections (grammar rollbacks) and
forced tokens.
"""

from __future__ import annotations

import re
from typing import List

import numpy as np
import pytest
from constraint_helpers import masked_output_law
from stats_helpers import assert_matches_distribution

from specdec_cpu import SamplingParams, SpeculativeDecoder, engine
from specdec_cpu.constraints import Grammar, compile_grammar

FLOOR = 0.005
#: Choices between words (several tokenizations each) with forced text
#: between them: " and " and the closing "!" are the grammar's only way on.
PATTERN = "(hello|help|he|hi|ho|ha) and (world|word|wo|we|wa)!"
GRAMMAR = Grammar.regex(PATTERN)


@pytest.fixture(scope="module")
def target(tiny_target):
    weights = engine.LlamaWeights(tiny_target)
    ctx = engine.LlamaContext(weights, n_ctx=64, n_batch=16, n_threads=1)
    tok = engine.LlamaTokenizer(weights)
    compiled = compile_grammar(GRAMMAR, engine.llg_tokenizer(weights))
    yield ctx, tok, compiled
    weights.close()


CASES = [(SamplingParams(temperature=1.5), 3), (SamplingParams(temperature=2.0, top_p=0.9), 4)]


@pytest.mark.parametrize("params,gamma", CASES, ids=["T1.5-g3", "T2-p0.9-g4"])
def test_constrained_output_through_llama_cpp_follows_the_masked_target(target, tiny_target, tiny_draft,
                                                                        params, gamma):
    ctx, tok, compiled = target
    prompt = tok.tokenize("hello world")
    def row_after(ids: List[int]) -> np.ndarray:
        ctx.reset()
        return np.array(ctx.eval(ids, 1)[0])

    cells = masked_output_law(row_after, compiled, prompt, params, tok.eog_ids, FLOOR)
    keys = list(cells)
    index = {k: i for i, k in enumerate(keys)}
    probs = np.array([cells[k] for k in keys] + [max(0.0, 1.0 - sum(cells.values()))])
    probs /= probs.sum()

    decoder = SpeculativeDecoder.from_gguf(tiny_target, tiny_draft, gamma=gamma, n_ctx=64, n_batch=16,
                                           n_threads=1, seed=11 + gamma, calibration=None)
    counts = np.zeros(len(probs))
    forced = drafted = accepted = longest = 0
    n = 3000
    for _ in range(n):
        gen = decoder.generate(prompt, max_tokens=16, params=params, grammar=GRAMMAR)
        assert re.fullmatch(PATTERN, gen.text) and gen.finish_reason == "stop", gen.text
        counts[index.get(tuple(gen.tokens), len(keys))] += 1
        s = gen.stats
        forced, drafted, accepted = forced + s.forced, drafted + s.drafted, accepted + s.accepted
        longest = max(longest, max(s.gammas))
    decoder.close()
    print(f"{params}, γ={gamma}: {len(keys)} cells; {forced} forced, {drafted} drafted, {accepted} accepted")
    assert longest >= 2 and forced > n and drafted - accepted > n // 10
    assert len(keys) >= 8  # choices with real uncertainty, not a forced path
    assert_matches_distribution(counts, probs, what=f"constrained whole outputs, γ={gamma}, {params}")
