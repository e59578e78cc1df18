"""What the benchmark suite compares: model pairs, sampling settings, engines, by the ids that the command line
takes (``--pairs``, ``--settings``, ``--engines``) and results.json records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

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
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                              seed=seed)

    def peer_kwargs(self) -> dict:
        return dict(temp=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)


SETTINGS: Dict[str, Setting] = {s.id: s for s in (
    Setting("t0", "T=0 (greedy)", 0.0),
    Setting("t0.7", "T=0.7, top_p=0.95", 0.7, top_p=0.95),
    Setting("t1", "T=1, no truncation", 1.0),
)}


@dataclass(frozen=True)
class Pair:
    """A target and how it is drafted for."""

    id: str
    label: str
    description: str
    target: str  # model name (specdec_cpu.demo_models.ensure_model)
    draft: Optional[str]
    engines: Tuple[str, ...]  # engine or family ids compared on this pair (besides plain)
    optional: Tuple[str, ...] = ()  # further engines it accepts when --engines asks for them


#: The denominator of every "× plain" figure: llama.cpp's own plain decoding.
BASELINE = "llama-completion"
#: Our plain decoding (γ = 0, same engine): a control, reported against BASELINE.
CONTROL = "plain"

PAIRS: Dict[str, Pair] = {p.id: p for p in (
    Pair("memory", "memory-bound", "F32 target / Q4_0 draft", F32, Q4_0,
         ("llama-completion", "gamma2", "gamma4", "gamma6", "gamma8", "auto", "llama-speculative",
          "llama-speculative-simple", "llama-server-draft", "llama-server-plain")),
    Pair("compute", "compute-bound", "Q4_K_M target / Q4_0 draft", Q4_K_M, Q4_0,
         ("llama-completion", "gamma2", "gamma4", "gamma8", "auto", "llama-speculative", "llama-speculative-simple",
          "llama-server-draft"), ("gamma6", "llama-server-plain")),
    Pair("ngram", "n-gram", "F32 target, prompt-lookup drafting, no draft model", F32, None,
         ("llama-completion", "ngram", "ngram-draft", "pld", "llama-server-ngram-simple", "llama-server-ngram-map-k",
          "llama-server-ngram-mod"),
         ("lcp-plain", "llama-server-plain", "llama-server-ngram-map-k4v", "llama-server-ngram-cache")),
)}


@dataclass(frozen=True)
class EngineSpec:
    """One way of decoding, run by the engine of its ``kind`` (bench/engines/): ours | completion | speculative |
    server | lcp.  Engines of one ``family`` are the settings of one peer's sweep; the report shows the fastest."""

    id: str
    label: str
    kind: str
    gamma: object = None  # ours: 0, an int or "auto"
    drafter: str = "draft"  # ours: "draft", "ngram", "ngram-draft" or "plain"
    variant: str = ""  # llama.cpp speculative example: "speculative" or "speculative-simple"
    num_pred_tokens: int = 0  # LlamaPromptLookupDecoding; 0 = no draft model
    family: str = ""  # sweep this engine belongs to ("" = none)
    setting_label: str = ""  # what distinguishes it within its family ("draft-n-max 8")
    draft_max: int = 0  # --spec-draft-n-max (llama.cpp tools with a draft model)
    spec_type: str = ""  # llama-server --spec-type ("" = plain decoding)
    server_args: Tuple[str, ...] = ()  # further llama-server flags (n-gram sizes)
    uses_draft_model: bool = False  # loads the pair's draft model

    @property
    def family_label(self) -> str:
        return self.label.split(" (")[0]


#: --spec-draft-n-max values of every draft-model peer of llama.cpp (their default is 3); see --peer-draft-max.
DEFAULT_DRAFT_MAX: Tuple[int, ...] = (4, 8, 16)

#: Families whose variants differ in --spec-draft-n-max only: label, kind, variant, spec_type.
DRAFT_FAMILIES: Dict[str, Tuple[str, str, str, str]] = {
    "llama-speculative": ("llama.cpp llama-speculative", "speculative", "speculative", ""),
    "llama-speculative-simple": ("llama.cpp llama-speculative-simple", "speculative", "speculative-simple", ""),
    "llama-server-draft": ("llama.cpp llama-server -md", "server", "", "draft-simple"),
}


def draft_variant(family: str, n: int) -> EngineSpec:
    """The engine of ``family`` (a DRAFT_FAMILIES key) drafting up to ``n`` tokens."""
    label, kind, variant, spec_type = DRAFT_FAMILIES[family]
    return EngineSpec(f"{family}-n{n}", f"{label} (draft-n-max {n})", kind, variant=variant, spec_type=spec_type,
                      family=family, setting_label=f"draft-n-max {n}", draft_max=n, uses_draft_model=True)


def _server_ngram(family: str, spec_type: str, setting: str, *args: str, suffix: str = "") -> EngineSpec:
    """A draftless llama-server mode (n = n-gram looked up, m = tokens drafted); a ``suffix`` makes it one setting
    of a family (the modes' defaults are tuned for other models, so some also run shorter)."""
    return EngineSpec(family + suffix, f"llama.cpp llama-server {spec_type} ({setting})", "server",
                      spec_type=spec_type, server_args=args, family=family if suffix else "", setting_label=setting)


def _n(*pairs: str) -> Tuple[str, ...]:
    """llama-server flags: ``_n("simple-size-n", "2")`` -> ("--spec-ngram-simple-size-n", "2")."""
    return tuple(x for i in range(0, len(pairs), 2) for x in (f"--spec-ngram-{pairs[i]}", pairs[i + 1]))


ENGINES: Dict[str, EngineSpec] = {e.id: e for e in (
    EngineSpec("plain", "ours, plain (γ=0)", "ours", gamma=0, drafter="plain"),
    *(EngineSpec(f"gamma{g}", f"ours, γ={g}", "ours", gamma=g) for g in (2, 4, 6, 8)),
    EngineSpec("auto", "ours, γ=auto", "ours", gamma="auto"),
    EngineSpec("ngram", "ours, n-gram, γ=auto", "ours", gamma="auto", drafter="ngram"),
    EngineSpec("ngram-draft", "ours, n-gram + draft model, γ=auto", "ours", gamma="auto", drafter="ngram-draft"),
    EngineSpec("llama-completion", "llama.cpp llama-completion (plain)", "completion"),
    *(draft_variant(f, n) for f in DRAFT_FAMILIES for n in DEFAULT_DRAFT_MAX),
    EngineSpec("llama-server-plain", "llama.cpp llama-server (plain)", "server"),
    _server_ngram("llama-server-ngram-simple", "ngram-simple", "n 2, m 10",
                  *_n("simple-size-n", "2", "simple-size-m", "10"), suffix="-n2m10"),
    _server_ngram("llama-server-ngram-simple", "ngram-simple", "n 4, m 24",
                  *_n("simple-size-n", "4", "simple-size-m", "24"), suffix="-n4m24"),
    _server_ngram("llama-server-ngram-map-k", "ngram-map-k", "defaults: n 12, m 48, min-hits 1"),
    _server_ngram("llama-server-ngram-map-k4v", "ngram-map-k4v", "n 8, m 8, min-hits 2",
                  *_n("map-k4v-size-n", "8", "map-k4v-size-m", "8", "map-k4v-min-hits", "2")),
    _server_ngram("llama-server-ngram-mod", "ngram-mod", "defaults: match 24, draft 48–64", suffix="-default"),
    _server_ngram("llama-server-ngram-mod", "ngram-mod", "match 16, draft 4–16",
                  *_n("mod-n-match", "16", "mod-n-min", "4", "mod-n-max", "16"), suffix="-m16"),
    _server_ngram("llama-server-ngram-cache", "ngram-cache", "1- to 4-grams, 8 tokens"),
    *(EngineSpec(f"pld{n}", f"llama-cpp-python PromptLookup (num_pred_tokens={n})", "lcp", num_pred_tokens=n,
                 family="pld", setting_label=f"num_pred_tokens {n}") for n in (2, 10)),
    EngineSpec("lcp-plain", "llama-cpp-python Llama (plain)", "lcp", num_pred_tokens=0),
)}


def set_draft_sweep(values: Sequence[int]) -> None:
    """Make the draft-model families run with --spec-draft-n-max in ``values``."""
    for eid in [e for e, eng in ENGINES.items() if eng.family in DRAFT_FAMILIES]:
        del ENGINES[eid]
    ENGINES.update((e.id, e) for e in (draft_variant(f, int(n)) for f in DRAFT_FAMILIES for n in values))


def families() -> Dict[str, List[str]]:
    """family id -> its engine ids (in ENGINES order)."""
    out: Dict[str, List[str]] = {}
    for e in ENGINES.values():
        if e.family:
            out.setdefault(e.family, []).append(e.id)
    return out


def expand(ids: Sequence[str]) -> List[str]:
    """Engine ids, a family id standing for all its variants."""
    fam = families()
    return list(dict.fromkeys(e for i in ids for e in fam.get(i, [i])))


def pair_engines(pair: str, optional: bool = True) -> List[str]:
    """The engine ids of a pair, with those it accepts on request."""
    p = PAIRS[pair]
    return expand(p.engines) + (expand(p.optional) if optional else [])


def known_ids() -> List[str]:
    return list(ENGINES) + list(families())


QUICK = dict(
    settings=("t0", "t1"),
    prompts=("code-edit", "chat"),
    engines=("plain", "llama-completion", "gamma4", "auto", "llama-speculative-simple", "llama-server-draft", "ngram",
             "pld10", "llama-server-ngram-simple-n2m10"),
    draft_max=(4, 8),
    tokens=64,
    repeats=1,
)
