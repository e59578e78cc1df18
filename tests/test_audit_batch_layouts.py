"""Why the audit needs a tie tolerance for batched engines, measured on the real target.

A batched engine keeps each sequence in a slot of one unified KV cache shared
with other requests.  Which cells a sequence's tokens land in depends on the
other requests and on every rolled-back draft, and llama.cpp's flash-attention
kernel visits the cells in cell order, accumulating in half precision: the
logits change with the layout.  The audit recomputes each sequence alone, in
position order.  The audit full run found one token at T = 0.7 + top-p 0.95
that was 8th in the audit's row, its mass ahead 0.9573, where in about a third
of random layouts the 7th and 8th tokens (logits 0.006 apart) trade places
and the token is inside the nucleus.

These tests replay a real generation through random multi-sequence layouts
(prefix chunks, drafts rolled back, other sequences joining and leaving) and
check (a) that the layouts do move the logits, (b) by less than the audit's
tie tolerance, measured as the largest change of any difference between two
logits, the quantity ``near_ties.within_tolerance`` allows to move.
"""

from __future__ import annotations

import numpy as np
import pytest
from real_models import default_pair

from specdec_cpu.audit.report import DEFAULT_TIE_TOLERANCE
from specdec_cpu.audit.target import TargetModel
from specdec_cpu.core.protocols import Rows
from specdec_cpu.engine.multi_context import LlamaMultiContext

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

TIE_TOLERANCE = DEFAULT_TIE_TOLERANCE
LAYOUTS = 4


def _replay(ctx: LlamaMultiContext, ids: list, start: int, others: list, rng: np.random.Generator) -> np.ndarray:
    """Decode ``ids`` into slot 0 the way a batched decoder does (the prompt,
    then steps of a few accepted tokens plus rejected drafts, beside three other
    sequences doing the same); the logits row before each of ids[start:]."""
    for s in range(ctx.n_seq):
        ctx.clear(s)
    src = {s: others[int(rng.integers(len(others)))] for s in (1, 2, 3)}
    ctx.decode([Rows(0, ids[:start - 1])] + [Rows(s, src[s][:int(rng.integers(4, 30))]) for s in (1, 2, 3)])
    out = np.zeros((len(ids) - start, ctx.n_vocab), dtype=np.float32)
    while ctx.n_past(0) < len(ids) - 1:
        n0 = ctx.n_past(0)
        k = min(int(rng.integers(1, 6)), len(ids) - n0)
        rejected = [int(t) for t in rng.integers(0, ctx.n_vocab, int(rng.integers(0, 4)))]
        parts, keep = [Rows(0, ids[n0:n0 + k] + rejected, k + len(rejected))], {}
        for s in (1, 2, 3):
            have = ctx.n_past(s)
            if rng.random() < 0.15 or have + 8 >= len(src[s]):  # a request leaves, another takes the slot
                ctx.clear(s)
                src[s], have = others[int(rng.integers(len(others)))], 0
            g = int(rng.integers(1, 6))
            keep[s] = have + g
            parts.append(Rows(s, src[s][have:have + g] + [int(t) for t in rng.integers(0, ctx.n_vocab, 2)], 1))
        rows = ctx.decode(parts)[0].view()
        for j in range(k):  # row j predicts ids[n0 + 1 + j]
            if start <= n0 + 1 + j < len(ids):
                out[n0 + 1 + j - start] = rows[j]
        ctx.truncate(0, n0 + k)
        for s in (1, 2, 3):
            ctx.truncate(s, keep[s])
    return out


def test_cache_layouts_move_logit_differences_by_less_than_the_tie_tolerance():
    target, _ = default_pair()
    rng = np.random.default_rng(7)
    with TargetModel(target, n_batch=256) as model:
        tok = model.tokenizer
        prompt = tok.tokenize(tok.chat_prompt([{"role": "user", "content": "What are good questions to ask at "
                                                "the end of a job interview for a software engineering role?"}]),
                              add_special=True, parse_special=True)
        text = ("1. What does a typical day look like for someone in this role?\n2. How does the team decide "
                "what to build next, and how are code reviews done?\n3. What would success look like")
        emitted = tok.tokenize(text, add_special=False, parse_special=False)
        others = [tok.tokenize(t, add_special=True, parse_special=False) for t in (
            "def merge(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):",
            "The lighthouse keeper climbed the stairs every evening, counting the steps as the storm rose.",
            "SELECT name, SUM(amount) AS total FROM orders GROUP BY name ORDER BY total DESC LIMIT 5;")]
        ((first, reference),) = list(model.rows(prompt, emitted, False, len(prompt) + len(emitted) + 1))
        assert first == 0 and reference.shape[0] == len(emitted)
        ctx = LlamaMultiContext(model.weights, n_seq=4, n_ctx=512, n_batch=256, n_threads=model.n_threads)
        try:
            ids = list(prompt) + list(emitted)
            worst = []
            for _ in range(LAYOUTS):
                d = _replay(ctx, ids, len(prompt), others, rng).astype(np.float64) - reference
                worst.append(float(np.max(d.max(axis=1) - d.min(axis=1))))
        finally:
            ctx.close()
    print("largest change of a logit difference per layout:", [f"{w:.4f}" for w in worst])
    assert min(worst) > 1e-4  # the layouts really change the logits: the audit cannot expect bit-equality
    assert max(worst) < TIE_TOLERANCE
