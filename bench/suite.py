"""What the benchmark suite compares: model pairs, sampling settings, engines.

Identifiers here are what the command line takes (``--pairs``, ``--settings``,
``--engines``) and what bench/results.json records.
"""

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
    target: str  # model name (specdec_cpu.demo_models.ensure_model)
    draft: Optional[str]
    engines: Tuple[str, ...]  # engine or family ids compared on this pair (besides plain)


#: The denominator of every "× plain" figure: llama.cpp's own plain decoding.
BASELINE = "llama-completion"
#: Our plain decoding (γ = 0, same engine): a control, reported against BASELINE.
CONTROL = "plain"

PAIRS: Dict[str, Pair] = {
    p.id: p for p in (
        Pair("memory", "memory-bound", "F32 target / Q4_0 draft", F32, Q4_0,
             ("llama-completion", "gamma2", "gamma4", "gamma6", "gamma8", "auto",
              "llama-speculative", "llama-speculative-simple", "llama-server-draft", "llama-server-plain")),
        Pair("compute", "compute-bound", "Q4_K_M target / Q4_0 draft", Q4_K_M, Q4_0,
             ("llama-completion", "gamma2", "gamma4", "gamma8", "auto",
              "llama-speculative", "llama-speculative-simple", "llama-server-draft")),
        Pair("ngram", "n-gram", "F32 target, prompt-lookup drafting, no draft model", F32, None,
             ("llama-completion", "ngram", "ngram-draft", "pld",
              "llama-server-ngram-simple", "llama-server-ngram-map-k", "llama-server-ngram-mod")),
    )
}


@dataclass(frozen=True)
class EngineSpec:
    """One way of decoding the suite compares, run by the engine of its
    ``kind`` (bench/engines/): ours | completion | speculative | server | lcp.

    Engines of one ``family`` are settings of one peer (a sweep): every
    variant runs in every block, and the report shows, per (pair, setting),
    the variant with the highest median tok/s over the blocks, with the whole
    sweep in a table of its own.
    """

    id: str
    label: str
    kind: str
    gamma: object = None  # ours: 0, an int or "auto"
    drafter: str = "draft"  # ours: which decoder ("draft", "ngram", "ngram-draft")
    variant: str = ""  # llama.cpp speculative example: "speculative" or "speculative-simple"
    num_pred_tokens: int = 0  # LlamaPromptLookupDecoding; 0 = no draft model
    family: str = ""  # sweep this engine belongs to ("" = none)
    setting_label: str = ""  # what distinguishes it within its family ("draft-n-max 8")
    draft_max: int = 0  # --spec-draft-n-max (llama.cpp tools with a draft model)
    spec_type: str = ""  # llama-server --spec-type ("" = plain decoding)
    server_args: Tuple[str, ...] = ()  # further llama-server flags (n-gram sizes)
    uses_draft_model: bool = False  # loads the pair's draft model


#: --spec-draft-n-max values every draft-model peer of llama.cpp is run with
#: (their default is 3); ``--peer-draft-max`` changes the list.
DEFAULT_DRAFT_MAX: Tuple[int, ...] = (4, 8, 16)

#: Families whose variants differ in --spec-draft-n-max only.
DRAFT_FAMILIES: Dict[str, dict] = {
    "llama-speculative": dict(label="llama.cpp llama-speculative", kind="speculative",
                              variant="speculative"),
    "llama-speculative-simple": dict(label="llama.cpp llama-speculative-simple", kind="speculative",
                                     variant="speculative-simple"),
    "llama-server-draft": dict(label="llama.cpp llama-server -md", kind="server",
                               spec_type="draft-simple"),
}


def draft_variant(family: str, n: int) -> EngineSpec:
    """The engine of ``family`` (a DRAFT_FAMILIES key) drafting up to ``n`` tokens."""
    f = DRAFT_FAMILIES[family]
    return EngineSpec(f"{family}-n{n}", f"{f['label']} (draft-n-max {n})", f["kind"],
                  variant=f.get("variant", ""), spec_type=f.get("spec_type", ""), family=family,
                  setting_label=f"draft-n-max {n}", draft_max=n, uses_draft_model=True)


#: llama-server's draftless (n-gram) speculative modes as peers of the n-gram
#: pair (the modes and options of the vendored llama.cpp revision:
#: common/speculative.cpp, common/arg.cpp, docs/speculative.md).  Lengths in
#: tokens: n = the n-gram looked up, m = the tokens drafted after it.  Where a
#: mode's defaults are tuned for other cases (ngram-mod's for MoE models, per
#: its documentation) it runs with its defaults and with shorter settings, and
#: the report keeps the faster, like the draft-length sweep.
def _server_ngram(family: str, label: str, spec_type: str, setting: str, *args: str,
                  suffix: str = "") -> EngineSpec:
    return EngineSpec(family + suffix, f"{label} ({setting})", "server", spec_type=spec_type,
                  server_args=tuple(args), family=family if suffix else "", setting_label=setting)


SERVER_NGRAM: Tuple[EngineSpec, ...] = (
    _server_ngram("llama-server-ngram-simple", "llama.cpp llama-server ngram-simple", "ngram-simple",
                  "n 2, m 10", "--spec-ngram-simple-size-n", "2", "--spec-ngram-simple-size-m", "10",
                  suffix="-n2m10"),
    _server_ngram("llama-server-ngram-simple", "llama.cpp llama-server ngram-simple", "ngram-simple",
                  "n 4, m 24", "--spec-ngram-simple-size-n", "4", "--spec-ngram-simple-size-m", "24",
                  suffix="-n4m24"),
    _server_ngram("llama-server-ngram-map-k", "llama.cpp llama-server ngram-map-k", "ngram-map-k",
                  "defaults: n 12, m 48, min-hits 1"),
    _server_ngram("llama-server-ngram-map-k4v", "llama.cpp llama-server ngram-map-k4v", "ngram-map-k4v",
                  "n 8, m 8, min-hits 2", "--spec-ngram-map-k4v-size-n", "8", "--spec-ngram-map-k4v-size-m",
                  "8", "--spec-ngram-map-k4v-min-hits", "2"),
    _server_ngram("llama-server-ngram-mod", "llama.cpp llama-server ngram-mod", "ngram-mod",
                  "defaults: match 24, draft 48–64", suffix="-default"),
    _server_ngram("llama-server-ngram-mod", "llama.cpp llama-server ngram-mod", "ngram-mod",
                  "match 16, draft 4–16", "--spec-ngram-mod-n-match", "16", "--spec-ngram-mod-n-min", "4",
                  "--spec-ngram-mod-n-max", "16", suffix="-m16"),
    _server_ngram("llama-server-ngram-cache", "llama.cpp llama-server ngram-cache", "ngram-cache",
                  "1- to 4-grams, 8 tokens"),
)

ENGINES: Dict[str, EngineSpec] = {
    e.id: e for e in (
        EngineSpec("plain", "ours, plain (γ=0)", "ours", gamma=0, drafter="plain"),
        EngineSpec("gamma2", "ours, γ=2", "ours", gamma=2),
        EngineSpec("gamma4", "ours, γ=4", "ours", gamma=4),
        EngineSpec("gamma6", "ours, γ=6", "ours", gamma=6),
        EngineSpec("gamma8", "ours, γ=8", "ours", gamma=8),
        EngineSpec("auto", "ours, γ=auto", "ours", gamma="auto"),
        EngineSpec("ngram", "ours, n-gram, γ=auto", "ours", gamma="auto", drafter="ngram"),
        EngineSpec("ngram-draft", "ours, n-gram + draft model, γ=auto", "ours", gamma="auto",
               drafter="ngram-draft"),
        EngineSpec("llama-completion", "llama.cpp llama-completion (plain)", "completion"),
        *(draft_variant(f, n) for f in DRAFT_FAMILIES for n in DEFAULT_DRAFT_MAX),
        EngineSpec("llama-server-plain", "llama.cpp llama-server (plain)", "server"),
        *SERVER_NGRAM,
        EngineSpec("pld2", "llama-cpp-python PromptLookup (num_pred_tokens=2)", "lcp", num_pred_tokens=2,
               family="pld", setting_label="num_pred_tokens 2"),
        EngineSpec("pld10", "llama-cpp-python PromptLookup (num_pred_tokens=10)", "lcp",
               num_pred_tokens=10, family="pld", setting_label="num_pred_tokens 10"),
        EngineSpec("lcp-plain", "llama-cpp-python Llama (plain)", "lcp", num_pred_tokens=0),
    )
}

FAMILY_LABELS: Dict[str, str] = {
    **{f: d["label"] for f, d in DRAFT_FAMILIES.items()},
    "pld": "llama-cpp-python PromptLookup",
    "llama-server-ngram-simple": "llama.cpp llama-server ngram-simple",
    "llama-server-ngram-mod": "llama.cpp llama-server ngram-mod",
}


def set_draft_sweep(values: Sequence[int]) -> None:
    """Make the draft-model families run with --spec-draft-n-max in ``values``."""
    for eid in [e for e, eng in ENGINES.items() if eng.family in DRAFT_FAMILIES]:
        del ENGINES[eid]
    for f in DRAFT_FAMILIES:
        for n in values:
            e = draft_variant(f, int(n))
            ENGINES[e.id] = e


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
    out: List[str] = []
    for i in ids:
        for e in fam.get(i, [i]):
            if e not in out:
                out.append(e)
    return out


def known_ids() -> List[str]:
    return list(ENGINES) + list(families())


#: Engines a pair accepts beyond its default list when asked for by --engines.
OPTIONAL_ENGINES: Dict[str, Tuple[str, ...]] = {
    "memory": (),
    "compute": ("gamma6", "llama-server-plain"),
    "ngram": ("lcp-plain", "llama-server-plain", "llama-server-ngram-map-k4v", "llama-server-ngram-cache"),
}

QUICK = dict(
    settings=("t0", "t1"),
    prompts=("code-edit", "chat"),
    engines=("plain", "llama-completion", "gamma4", "auto", "llama-speculative-simple",
             "llama-server-draft", "ngram", "pld10", "llama-server-ngram-simple-n2m10"),
    draft_max=(4, 8),
    tokens=64,
    repeats=1,
)
