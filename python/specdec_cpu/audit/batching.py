"""How far llama.cpp's batched logits are from one-row logits, measured.

The audit computes every position's logits in one pass over many rows; an
engine computed them in passes of a few rows (γ + 1 for speculative
decoding, 1 for plain decoding).  llama.cpp's matrix kernels may round
differently with the number of rows, so the two can differ slightly.  This
module measures that difference on the sequences being audited: the same
positions evaluated batched and one row at a time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, Sequence

import numpy as np

from ..params import SamplingParams
from .chains import chain_distribution
from .target import TargetModel

__all__ = ["BatchNoise", "measure_batch_noise"]


@dataclass
class BatchNoise:
    """Largest differences between batched and one-row evaluation of the same positions."""

    positions: int
    max_logit_diff: float
    max_prob_diff: float
    max_tv: float
    flash_attn: bool

    def line(self) -> str:
        return (f"batched vs one-row logits over {self.positions} positions "
                f"(flash attention {'on' if self.flash_attn else 'off'}): max |Δlogit| = "
                f"{self.max_logit_diff:.3g}, max |Δp| = {self.max_prob_diff:.3g}, "
                f"max TV per position = {self.max_tv:.3g}")

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def measure_batch_noise(model: TargetModel, prompts: Sequence[Sequence[int]], emitted: Sequence[Sequence[int]],
                        params: SamplingParams, chain: str, *, limit: int = 64) -> BatchNoise:
    """Compare, for up to ``limit`` emitted positions of the given sequences,
    the logits (and the final distributions under ``params`` and ``chain``)
    of the audit's batched pass with those of one-token passes."""
    from ..engine import LlamaContext  # the only door to llama.cpp

    single = LlamaContext(model.weights, n_ctx=max(len(p) + len(e) for p, e in zip(prompts, emitted)) + 8,
                          n_batch=max(len(p) for p in prompts), n_threads=model.n_threads,
                          flash_attn=model.flash_attn, kv_type=model.kv_type)
    n_ctx = single.n_ctx
    worst_logit = worst_prob = worst_tv = 0.0
    done = 0
    try:
        for prompt, tokens in zip(prompts, emitted):
            if done >= limit:
                break
            take = min(len(tokens), limit - done)
            if take == 0:
                continue
            batched = np.concatenate([np.array(block) for _, block in
                                      model.rows(prompt, tokens[:take], False, n_ctx)])[:take]
            single.reset()
            rows = [np.array(single.eval(list(prompt), 1)[0])]
            for t in tokens[:take - 1]:
                rows.append(np.array(single.eval([t], 1)[0]))
            one = np.stack(rows)
            worst_logit = max(worst_logit, float(np.max(np.abs(batched - one))))
            pb = chain_distribution(batched, params, chain)
            po = chain_distribution(one, params, chain)
            worst_prob = max(worst_prob, float(np.max(np.abs(pb - po))))
            worst_tv = max(worst_tv, float(np.max(0.5 * np.abs(pb - po).sum(axis=1))))
            done += take
    finally:
        single.close()
    return BatchNoise(done, worst_logit, worst_prob, worst_tv, model.flash_attn)
