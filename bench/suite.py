"""What the benchmark suite compares: model pairs, sampling settings, engines.

Identifiers here are what the command line takes (``--pairs``, ``--settings``,
``--engines``) and what bench/results.json records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from specdec_cpu.params import SamplingParams

F32 = "qwen2.5-coder-0.5b-f32"
Q4_K_M = "qwen2.5-coder-0.5b-q4_k_m"
Q4_0 = "qwen2.5-coder-0.5b-q4_0"


@dataclass(frozen=True)
class Setting:
    """Sampling settings, applied identically by every engine."""

    id: str
    label: str
    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def params(self, seed: Optional[int] = None) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_k=self.top_k,
                              top_p=self.top_p, min_p=self.min_p, seed=seed)

    def peer_kwargs(self) -> dict:
        return dict(temp=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)


SETTINGS: Dict[str, Setting] = {
    s.id: s for s in (
        Setting("t0", "T=0 (greedy)", 0.0),
        Setting("t0.7", "T=0.7, top_p=0.95", 0.7, top_p=0.95),
        Setting("t1", "T=1, no truncation", 1.0),
    )
}


@dataclass(frozen=True)
class Pair:
    """A target and how it is drafted for."""

    id: str
    label: str
    description: str
    target: str  # model name (specdec_cpu.models.ensure_model)
    draft: Optional[str]
    engines: Tuple[str, ...]  # engine ids compared on this pair (besides plain)


PAIRS: Dict[str, Pair] = {
    p.id: p for p in (
        Pair("memory", "memory-bound", "F32 target / Q4_0 draft", F32, Q4_0,
             ("gamma2", "gamma4", "gamma6", "gamma8", "auto",
              "llama-completion", "llama-speculative", "llama-speculative-simple")),
        Pair("compute", "compute-bound", "Q4_K_M target / Q4_0 draft", Q4_K_M, Q4_0,
             ("gamma2", "gamma4", "gamma8", "auto",
              "llama-completion", "llama-speculative", "llama-speculative-simple")),
        Pair("ngram", "n-gram", "F32 target, prompt-lookup drafting, no draft model", F32, None,
             ("ngram", "ngram-draft", "pld2", "pld10")),
    )
}


@dataclass(frozen=True)
class Engine:
    """One way of decoding.  ``kind``: ours | completion | speculative | lcp."""

    id: str
    label: str
    kind: str
    gamma: object = None  # ours: 0, an int or "auto"
    drafter: str = "draft"  # ours: which decoder ("draft", "ngram", "ngram-draft")
    variant: str = ""  # llama.cpp speculative variant
    num_pred_tokens: int = 0  # LlamaPromptLookupDecoding; 0 = no draft model


ENGINES: Dict[str, Engine] = {
    e.id: e for e in (
        Engine("plain", "ours, plain (γ=0)", "ours", gamma=0, drafter="plain"),
        Engine("gamma2", "ours, γ=2", "ours", gamma=2),
        Engine("gamma4", "ours, γ=4", "ours", gamma=4),
        Engine("gamma6", "ours, γ=6", "ours", gamma=6),
        Engine("gamma8", "ours, γ=8", "ours", gamma=8),
        Engine("auto", "ours, γ=auto", "ours", gamma="auto"),
        Engine("ngram", "ours, n-gram, γ=auto", "ours", gamma="auto", drafter="ngram"),
        Engine("ngram-draft", "ours, n-gram + draft model, γ=auto", "ours", gamma="auto",
               drafter="ngram-draft"),
        Engine("llama-completion", "llama.cpp llama-completion (plain)", "completion"),
        Engine("llama-speculative", "llama.cpp llama-speculative", "speculative",
               variant="speculative"),
        Engine("llama-speculative-simple", "llama.cpp llama-speculative-simple", "speculative",
               variant="speculative-simple"),
        Engine("pld2", "llama-cpp-python PromptLookup (num_pred_tokens=2)", "lcp", num_pred_tokens=2),
        Engine("pld10", "llama-cpp-python PromptLookup (num_pred_tokens=10)", "lcp",
               num_pred_tokens=10),
        Engine("lcp-plain", "llama-cpp-python Llama (plain)", "lcp", num_pred_tokens=0),
    )
}

#: Engines a pair accepts beyond its default list when asked for by --engines.
OPTIONAL_ENGINES: Dict[str, Tuple[str, ...]] = {
    "compute": ("gamma6",),
    "ngram": ("lcp-plain",),
}

QUICK = dict(
    settings=("t0", "t1"),
    prompts=("code-edit", "chat"),
    engines=("plain", "gamma4", "auto", "llama-speculative", "llama-speculative-simple",
             "ngram", "pld10"),
    tokens=64,
    repeats=1,
)
