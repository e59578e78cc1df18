"""Ours, single stream: ``SpeculativeDecoder``: the suite's record of a generation
(:func:`generation_record`) and the serving/audit adapter (:class:`OursSingle`)."""

from __future__ import annotations

import time
from typing import Any, Dict

from .base import N_CTX, Ctx, Engine, Job, Sample, consume, cut, pair_paths, params


def generation_record(gen: Any) -> Dict[str, Any]:
    """What the suite records of one ``Generation`` (its stats)."""
    s = gen.stats
    return {
        "tokens": s.tokens, "tps": s.tokens_per_second, "decode_seconds": s.decode_seconds,
        "prompt_seconds": s.prompt_seconds, "prompt_tokens": s.prompt_tokens, "finish": s.finish_reason,
        "steps": s.steps, "drafted": s.drafted, "accepted": s.accepted,
        "acceptance": s.acceptance if s.drafted else None, "mean_alpha": s.mean_alpha if s.alpha_rows else None,
        "tokens_per_step": s.tokens_per_step, "mean_gamma": s.mean_gamma, "gamma_runs": s.gamma_runs(),
        "by_drafter": s.by_drafter, "draft_seconds": s.draft_seconds, "target_seconds": s.target_seconds,
        "sampling_seconds": s.sampling_seconds, "overhead_seconds": s.overhead_seconds,
        "overhead_fraction": s.overhead_seconds / s.decode_seconds if s.decode_seconds > 0 else None,
    }


def sample_of(job: Job, gen: Any, ctx: Ctx) -> Sample:
    """The audit's Sample of one of our generations (``Generation.tokens``)."""
    st = gen.stats
    tokens, cut_eog = cut(list(gen.tokens), ctx.max_tokens, ctx.is_eog)
    return Sample(job.index, job.prompt, job.text, job.seed, tokens, st.finish_reason == "stop" or cut_eog,
                  produced=len(gen.tokens), drafted=st.drafted, accepted=st.accepted, passes=st.steps)


class OursSingle(Engine):
    """SpeculativeDecoder, one conversation at a time (serving: K = 1 only), with the draft model,
    n-gram lookup, both or neither."""

    ids_from = "`Generation.tokens`"

    def __init__(self, gamma: Any = "auto", *, draft: bool = True, ngram: bool = False, n_ctx: int = N_CTX,
                 id: str = "single-auto", label: str = "ours, SpeculativeDecoder γ=auto") -> None:
        self.gamma, self.use_draft, self.ngram, self.n_ctx, self.id, self.label = gamma, draft, ngram, n_ctx, id, label

    def start(self, k, threads):
        from specdec_cpu import SpeculativeDecoder

        target, draft = pair_paths()
        self.dec = SpeculativeDecoder.from_gguf(target, draft if self.use_draft else None, ngram=self.ngram,
                                                gamma=self.gamma, n_ctx=self.n_ctx, n_threads=threads)

    def request(self, prompt, setting, max_tokens, seed, rec, t0, ignore_eos=False):
        s = self.dec.stream(prompt, max_tokens=max_tokens, params=params(setting, seed, ignore_eos))
        consume(s, rec, time.perf_counter(), t0)
        rec.tokens = len(s.result.tokens)

    def one(self, job, setting):
        gen = self.dec.generate(list(job.ids), max_tokens=self.ctx.max_tokens, params=setting.params(job.seed))
        return sample_of(job, gen, self.ctx)

    def stop(self) -> None:
        self.dec.close()

    def command(self) -> str:
        return (f"SpeculativeDecoder.from_gguf(F32, Q4_0, gamma={self.gamma!r}, n_ctx={N_CTX}, "
                f"n_threads={self.ctx.threads}).generate(prompt_ids, max_tokens={self.ctx.max_tokens}, "
                "params=SamplingParams(temperature, top_p, seed))")
