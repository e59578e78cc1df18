"""Ours, single stream: ``SpeculativeDecoder``: the suite's record of a generation
(:func:`generation_record`) and the serving/audit adapter (:class:`OursSingle`), built on what
our in-process adapters share (:class:`OursEngine`)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Dict

from .base import N_CTX, Engine, Sample, consume, cut, pair_paths


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


class OursEngine(Engine):
    """Our decoder (``dec``) in this process, with the draft model, n-gram lookup, both or neither."""

    ids_from = "`Generation.tokens`"
    dec: Any = None

    def __init__(self, gamma: Any, draft: bool, ngram: bool) -> None:
        self.gamma, self.use_draft, self.ngram = gamma, draft, ngram

    def load(self, decoder: Any, threads: int, **options: Any) -> Any:
        """``decoder.from_gguf`` of the demo pair (the draft file or none) with our options."""
        target, draft = pair_paths()
        return decoder.from_gguf(target, draft if self.use_draft else None, ngram=self.ngram, gamma=self.gamma,
                                 n_threads=threads, **options)

    def request(self, prompt, setting, max_tokens, seed, rec, t0, ignore_eos=False) -> Any:
        """Stream one request into ``rec``; returns the ``Generation``."""
        s = self.dec.stream(prompt, max_tokens=max_tokens, params=replace(setting.params(seed), ignore_eos=ignore_eos))
        consume(s, rec, time.perf_counter(), t0)
        rec.tokens = len(s.result.tokens)
        return s.result

    def one(self, job, setting):
        gen = self.dec.generate(list(job.ids), max_tokens=self.ctx.max_tokens, params=setting.params(job.seed))
        st = gen.stats
        tokens, cut_eog = cut(list(gen.tokens), self.ctx.max_tokens, self.ctx.is_eog)
        return Sample(job.index, job.prompt, job.text, job.seed, tokens, st.finish_reason == "stop" or cut_eog,
                      produced=len(gen.tokens), drafted=st.drafted, accepted=st.accepted, passes=st.steps)

    def stop(self) -> None:
        if self.dec is not None:
            self.dec.close()
            self.dec = None


class OursSingle(OursEngine):
    """SpeculativeDecoder, one conversation at a time (serving: K = 1 only)."""

    def __init__(self, gamma: Any = "auto", *, draft: bool = True, ngram: bool = False, n_ctx: int = N_CTX,
                 id: str = "single-auto", label: str = "ours, SpeculativeDecoder γ=auto") -> None:
        super().__init__(gamma, draft, ngram)
        self.n_ctx, self.id, self.label = n_ctx, id, label

    def start(self, k, threads):
        from specdec_cpu import SpeculativeDecoder

        self.dec = self.load(SpeculativeDecoder, threads, n_ctx=self.n_ctx)

    def command(self) -> str:
        return (f"SpeculativeDecoder.from_gguf(F32, Q4_0, gamma={self.gamma!r}, n_ctx={N_CTX}, "
                f"n_threads={self.ctx.threads}).generate(prompt_ids, max_tokens={self.ctx.max_tokens}, "
                "params=SamplingParams(temperature, top_p, seed))")
