"""Greedy speculative decoding equals greedy plain decoding on the real model,
with the draft model and with prompt lookup (whose reference holds the
joined lines of the wrapped document in the last prompt).

llama.cpp evaluates a position slightly differently in a batch of several
rows than alone (measured: under 0.01 in a logit on F32, up to 0.46 on the
shipped Q4_K_M mix).  So a divergence between the two runs is accepted only
where the plain run's top-2 logit gap at that position is below that noise;
the test reports every such case.
"""

from __future__ import annotations

import numpy as np
import pytest
from real_models import default_pair

from specdec_cpu import SamplingParams, SpeculativeDecoder

pytestmark = pytest.mark.real_model

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain in two sentences what a hash map is.",
    "def quicksort(xs):",
    "Quote the sentence about cleaning from this note, then say how often to do it.\n\n"
    "Unplug the grinder before cleaning. Brush both burrs with the supplied\n"
    "brush; do not wash the burrs in water. Clean the burrs every two weeks\n"
    "with daily use, or after about 2 kg of beans.",
]
NOISE = 0.05  # logit units; F32 batched-vs-single differences are < 0.01
N_TOKENS = 64


@pytest.fixture(scope="module")
def pair():
    target, draft = default_pair()
    plain = SpeculativeDecoder.from_gguf(target, None, gamma=0, n_ctx=512)
    spec = SpeculativeDecoder.from_gguf(target, draft, gamma=5, n_ctx=512)
    lookup = SpeculativeDecoder.from_gguf(target, None, ngram=True, gamma=8, n_ctx=512)
    return plain, {"draft": spec, "ngram": lookup}


def greedy_with_gaps(dec: SpeculativeDecoder, prompt: list[int]) -> tuple[list[int], list[float]]:
    """Plain greedy decoding through the engine, recording the top-2 gap of each row."""
    dec.reset()
    ctx = dec.target
    logits = ctx.eval(prompt, 1)
    tokens, gaps = [], []
    for _ in range(N_TOKENS):
        row = np.asarray(logits[0], dtype=np.float64)
        top2 = np.partition(row, -2)[-2:]
        tok = int(np.argmax(row))
        gaps.append(float(top2[1] - top2[0]))
        tokens.append(tok)
        if dec.tokenizer.is_eog(tok):
            break
        logits = ctx.eval([tok], 1)
    dec.reset()
    ctx.truncate(0)
    return tokens, gaps


@pytest.mark.parametrize("drafter", ["draft", "ngram"])
@pytest.mark.parametrize("text", PROMPTS)
def test_greedy_speculative_matches_plain(pair, text: str, drafter: str) -> None:
    plain, decoders = pair
    spec = decoders[drafter]
    prompt = plain.tokenizer.tokenize(plain.chat_prompt([{"role": "user", "content": text}]))
    expected, gaps = greedy_with_gaps(plain, prompt)
    gen = spec.generate(prompt, max_tokens=N_TOKENS, params=SamplingParams(temperature=0.0))
    got = gen.tokens
    if drafter == "ngram" and "\n" in text:
        assert gen.stats.drafted > 0  # lookup drafts (the joined lines: test_unwrap.py)
    expected_emitted = [t for t in expected if not plain.tokenizer.is_eog(t)]
    if got == expected_emitted:
        return
    i = next(i for i, (a, b) in enumerate(zip(got + [-1], expected_emitted + [-1])) if a != b)
    print(f"divergence at token {i}: plain top-2 gap {gaps[i]:.4f} (noise bound {NOISE})")
    assert gaps[i] < NOISE, (
        f"greedy speculative output diverged from plain at token {i} where the plain run's "
        f"top-2 logit gap is {gaps[i]:.4f} (>= {NOISE}: not batch noise)")
