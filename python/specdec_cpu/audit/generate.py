"""Samples from specdec-cpu's own decoder, in the form the audit reads."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, List, Sequence

from ..params import SamplingParams
from .samples import GeneratedSequence

__all__ = ["GenerationSummary", "generate_samples"]


@dataclass
class GenerationSummary:
    """What the decoder did while producing the samples (to show that
    speculation really ran: drafted/accepted counts and the γ values used)."""

    samples: int = 0
    tokens: int = 0
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    forced: int = 0
    gammas: List[int] = field(default_factory=list)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def line(self) -> str:
        used = sorted(set(self.gammas))
        forced = f", {self.forced} forced by the grammar" if self.forced else ""
        shown = ", ".join(map(str, used[:12])) + (" ..." if len(used) > 12 else "")
        return (f"generated {self.samples} samples, {self.tokens} tokens in {self.steps} target passes "
                f"({self.tokens / max(self.steps, 1):.2f} per pass); drafted {self.drafted}, accepted "
                f"{self.accepted} ({self.acceptance:.2f}){forced}; γ used: {shown or '-'}")


def generate_samples(decoder, prompts: Sequence[Sequence[int]], *, samples: int, max_tokens: int,
                     params: SamplingParams, seed: int,
                     grammar: Any = None) -> "tuple[List[GeneratedSequence], GenerationSummary]":
    """``samples`` generations of every prompt (token ids), each with its own seed.

    Sample k of prompt i uses seed ``seed + i * samples + k``, so no two share
    a random stream and a rerun reproduces them (for a fixed γ).  A generation
    that ends at an end-of-generation token is marked ``stopped``: no stop
    strings are used, so that is the only way to stop before ``max_tokens``.
    ``grammar`` constrains every generation (see ``SpeculativeDecoder.generate``).
    """
    out: List[GeneratedSequence] = []
    summary = GenerationSummary()
    for i, prompt in enumerate(prompts):
        for k in range(samples):
            run = replace(params, seed=seed + i * samples + k)
            gen = decoder.generate(list(prompt), max_tokens=max_tokens, params=run, grammar=grammar)
            stats = gen.stats
            out.append(GeneratedSequence(prompt=list(prompt), tokens=list(gen.tokens),
                                         stopped=stats.finish_reason == "stop"))
            summary.samples += 1
            summary.tokens += stats.tokens
            summary.steps += stats.steps
            summary.drafted += stats.drafted
            summary.accepted += stats.accepted
            summary.forced += stats.forced
            summary.gammas.extend(stats.gammas)
    return out, summary
