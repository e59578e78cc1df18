"""The audit of our own speculative decoder on the real Qwen2.5-Coder-0.5B pair.

About two thousand tokens sampled at T = 1 with a fixed γ (so that speculation
runs every step and draft tokens are both accepted and rejected), then
audited against the target's distributions recomputed in batched passes.
Exact sampling must pass at the project's 1e-6 threshold.
"""

from __future__ import annotations

import pytest
from real_models import default_pair

from specdec_cpu import DecoderSettings, SamplingParams, SpeculativeDecoder, engine
from specdec_cpu.audit import GeneratedSequence, audit_sequences
from specdec_cpu.audit.generate import generate_samples
from specdec_cpu.audit.target import TargetModel

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

# Requests that draw replies longer than the token budget, so that few
# samples end early at an end-of-generation token.
PROMPTS = [
    "Write a Python class for a bank account with deposit, withdraw and a transaction history, "
    "with docstrings.",
    "Explain step by step how a hash map handles collisions, with a small example in Python.",
    "Write a command-line tool in Python that counts the words in a file, with argparse and tests.",
    "Compare lists, tuples, sets and dictionaries in Python, with an example of each.",
    "Implement merge sort in Python and explain its running time.",
    "Write a SQL schema for a small library (books, members, loans) and three example queries.",
    "Describe how to write a REST API in Python with input validation and error handling.",
    "Write a JavaScript function that debounces another function, and explain when to use it.",
]
SAMPLES, MAX_TOKENS, GAMMA = 2, 160, 4
ROBUST = 1e-6


def test_our_decoder_passes_the_audit_at_temperature_one():
    target, draft = default_pair()
    params = SamplingParams(temperature=1.0)
    with TargetModel(target, n_batch=256) as model:
        draft_w = engine.LlamaWeights(draft)
        try:
            engine.check_vocab_compatible(model.weights, draft_w)
            decoder = SpeculativeDecoder._over_pair(engine.ModelPair(model.weights, draft_w),
                                                    DecoderSettings(gamma=GAMMA, n_ctx=1024, calibration=None), None)
            prompts = [model.prompt_ids(GeneratedSequence(
                prompt=model.tokenizer.chat_prompt([{"role": "user", "content": text}]), tokens=[]))
                for text in PROMPTS]
            samples, summary = generate_samples(decoder, prompts, samples=SAMPLES, max_tokens=MAX_TOKENS,
                                                params=params, seed=2024)
        finally:
            draft_w.close()
        report = audit_sequences(model, samples, params, threshold=ROBUST)
    st = report.statistics
    print(summary.line())
    print("\n".join(report.lines()))
    # Speculation really ran, with rejections (the residual path).
    assert GAMMA in summary.gammas and summary.drafted > 0 and 0 < summary.accepted < summary.drafted
    assert st is not None and st.tokens >= 1500
    assert report.impossible == [] and report.mismatches == []
    assert st.chi2_p > ROBUST and st.z_p > ROBUST
    assert st.tv[0] == 0.0 and report.verdict == "pass"
