"""Turn bench/results.json into RESULTS.md tables, the targets check and plots.

Every speed-up is computed here from the runs' tok/s (so an older
results.json renders with today's rules): per block, an engine's tok/s over
the tok/s of the baseline in the same block — llama.cpp's plain decoding
(``llama-completion``), or our plain decoding in a run without llama.cpp —
and the median of those per-block ratios over the blocks, with a bootstrap
interval (percentile, 95%, fixed seed: :func:`bootstrap_ci`).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .common import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, median, stat

#: Headings this module writes; any other "## " section of RESULTS.md (the
#: "## Kernels" section of bench/kernels.py) is kept as it is.
OWN_HEADINGS = ("## End-to-end decoding", "## Targets")

PLOT_FILES = {
    "tps": "plot_tokens_per_second.png",
    "theory": "plot_measured_vs_predicted.png",
    "verify": "plot_verify_cost.png",
}

SPEC_OURS = ("gamma2", "gamma4", "gamma6", "gamma8", "auto")
FIXED_GAMMA = ("gamma2", "gamma4", "gamma6", "gamma8")

#: measured / predicted counts as a miss outside this band, either way.
THEORY_BAND = (0.9, 1.1)


# ---------------------------------------------------------------------------
# aggregation
# ---------------------------------------------------------------------------


def baseline_id(results) -> str:
    """The denominator of "× plain": llama.cpp's plain decoding when the run has it."""
    b = results.get("baseline", "llama-completion")
    if any(r["engine"] == b and r.get("tps") for r in results["runs"]):
        return b
    return results.get("control", "plain")


def baseline_label(results) -> str:
    return "llama.cpp plain" if baseline_id(results) == "llama-completion" else "our plain"


_BLOCK_TPS_CACHE: Dict[int, Tuple[int, Dict[int, Dict[str, float]]]] = {}


def block_tps(results) -> Dict[int, Dict[str, float]]:
    """block -> engine -> tok/s (successful runs)."""
    key = id(results)
    cached = _BLOCK_TPS_CACHE.get(key)
    if cached is not None and cached[0] == len(results["runs"]):
        return cached[1]
    out: Dict[int, Dict[str, float]] = defaultdict(dict)
    for r in results["runs"]:
        if r.get("tps"):
            out[r["block"]][r["engine"]] = r["tps"]
    _BLOCK_TPS_CACHE[key] = (len(results["runs"]), out)
    return out


def run_ratio(results, r: Dict[str, Any], to: Optional[str] = None) -> Optional[float]:
    """A run's tok/s over that of engine ``to`` (default: the baseline) in its block."""
    base = block_tps(results).get(r["block"], {}).get(to or baseline_id(results))
    return r["tps"] / base if base and r.get("tps") else None


def runs_of(results, pair: str, setting: str, engine: Optional[str] = None,
            kinds: Optional[Sequence[str]] = None) -> List[Dict[str, Any]]:
    return [r for r in results["runs"]
            if pair in r.get("pairs", ()) and r["setting"] == setting
            and (engine is None or r["engine"] == engine)
            and (kinds is None or r["kind"] in kinds)]


def engines_of(results, pair: str) -> List[str]:
    order = list(results.get("engines", {}))
    present = {r["engine"] for r in results["runs"] if pair in r.get("pairs", ())}
    return [e for e in order if e in present] + sorted(present - set(order))


#: Families of engines recorded before results.json carried them.
_LEGACY_FAMILIES = {"pld2": "pld", "pld10": "pld"}


def family_of(results, eid: str) -> str:
    return results.get("engines", {}).get(eid, {}).get("family") or _LEGACY_FAMILIES.get(eid, eid)


_FAMILY_LABELS = {"pld": "llama-cpp-python PromptLookup"}


def setting_label(results, eid: str) -> str:
    info = results.get("engines", {}).get(eid, {})
    return info.get("setting_label") or info.get("label", eid)


def best_variant(results, pair: str, setting: str, family: str,
                 kinds: Optional[Sequence[str]] = None) -> Optional[str]:
    """The variant of ``family`` with the highest median tok/s over the blocks of
    (pair, setting) (restricted to prompt ``kinds`` if given)."""
    best, best_tps = None, -1.0
    for eid in engines_of(results, pair):
        if family_of(results, eid) != family:
            continue
        m = median(r.get("tps") for r in runs_of(results, pair, setting, eid, kinds))
        if m is not None and m > best_tps:
            best, best_tps = eid, m
    return best


def shown_engines(results, pair: str, setting: str) -> List[str]:
    """The engines of a pair's table: each family by its best variant at this setting."""
    out: List[str] = []
    seen = set()
    for eid in engines_of(results, pair):
        fam = family_of(results, eid)
        if fam == eid:
            if runs_of(results, pair, setting, eid):
                out.append(eid)
        elif fam not in seen:
            seen.add(fam)
            best = best_variant(results, pair, setting, fam)
            if best is not None:
                out.append(best)
    return out


def sweep_families(results, pair: str) -> List[str]:
    fams: List[str] = []
    for eid in engines_of(results, pair):
        fam = family_of(results, eid)
        if fam != eid and fam not in fams:
            fams.append(fam)
    return fams


def ratios(results, pair: str, setting: str, eid: str, kinds: Optional[Sequence[str]] = None,
           to: Optional[str] = None) -> List[float]:
    """Per-block tok/s of ``eid`` over ``to`` (default: the baseline), same block."""
    out = []
    for r in runs_of(results, pair, setting, eid, kinds):
        x = run_ratio(results, r, to)
        if x is not None:
            out.append(x)
    return out


def summarize(results, rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """min/median/max tok/s, the median per-block ratio (with interval) and
    medians of the per-run figures of one engine."""
    ok = [r for r in rows if r.get("tps")]
    tps = [r["tps"] for r in ok]
    rat = [run_ratio(results, r) for r in ok]
    mp = [x / r["predicted"] for x, r in zip(rat, ok) if x is not None and r.get("predicted")]
    rs, ms = stat(rat), stat(mp)
    return {
        "runs": len(rows),
        "failed": len(rows) - len(ok),
        "tps_min": min(tps) if tps else None,
        "tps_median": median(tps),
        "tps_max": max(tps) if tps else None,
        "ratio": rs["median"], "ratio_lo": rs["lo"], "ratio_hi": rs["hi"],
        "acceptance": median(r.get("acceptance") for r in ok),
        "mean_alpha": median(r.get("mean_alpha") for r in ok),
        "tokens_per_step": median(r.get("tokens_per_step") for r in ok),
        "mean_gamma": median(r.get("mean_gamma") for r in ok) if any("mean_gamma" in r for r in ok) else None,
        "predicted": median(r.get("predicted") for r in ok),
        "measured_over_predicted": ms["median"], "mp_lo": ms["lo"], "mp_hi": ms["hi"],
        "overhead_fraction": median(r.get("overhead_fraction") for r in ok),
        "tokens_median": median(r.get("tokens") for r in ok),
        "tokens_min": min((r["tokens"] for r in ok if r.get("tokens") is not None), default=None),
    }


def block_ratios(results, pair: str, setting: str, a: str, b: str,
                 kinds: Optional[Sequence[str]] = None) -> List[float]:
    """Per-block tok/s of engine ``a`` over engine ``b`` in the same block."""
    return ratios(results, pair, setting, a, kinds, to=b)


def calibration_rows(results, target: str, role: Optional[str] = None) -> List[Dict[str, Any]]:
    return [c for c in results.get("calibrations", [])
            if c["target"] == target and (role is None or c["role"] == role)]


def pair_calibration(results, pair: str, setting: str) -> Optional[Dict[str, Any]]:
    info = results["pairs"][pair]
    role = "ngram" if pair == "ngram" else "draft"
    rows = [c for c in calibration_rows(results, info["target"], role) if c["setting"] == setting]
    if not rows and pair == "ngram":  # the memory pair's calibration has the same target
        rows = [c for c in calibration_rows(results, info["target"], "draft") if c["setting"] == setting]
    return rows[0] if rows else None


# ---------------------------------------------------------------------------
# formatting
# ---------------------------------------------------------------------------


def _f(x: Optional[float], fmt: str = "{:.2f}", none: str = "–") -> str:
    return none if x is None else fmt.format(x)


def _x(x: Optional[float]) -> str:
    return _f(x, "{:.2f}×")


def _ci(lo: Optional[float], hi: Optional[float], fmt: str = "{:.2f}") -> str:
    if lo is None or hi is None:
        return ""
    return f" [{fmt.format(lo)}–{fmt.format(hi)}]"


def _xci(m: Optional[float], lo: Optional[float], hi: Optional[float]) -> str:
    return _x(m) + _ci(lo, hi)


def _pct(x: Optional[float]) -> str:
    return _f(None if x is None else 100 * x, "{:.1f}%")


def _tps(s: Dict[str, Any]) -> str:
    if s["tps_median"] is None:
        return "failed"
    return f"{s['tps_min']:.1f} – **{s['tps_median']:.1f}** – {s['tps_max']:.1f}"


def engine_label(results, eid: str) -> str:
    info = results.get("engines", {}).get(eid, {})
    label = info.get("label", eid)
    if eid in ("llama-speculative", "llama-speculative-simple") and "setting_label" not in info:
        label += f" (draft-n-max {results['config'].get('peer_draft_max')})"  # results before the sweep
    return label


def shown_label(results, pair: str, eid: str) -> str:
    """An engine's label in a pair's table; a family's best variant says it is the best of the sweep."""
    info = results.get("engines", {}).get(eid, {})
    fam = family_of(results, eid)
    if fam == eid:
        return engine_label(results, eid)
    n = sum(1 for e in engines_of(results, pair) if family_of(results, e) == fam)
    if n < 2:
        return engine_label(results, eid)
    return f"{info.get('family_label') or _FAMILY_LABELS.get(fam, fam)}, fastest of {n}: {setting_label(results, eid)}"


def pair_table(results, pair: str, setting: str) -> List[str]:
    base = baseline_label(results)
    lines = [
        f"| engine | tok/s min – **median** – max | × {base} (median of per-block ratios) [95% interval] "
        "| acceptance | mean α | tokens/step | mean γ | predicted × | measured / predicted [95% interval] "
        "| Python overhead | tokens/run (median) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for eid in shown_engines(results, pair, setting):
        rows = runs_of(results, pair, setting, eid)
        s = summarize(results, rows)
        ours = results["engines"].get(eid, {}).get("kind") == "ours"
        mp = "–" if s["measured_over_predicted"] is None else (
            _f(s["measured_over_predicted"]) + _ci(s["mp_lo"], s["mp_hi"]))
        lines.append(
            f"| {shown_label(results, pair, eid)} | {_tps(s)} | {_xci(s['ratio'], s['ratio_lo'], s['ratio_hi'])} | "
            f"{_f(s['acceptance'])} | "
            f"{_f(s['mean_alpha'], '{:.3f}')} | {_f(s['tokens_per_step']) if ours else '–'} | "
            f"{_f(s['mean_gamma'], '{:.1f}') if ours and eid != 'plain' else '–'} | "
            f"{_x(s['predicted'])} | {mp} | "
            f"{_pct(s['overhead_fraction']) if ours else '–'} | {_f(s['tokens_median'], '{:.0f}')} |")
    return lines


def sweep_table(results, pair: str, setting: str) -> List[str]:
    """Every variant of each family at this setting: median tok/s and × baseline; the best in bold."""
    fams = [f for f in sweep_families(results, pair)
            if sum(1 for e in engines_of(results, pair) if family_of(results, e) == f) > 1]
    if not fams:
        return []
    lines = [f"| peer | each setting: median tok/s, × {baseline_label(results)} (best in bold) |", "|---|---|"]
    for fam in fams:
        best = best_variant(results, pair, setting, fam)
        cells = []
        for eid in engines_of(results, pair):
            if family_of(results, eid) != fam:
                continue
            s = summarize(results, runs_of(results, pair, setting, eid))
            if s["tps_median"] is None:
                cell = f"{setting_label(results, eid)}: failed"
            else:
                cell = f"{setting_label(results, eid)}: {s['tps_median']:.1f}, {_x(s['ratio'])}"
            cells.append(f"**{cell}**" if eid == best else cell)
        label = results["engines"].get(best or "", {}).get("family_label") or _FAMILY_LABELS.get(fam, fam)
        lines.append(f"| {label} | " + " · ".join(cells) + " |")
    return lines


def ngram_kind_table(results, setting: str) -> List[str]:
    kinds = [k for k in ("grounded", "open", "summary")
             if any(p["kind"] == k for p in results["prompts"].values())]
    names = {k: ", ".join(n for n, p in results["prompts"].items() if p["kind"] == k) for k in kinds}
    head = ("| engine | " + " | ".join(f"{k} ({names[k]}): tok/s, × {baseline_label(results)}" for k in kinds)
            + " |")
    lines = [head, "|---|" + "---|" * len(kinds)]
    for eid in shown_engines(results, "ngram", setting):
        cells = []
        for k in kinds:
            s = summarize(results, runs_of(results, "ngram", setting, eid, kinds=[k]))
            cells.append("–" if s["tps_median"] is None else f"{s['tps_median']:.1f}, {_x(s['ratio'])}")
        lines.append(f"| {shown_label(results, 'ngram', eid)} | " + " | ".join(cells) + " |")
    return lines


def calibration_line(results, pair: str, setting: str) -> str:
    cal = pair_calibration(results, pair, setting)
    if cal is None:
        return "_No calibration for this pair and setting._"
    v = cal["v"]
    vs = ", ".join(f"{x:.2f}" for x in v[1:])
    alpha = "–" if cal.get("alpha") is None else f"{cal['alpha']:.3f}"
    c = "0 (n-gram lookup)" if pair == "ngram" else f"{cal['c']:.3f}"
    return (f"Calibrated in this run at this setting: T_target(1) = {cal['target_ms'][0]:.1f} ms, "
            f"c = {c}, v(k) for k = 2..{len(v)}: {vs}; calibration α = {alpha}.")


# ---------------------------------------------------------------------------
# targets
# ---------------------------------------------------------------------------


def _target(issue: int, goal: str, st: Optional[Dict[str, Any]], threshold: float, shown: str,
            note: str = "", band: Optional[Tuple[float, float]] = None,
            value: Optional[float] = None) -> Dict[str, Any]:
    """One goal: judged on ``st["median"]`` (a median of per-block ratios, its
    bootstrap interval in ``st["lo"]``/``st["hi"]``) against ``threshold``
    (≥), or inside ``band`` when given; ``value`` for goals that are not a
    ratio (overhead, duration: met when value ≥ threshold)."""
    lo = hi = None
    if st is not None:
        value, lo, hi = st.get("median"), st.get("lo"), st.get("hi")
    if value is None:
        met = None
    elif band is not None:
        met = band[0] <= value <= band[1]
    else:
        met = value >= threshold
    unresolved = False
    if met is not None and lo is not None and hi is not None:
        if band is not None:
            unresolved = (lo < band[0] <= hi) or (lo <= band[1] < hi)
        else:
            unresolved = lo < threshold <= hi
    return {"issue": issue, "goal": goal, "value": value, "lo": lo, "hi": hi, "threshold": threshold,
            "band": band, "measured": shown, "met": met, "unresolved": unresolved, "note": note}


def _band_all(issue: int, goal: str, stats: Dict[str, Dict[str, Any]], shown: str, note: str) -> Dict[str, Any]:
    """A band goal over several engines: met when every engine's median is inside
    THEORY_BAND; the value shown is the one furthest from 1."""
    ok = {e: st for e, st in stats.items() if st["median"] is not None}
    if not ok:
        return _target(issue, goal, None, THEORY_BAND[0], shown, note, band=THEORY_BAND)
    worst = max(ok, key=lambda e: abs(math.log(ok[e]["median"])))
    t = _target(issue, goal, ok[worst], THEORY_BAND[0], shown, note, band=THEORY_BAND)
    t["met"] = all(THEORY_BAND[0] <= st["median"] <= THEORY_BAND[1] for st in ok.values())
    t["unresolved"] = any(
        st["lo"] is not None and ((st["lo"] < THEORY_BAND[0] <= st["hi"]) or (st["lo"] <= THEORY_BAND[1] < st["hi"]))
        for st in ok.values())
    return t


def _gname(eid: str) -> str:
    return eid.replace("gamma", "γ=")


def targets(results) -> List[Dict[str, Any]]:
    """Each benchmark goal of the issues, judged on one statistic — the median
    over blocks of per-block tok/s ratios, with its bootstrap interval — at
    every setting the goal names (every setting of the run when it names
    none).  "× plain" is against llama.cpp's plain decoding; a comparison
    with a peer is against the peer's best variant at that setting (highest
    median tok/s), block by block."""
    out: List[Dict[str, Any]] = []
    pairs = results.get("pairs", {})
    settings = results.get("settings", {})
    have = lambda p, s: p in pairs and s in settings  # noqa: E731
    base = baseline_label(results)

    def r(pair, setting, eid, kinds=None):
        return stat(ratios(results, pair, setting, eid, kinds))

    def vs(pair, setting, a, b, kinds=None):
        return stat(block_ratios(results, pair, setting, a, b, kinds))

    def best_fixed(pair, setting):
        meds = {e: median(x.get("tps") for x in runs_of(results, pair, setting, e)) for e in FIXED_GAMMA}
        meds = {e: m for e, m in meds.items() if m is not None}
        return max(meds, key=meds.get) if meds else None

    def mp(pair, setting, eid):
        rows = [x for x in runs_of(results, pair, setting, eid) if x.get("tps") and x.get("predicted")]
        return stat([run_ratio(results, x) / x["predicted"] for x in rows if run_ratio(results, x) is not None])

    def label(s):
        return settings[s]["label"]

    # --- issue #3: the memory-bound pair -----------------------------------
    if have("memory", "t1"):
        auto = r("memory", "t1", "auto")
        bf = best_fixed("memory", "t1")
        extra = ""
        if bf:
            b = r("memory", "t1", bf)
            extra = f"; best fixed γ: {bf[5:]} at {_xci(b['median'], b['lo'], b['hi'])}"
        ctl = r("memory", "t1", "plain")
        out.append(_target(3, "T = 1, top_k 0, top_p 1: ≥ 1.5× plain decoding", auto, 1.5,
                           f"γ=auto {_xci(auto['median'], auto['lo'], auto['hi'])}{extra}",
                           f"memory-bound pair, × {base}; our own plain decoding ran at "
                           f"{_xci(ctl['median'], ctl['lo'], ctl['hi'])} of it"))
    for s, peer, thr, goal in (
            ("t1", "llama-speculative-simple", 1.1, "T = 1: ≥ 1.1× `llama-speculative-simple`"),
            ("t1", "llama-speculative", 1.0, "T = 1: at least on par with `llama-speculative` (which is not exact)"),
            ("t0", "llama-speculative-simple", 1.0, "T = 0: at least as fast as `llama-speculative-simple`")):
        if not have("memory", s) or not runs_of(results, "memory", s, "auto"):
            continue
        best = best_variant(results, "memory", s, peer)
        if best is None:
            continue
        st = vs("memory", s, "auto", best)
        out.append(_target(3, goal, st, thr,
                           f"γ=auto / {peer} ({setting_label(results, best)}, its fastest): "
                           f"{_xci(st['median'], st['lo'], st['hi'])}",
                           "'on par' read as ≥ 1.00×" if thr == 1.0 and "par" in goal else ""))
    if "memory" in pairs:
        for s in settings:
            stats = {e: mp("memory", s, e) for e in SPEC_OURS}
            stats = {e: st for e, st in stats.items() if st["median"] is not None}
            if not stats:
                continue
            shown = ", ".join(f"{_gname(e)} {st['median']:.2f}{_ci(st['lo'], st['hi'])}" for e, st in stats.items())
            out.append(_band_all(3, "Measured speed-up ≥ 0.9 of the theory's prediction from the α, c and v(k) "
                                    f"measured in the same run ({label(s)})", stats, shown,
                                 f"memory-bound pair, measured × {base} over predicted; a miss outside "
                                 f"{THEORY_BAND[0]}–{THEORY_BAND[1]} for any engine"))
    if "memory" in pairs:
        ov = {}
        for s in settings:
            for e in SPEC_OURS + ("plain",):
                v = summarize(results, runs_of(results, "memory", s, e))["overhead_fraction"]
                if v is not None:
                    ov[(s, e)] = v
        worst = max(ov.items(), key=lambda kv: kv[1]) if ov else None
        out.append(_target(3, "Python orchestration overhead ≤ 5% of step time", None, -0.05,
                           "–" if worst is None else
                           f"worst median {_pct(worst[1])} ({worst[0][1]}, {label(worst[0][0])}); "
                           f"median over all {_pct(median(ov.values()))}",
                           "decode time outside draft, target and sampling kernels, memory-bound pair",
                           value=None if worst is None else -worst[1]))
    # --- issue #4 ------------------------------------------------------------
    if "compute" in pairs:
        for s in settings:
            st = r("compute", s, "auto")
            if st["median"] is None:
                continue
            best = best_variant(results, "compute", s, "llama-speculative")
            peer = r("compute", s, best) if best else None
            out.append(_target(4, "Compute-bound pair (Qwen Q4_K_M target, Q4_0 draft): `gamma=\"auto\"` ≥ 0.97× "
                                  f"plain decoding ({label(s)})", st, 0.97,
                               f"γ=auto {_xci(st['median'], st['lo'], st['hi'])}"
                               + (f"; llama-speculative, its fastest setting: {_x(peer['median'])}" if peer else ""),
                               f"× {base}"))
    if "memory" in pairs:
        for s in settings:
            bf = best_fixed("memory", s)
            if bf is None or not runs_of(results, "memory", s, "auto"):
                continue
            st = vs("memory", s, "auto", bf)
            out.append(_target(4, "Memory-bound pair (F32 target, Q4_0 draft): `gamma=\"auto\"` within 3% of "
                                  f"the best fixed γ in {{2, 4, 6, 8}}, or better ({label(s)})", st, 0.97,
                               f"γ=auto / γ={bf[5:]} (the fastest fixed γ): {_xci(st['median'], st['lo'], st['hi'])}",
                               "median of per-block ratios"))
    for pair in ("memory", "compute"):
        if pair not in pairs:
            continue
        for s in settings:
            st = mp(pair, s, "auto")
            if st["median"] is None:
                continue
            out.append(_target(4, "For each pair, the measured speed-up against the theory's prediction: aim for "
                                  f"≥ 0.9 ({pairs[pair]['label']}, {label(s)})", st, THEORY_BAND[0],
                               f"γ=auto measured/predicted {_f(st['median'])}{_ci(st['lo'], st['hi'])}",
                               f"measured × {base}; a miss outside {THEORY_BAND[0]}–{THEORY_BAND[1]}",
                               band=THEORY_BAND))
    # --- issue #7: the n-gram pair -------------------------------------------
    if "ngram" in pairs:
        for s in settings:
            if not runs_of(results, "ngram", s, "ngram"):
                continue
            st = r("ngram", s, "ngram", ["grounded"])
            out.append(_target(7, "Code-editing and document-grounded prompts, F32 target: ≥ 1.5× plain "
                                  f"decoding ({label(s)})", st, 1.5,
                               f"n-gram {_xci(st['median'], st['lo'], st['hi'])}", f"× {base}"))
        for s in settings:
            best = best_variant(results, "ngram", s, "pld", ["grounded"])
            if best is None or not runs_of(results, "ngram", s, "ngram"):
                continue
            blocks = block_ratios(results, "ngram", s, "ngram", best, ["grounded"])
            st = stat(blocks)
            out.append(_target(7, "… and ≥ 1.2× llama-cpp-python's `LlamaPromptLookupDecoding` on the same "
                                  f"target and prompts ({label(s)})", st, 1.2,
                               f"n-gram / PromptLookup {setting_label(results, best)} "
                               f"(its fastest on these prompts): {_xci(st['median'], st['lo'], st['hi'])} "
                               f"(blocks: {', '.join(f'{b:.2f}' for b in blocks)})"))
        for s in settings:
            rows = runs_of(results, "ngram", s, "ngram", ["open"])
            if not rows:
                continue
            st = r("ngram", s, "ngram", ["open"])
            worst = min((x for x in (run_ratio(results, y) for y in rows) if x is not None), default=None)
            out.append(_target(7, f"Open-ended prompts: never below 0.97× plain decoding ({label(s)})",
                               st, 0.97, f"median {_xci(st['median'], st['lo'], st['hi'])}, worst single run "
                                         f"{_x(worst)}", f"× {base}; judged on the median over the open prompts"))
    # --- issue #6 --------------------------------------------------------------
    dur = results.get("duration_seconds")
    cfg = results["config"]
    default_full = (not cfg.get("quick") and cfg.get("engines") is None and cfg.get("tokens") == 128
                    and cfg.get("repeats") == 1 and len(cfg.get("pairs", ())) == 3
                    and len(cfg.get("settings", ())) == 3 and len(cfg.get("prompts", ())) == 5)
    if dur is not None and (cfg.get("quick") or default_full):
        quick = cfg.get("quick")
        limit = 10 if quick else 60
        out.append(_target(6, f"{'`--quick`' if quick else 'The full run'} finishes within {limit} minutes "
                              "on this 2-core machine", None, -limit, f"{dur / 60:.1f} min",
                           "" if results.get("complete") else "run interrupted", value=-dur / 60))
    return out


def aa_noise(results) -> str:
    """How far two runs doing identical work can differ here: γ=auto runs that
    never drafted (plain decoding through the same engine) against our plain
    run of their block."""
    rs = [run_ratio(results, r, to="plain") for r in results["runs"]
          if r["engine"] == "auto" and r.get("gamma_runs") and all(g == 0 for g, _ in r["gamma_runs"])]
    rs = [x for x in rs if x is not None]
    if len(rs) < 3:
        return ""
    return (f"Noise floor of this run: {len(rs)} γ=auto runs never drafted, i.e. did exactly the work "
            f"of our plain decoding; against our plain run of their block they measured "
            f"{min(rs):.2f}× – {statistics.median(rs):.2f}× (median) – {max(rs):.2f}×. "
            f"Differences of that size between single runs are machine noise; the medians over "
            f"{results['config']['repeats'] * len(results['prompts'])} blocks per setting are steadier, "
            f"and their intervals say how much: a goal whose interval includes its threshold is marked "
            f"as not resolved by this run.")


def targets_lines(results) -> List[str]:
    lines = ["| issue | goal | measured [95% interval] | met |", "|---|---|---|---|"]
    for t in targets(results):
        met = {True: "met", False: "**not met**", None: "not measured"}[t["met"]]
        if t.get("unresolved"):
            met += " (not resolved: the interval includes the threshold)"
        note = f" ({t['note']})" if t["note"] else ""
        lines.append(f"| #{t['issue']} | {t['goal']} | {t['measured']}{note} | {met} |")
    return lines


# ---------------------------------------------------------------------------
# RESULTS.md
# ---------------------------------------------------------------------------


def render(results, plots: Dict[str, str], data: str = "results.json") -> str:
    cfg = results["config"]
    m = results.get("machine", {})
    v = results.get("versions", {})
    L: List[str] = ["## End-to-end decoding", ""]
    L.append("Generated by the benchmark suite (`python -m bench`); every number below comes from the one run "
             f"described here, and every individual run is in [results.json]({data}).")
    if not results.get("complete"):
        L += ["", "**This run was interrupted: the tables cover only what was measured.**"]
    L += ["", "```", results["command"], "```", ""]
    la0, la1 = results.get("load_average_start"), results.get("load_average_end")
    L += [
        f"- Run: {results.get('started')} → {results.get('finished')}, "
        f"{(results.get('duration_seconds') or 0) / 60:.1f} min; load average (1/5/15 min) at start "
        f"{_la(la0)}, at end {_la(la1)}" + _run_loads(results) + ".",
        f"- Machine: {m.get('cpu')}, {m.get('cores')} cores, {m.get('memory_gb', '?')} GB; kernel ISA in use "
        f"`{m.get('isa')}` (supported: {', '.join(m.get('isas_supported', []))}); "
        f"{cfg['threads']} threads for every engine; {m.get('platform')}, Python {m.get('python')}.",
        f"- Versions: specdec-cpu {v.get('specdec_cpu')}"
        + (f" (git {v['specdec_cpu_git']})" if v.get("specdec_cpu_git") else "")
        + f", llama-cpp-python {v.get('llama_cpp_python')}, "
        + (f"llama.cpp peers built from the vendored llama.cpp of the llama-cpp-python "
           f"{v.get('peer_build', {}).get('llama_cpp_python', v.get('llama_cpp_python'))} sdist "
           f"(their `--version`: `{v['llama_cpp']}`), " if v.get("llama_cpp") else "")
        + f"numpy {v.get('numpy')}"
        + (f", matplotlib {v['matplotlib']}" if v.get("matplotlib") else "") + ".",
        f"- Workload: {len(results['prompts'])} prompt(s) × {cfg['repeats']} repeat(s) per setting, at most "
        f"{cfg['tokens']} new tokens each, context {cfg['ctx']}, base seed {cfg['seed']}.",
        "",
        "### Method",
        "",
    ]
    L += method_lines(results)
    L += [
        "",
        "Prompts (bench/prompts.py), each sent as one user message:",
        "",
        "| prompt | kind | what |",
        "|---|---|---|",
    ]
    for name, p in results["prompts"].items():
        L.append(f"| {name} | {p['kind']} | {p['description']} |")
    L.append("")
    if plots:
        L += ["### Plots", ""]
        titles = {"tps": "Tokens/s per engine, pair and setting (median, min–max bars)",
                  "theory": "Measured vs predicted speed-up over plain decoding",
                  "verify": "Measured verify cost v(k) = T_target(k) / T_target(1) of each target"}
        for key, fname in plots.items():
            L += [f"![{titles[key]}]({fname})", f"*{titles[key]}* ([{fname}]({fname}))", ""]
    for pair, info in results["pairs"].items():
        for s, sinfo in results["settings"].items():
            if not runs_of(results, pair, s):
                continue
            L += [f"### {info['label'].capitalize()} pair ({info['description']}), {sinfo['label']}", ""]
            L += pair_table(results, pair, s)
            sweep = sweep_table(results, pair, s)
            if sweep:
                L += ["", "Peers' settings, every one run in every block (the table above shows each peer's "
                          "best, by median tok/s):", ""] + sweep
            L += ["", calibration_line(results, pair, s) + contention_line(results, pair, s), ""]
            extra = in_run_line(results, pair, s)
            if extra:
                L += [extra, ""]
            if pair == "ngram":
                L += ["By prompt kind:", ""] + ngram_kind_table(results, s) + [""]
    failed = [r for r in results["runs"] if r.get("error")]
    if failed:
        L += ["### Failed runs", ""]
        L += [f"- block {r['block']} {r['setting']} {r['prompt']} {r['engine']}: {r['error']}" for r in failed]
        L.append("")
    L += command_lines(results)
    errs = results.get("peer_start_errors") or []
    if results.get("peer_error"):
        errs = [f"llama.cpp peers: {results['peer_error']}"] + list(errs)
    if errs:
        L += ["### Peers that did not run", ""] + [f"- {e}" for e in errs] + [""]
    L += ["## Targets", "",
          "Each goal of the issues' benchmark sections, as measured in this run "
          "(the issue's wording quoted; met means the number reached the goal's threshold):", ""]
    L += targets_lines(results)
    noise = aa_noise(results)
    if noise:
        L += ["", noise]
    L += ["", "Kernel timings are in the [Kernels](#kernels) section below, written by "
              "`python -m bench.kernels`.", ""]
    return "\n".join(L)


def command_lines(results) -> List[str]:
    """The command line of each peer's first run (one per family: its variants
    differ only in the flag the family sweeps)."""
    cmds: Dict[str, Tuple[str, str]] = {}
    for r in results["runs"]:
        fam = family_of(results, r["engine"])
        if r.get("command") and fam not in cmds:
            cmds[fam] = (r["engine"], r["command"])
    if not cmds:
        return []
    L = ["### Peer command lines (first run of each; prompt abbreviated; `<cache>` is "
         "`$SPECDEC_CACHE_DIR`, else `~/.cache/specdec-cpu`; the other settings of a peer differ only in "
         "the flags the method lists; llama-server listens on a free port of 127.0.0.1, its sampling flags "
         "are only defaults: each run is one `POST /completion` that sets them, see the last line)", ""]
    for fam, (e, c) in cmds.items():
        L += [f"- {e}: `{_abbrev_prompt(c)}`"]
    if any(results["engines"].get(e, {}).get("kind") == "server" for e, _ in cmds.values()):
        L += ["- llama-server request: `POST /completion` with `{\"prompt\": <the templated prompt, raw>, "
              "\"n_predict\": N, \"temperature\": T, \"top_k\": K, \"top_p\": P, \"min_p\": M, "
              "\"seed\": S, \"samplers\": [\"temperature\", \"top_k\", \"top_p\", \"min_p\"], "
              "\"stream\": false, \"return_tokens\": true, \"cache_prompt\": true}`"]
    L.append("")
    return L


def method_lines(results) -> List[str]:
    """The "Method" bullets: how this run measured what the tables show."""
    cfg = results["config"]
    eng = results.get("engines", {})
    kinds = {e.get("kind") for e in eng.values()}
    base = baseline_id(results)
    sweep = cfg.get("peer_draft_max")
    sweep_s = ", ".join(map(str, sweep)) if isinstance(sweep, list) else str(sweep)
    fams = {e.get("family") for e in eng.values() if e.get("family")}
    L = [
        "- **Baseline.** " + (
            "The denominator of every \"× plain\" figure and of every goal is llama.cpp's own plain decoding, "
            "`llama-completion`, run in every block (what a user would otherwise run). Our plain decoding "
            "(γ = 0, the same engine as our speculative runs) runs in every block as well, as a control: its "
            "row gives the ratio of the two." if base == "llama-completion" else
            "llama.cpp's plain decoding did not run, so speed-ups are against our plain decoding (γ = 0)."),
        "- **Interleaving and statistics.** For each (target, setting, prompt, repeat) every engine runs once, "
        "back to back, in an order rotated by one from block to block, so that a change of machine load hits "
        "all engines alike. tok/s is reported as min – median – max over the blocks; a speed-up is the "
        "**median over blocks of per-block ratios** (an engine's tok/s over the baseline's in the same "
        "block), and so is every comparison of two engines. Beside each is a 95% interval: a percentile "
        f"bootstrap of that median, resampling the blocks with replacement ({BOOTSTRAP_RESAMPLES} resamples, "
        f"fixed seed {BOOTSTRAP_SEED}). Pairs sharing the F32 target (memory-bound and n-gram) run in the same "
        "blocks and share the baseline.",
        "- **Same input, same sampling.** Every engine gets the same text: the prompt with the model's chat "
        "template already applied (llama.cpp tools run with the raw prompt: `-no-cnv` for "
        "`llama-completion`; the speculative examples never apply a template; llama-server's `/completion` "
        "takes it raw). " + _prompt_token_check(results) +
        " The llama.cpp tools get the sampler chain `temperature;top_k;top_p;min_p` (ours: temperature → "
        "top-k → top-p → min-p), llama-server the same list in each request's `samplers`. "
        "llama-cpp-python's `Llama` applies its fixed chain (top-k → top-p → "
        "min-p → temperature), which differs from ours only where top-p truncates (T = 0.7).",
        "- **Tokens/s, not wall time.** Models stop at an end-of-generation token, so runs can be shorter "
        "than the token budget (the tokens of every run are in results.json); all rates are "
        "decode-phase tokens per second (prompt processing excluded). Ours: "
        "`GenerationStats.tokens_per_second`. `llama-completion`: generated tokens over eval + sampling "
        "time of its perf report. `llama-speculative[-simple]`: their own `decoded N tokens in X seconds` "
        "line. llama-server: the `timings` of its own answer, `predicted_per_second` = (`predicted_n` − 1) / "
        "`predicted_ms`, its clock starting when the prompt is done (not the client's wall time, which "
        "includes HTTP and the prompt). llama-cpp-python: (n − 1) tokens from the first generated token to "
        "the last.",
    ]
    peers_txt = []
    if "speculative" in kinds:
        peers_txt.append(
            "`llama-speculative` (the draft samples, the target accepts by comparing the two distributions; "
            "not exact) and `llama-speculative-simple` (greedy draft, the target samples and keeps matching "
            f"tokens), each with `--spec-draft-n-max` {sweep_s} (their default is 3) and `--spec-draft-n-min 0`, "
            "same threads (`-t/-tb/-td/-tbd`)")
    if any(e.get("kind") == "server" and e.get("spec_type") == "draft-simple" for e in eng.values()):
        peers_txt.append(
            "`llama-server -md DRAFT --spec-type draft-simple` (llama-server's speculative decoding with a draft "
            "model, the algorithm of `llama-speculative-simple`; in this llama.cpp revision `-md` alone enables "
            f"no speculation) with `--spec-draft-n-max` {sweep_s} and `--spec-draft-n-min 0`, `--parallel 1` "
            "(one client), the same context and threads; one server per setting of the sweep, started "
            "before the target's first block and kept for all its blocks, as a server runs")
    if any(e.get("kind") == "server" and not e.get("spec_type") for e in eng.values()):
        peers_txt.append(
            "`llama-server` without speculation (`--parallel 1`): llama.cpp's plain decoding as a server "
            "runs it, a second plain control beside `llama-completion` and the reference for llama-server's "
            "speculative modes")
    ngram_srv = [e for e in eng.values() if e.get("kind") == "server" and e.get("spec_type")
                 and e.get("spec_type") != "draft-simple"]
    if ngram_srv:
        peers_txt.append(
            "llama-server's draftless speculative modes on the n-gram pair (`--spec-type`, no draft model, "
            "`--parallel 1`): " + "; ".join(
                f"`{e['spec_type']}`" + (f" with `{' '.join(e.get('server_args') or [])}`"
                                          if e.get("server_args") else " with its defaults")
                for e in ngram_srv))
    if "lcp" in kinds:
        peers_txt.append(
            "llama-cpp-python's `Llama(draft_model=LlamaPromptLookupDecoding(max_ngram_size=2, "
            "num_pred_tokens=N))` with its default N = 10 and N = 2 (its documentation's advice for CPU-only "
            "machines)")
    if peers_txt:
        L.append("- **Peers, at their best settings.** " + "; ".join(peers_txt) + ". " + (
            "Each peer with several settings runs every one of them in every block; per (pair, setting) the "
            "tables and goals use the one with the highest median tok/s over the blocks (a choice made "
            "after the fact, which if anything favours the peer), and a table under each pair's table shows "
            "the whole sweep; results.json keeps every run." if fams else ""))
    L += [
        "- **Goals.** Each is judged on one statistic, the median of per-block ratios (against llama.cpp's "
        "plain decoding, or against a peer's best setting block by block), at every setting it names — at "
        "every setting of the run when it names none — with its interval. A goal is met when the median "
        "reaches the threshold; when the interval includes the threshold the run does not resolve it, and "
        "the table says so. measured / predicted counts as a miss outside "
        f"{THEORY_BAND[0]}–{THEORY_BAND[1]}, either way.",
        "- **Theory.** Each pair is calibrated in the same run at each setting "
        "(`specdec_cpu.planning.calibrate`, fresh measurement, γ_max = 8): T_target(k) for k = 1..9 gives "
        "v(k), T_draft(1) / T_target(1) gives c. The predicted speed-up of a run uses the mean α measured in "
        "that run: `theory.speedup(α, γ, c, v)` for fixed γ; for γ = auto and n-gram runs, whose γ varies "
        "per step (0 included), Σ E[tokens](α, γ_i) / Σ (γ_i·c + v(γ_i + 1)) over the steps. n-gram "
        "lookup is taken as free (c = 0). The theory predicts the speed-up over plain decoding at the "
        "calibrated T_target(1); measured / predicted is the median over blocks of (the run's ratio to "
        f"{'llama.cpp' if base == 'llama-completion' else 'our'} plain decoding in its block) / (its "
        "prediction). γ = auto starts from this calibration (its controllers are reset at each setting) "
        "and refines α, c and v online.",
        "- **Caches and controllers.** Before each block the block's prompt is given to every model of ours "
        "(target and draft), outside the timed runs: a draft model otherwise takes in the prompt during its "
        "first draft, which the statistics count as decode time, while the peers' decode figures exclude "
        "both models' prompt processing. Each decoder (one per drafting mode) stays loaded for the whole "
        "target; its γ=auto controllers carry what they learnt from one prompt to the next, as in a server "
        "process, and are reset only when a setting's calibration is attached.",
        "- **Python overhead**: decode time not spent in the draft model, the target model or a sampling "
        "kernel (`GenerationStats.overhead_seconds / decode_seconds`).",
    ]
    return L


def _others_cores(results, run) -> Optional[float]:
    """Other processes' cores during ``run``; None for a llama-server run of a
    suite that counted the server's own CPU as another process's (before
    ``server_cpu_is_ours``)."""
    kind = results.get("engines", {}).get(run["engine"], {}).get("kind")
    if kind == "server" and not results["config"].get("server_cpu_is_ours"):
        return None
    return run.get("others_cores")


def _run_loads(results) -> str:
    out = ""
    loads = [r["load_1min"] for r in results["runs"] if r.get("load_1min") is not None]
    if loads:
        out += (f"; 1-min load average at the start of each run (ours included): median "
                f"{statistics.median(loads):.2f}, max {max(loads):.2f}")
    others = [x for x in (_others_cores(results, r) for r in results["runs"]) if x is not None]
    unmetered = sum(1 for r in results["runs"] if r.get("others_cores") is not None
                    and _others_cores(results, r) is None)
    if others:
        thr = results["config"].get("busy_cores_threshold", 0.25)
        busy = sum(1 for x in others if x > thr)
        out += (f". Other processes' CPU use during each run (all busy CPU time minus ours): median "
                f"{statistics.median(others):.2f} cores, max {max(others):.2f}; above {thr} cores in "
                f"{busy} of {len(others)} runs (per run in results.json)")
        if unmetered:
            out += (f"; the {unmetered} llama-server runs are left out: this run's meter counted the server's "
                    "own CPU as another process's")
        if results["config"].get("wait_for_quiet"):
            out += "; before each block the suite waited (up to 60 s) while others used more than that"
    return out


def in_run_costs(results, pair: str, setting: str) -> Optional[Dict[str, Any]]:
    """Step costs observed in the timed runs themselves (not the calibration).

    T(1): median target seconds per step of our plain runs; T(γ+1): the same
    for each fixed-γ engine; d: median draft seconds per drafted token (the
    draft model's pass plus sampling its row).  v(k) = T(k)/T(1), c = d/T(1).
    """
    def per_step(eid, what="target_seconds", per="steps"):
        vals = [r[what] / r[per] for r in runs_of(results, pair, setting, eid)
                if r.get(per) and r.get(what) is not None]
        return median(vals)

    t1 = per_step("plain")
    if not t1:
        return None
    out: Dict[str, Any] = {"t1_ms": 1000 * t1, "v": {}, "c": None, "predicted": {}}
    ds = []
    for eid in ("gamma2", "gamma4", "gamma6", "gamma8"):
        tk = per_step(eid)
        if tk is None:
            continue
        out["v"][int(eid[5:]) + 1] = tk / t1
        d = per_step(eid, "draft_seconds", "drafted")
        if d is not None:
            ds.append(d)
    if not out["v"]:
        return None
    if ds:
        out["c"] = statistics.median(ds) / t1
        from specdec_cpu.planning import theory
        for k, v in out["v"].items():
            alpha = summarize(results, runs_of(results, pair, setting, f"gamma{k - 1}"))["mean_alpha"]
            if alpha is not None:
                out["predicted"][k - 1] = float(theory.expected_tokens(alpha, k - 1)) / ((k - 1) * out["c"] + v)
    return out


def in_run_line(results, pair: str, setting: str) -> str:
    cost = in_run_costs(results, pair, setting)
    if cost is None:
        return ""
    vs = ", ".join(f"v({k}) = {v:.2f}" for k, v in sorted(cost["v"].items()))
    line = (f"Step costs seen in the timed runs themselves: T(1) = {cost['t1_ms']:.1f} ms (plain runs), {vs}"
            f" (fixed-γ runs)")
    if cost["c"] is not None:
        line += (f", c = {cost['c']:.3f} (draft time per drafted token, its sampling included)")
        if cost["predicted"]:
            preds = ", ".join(f"γ={g} {p:.2f}×" for g, p in sorted(cost["predicted"].items()))
            line += f"; with these costs and each run's α the theory predicts {preds}"
    return line + "."


def contention_line(results, pair: str, setting: str) -> str:
    rows = [r for r in runs_of(results, pair, setting) if _others_cores(results, r) is not None]
    if not rows:
        return ""
    thr = results["config"].get("busy_cores_threshold", 0.25)
    busy = [r for r in rows if _others_cores(results, r) > thr]
    blocks = {r["block"] for r in busy}
    n_blocks = len({r["block"] for r in rows})
    return (f" Runs disturbed by other processes (> {thr} cores): {len(busy)} of {len(rows)}, "
            f"in {len(blocks)} of {n_blocks} blocks.")


def _la(la) -> str:
    return "?" if not la else " / ".join(f"{x:.2f}" for x in la)


def _prompt_token_check(results) -> str:
    ours = {}
    bad = []
    checked = 0
    for r in results["runs"]:
        if r["engine"] == "plain" and r.get("prompt_tokens"):
            ours[(r["target"], r["prompt"])] = r["prompt_tokens"]
    for r in results["runs"]:
        key = (r["target"], r["prompt"])
        if r["engine"] != "plain" and r.get("prompt_tokens") and key in ours:
            checked += 1
            if r["prompt_tokens"] != ours[key]:
                bad.append(f"{r['engine']} on {r['prompt']}: {r['prompt_tokens']} vs {ours[key]}")
    if not checked:
        return ""
    if not bad:
        return (f"The prompt token counts every engine reports agree with ours in all {checked} runs "
                "that report one.")
    return "Prompt token counts differ from ours in: " + "; ".join(sorted(set(bad))[:6]) + "."


def _abbrev_prompt(cmd: str) -> str:
    parts = cmd.split(" -p ", 1)
    if len(parts) != 2:
        return cmd
    rest = parts[1]
    # the prompt is one shell-quoted word; find its end
    if rest.startswith("'"):
        end = 1
        while True:
            j = rest.find("'", end)
            if j < 0:
                return cmd
            if rest[j:j + 4] == "'\\''":
                end = j + 4
                continue
            end = j + 1
            break
        return parts[0] + " -p '<prompt>'" + rest[end:]
    return parts[0] + " -p <prompt> " + rest.split(" ", 1)[-1]


def other_sections(text: str) -> List[str]:
    """The "## " sections of ``text`` this module does not write, in order."""
    sections: List[str] = []
    current: Optional[List[str]] = None
    for line in text.splitlines():
        if line.startswith("## "):
            if current is not None:
                sections.append("\n".join(current).rstrip())
            current = None if line.strip() in OWN_HEADINGS else [line]
        elif current is not None:
            current.append(line)
    if current is not None:
        sections.append("\n".join(current).rstrip())
    return sections


def write_results_md(results, path: Path, plots: Dict[str, str], data: str = "results.json") -> None:
    """Write our sections, keeping every other "## " section of the file (Kernels)."""
    kept = other_sections(path.read_text() if path.exists() else "")
    if not any(s.startswith("## Kernels") for s in kept):
        kept.append("## Kernels\n\n_Not measured yet: run `python -m bench.kernels` "
                    "(it writes this section)._")
    body = "# Benchmark results\n\n" + render(results, plots, data) + "\n" + "\n\n".join(kept) + "\n"
    path.write_text(body)


def headline(results) -> str:
    """A few lines for the terminal: the comparisons people ask for first."""
    out = ["", f"headline (median tok/s, × {baseline_label(results)}, median of per-block ratios [95% interval]):"]

    def row(pair, s, eids, kinds=None):
        cells = []
        for e in eids:
            fam = [x for x in engines_of(results, pair) if family_of(results, x) == e]
            if len(fam) > 1 or (fam and fam[0] != e):
                e = best_variant(results, pair, s, e, kinds) or e
            sm = summarize(results, runs_of(results, pair, s, e, kinds))
            if sm["tps_median"] is not None:
                cells.append(f"{e} {sm['tps_median']:.1f} ({_xci(sm['ratio'], sm['ratio_lo'], sm['ratio_hi'])})")
        return ", ".join(cells)

    spec = ["llama-completion", "plain", "gamma4", "auto", "llama-speculative", "llama-speculative-simple",
            "llama-server-draft"]
    for pair in ("memory", "compute"):
        if pair in results["pairs"]:
            for s in results["settings"]:
                cells = row(pair, s, spec)
                if cells:
                    out.append(f"  {results['pairs'][pair]['label']} {s}: " + cells)
    if "ngram" in results["pairs"]:
        ids = ["llama-completion", "plain", "ngram", "pld"]
        for e in engines_of(results, "ngram"):
            if e.startswith("llama-server-") and family_of(results, e) not in ids:
                ids.append(family_of(results, e))
        for s in results["settings"]:
            cells = row("ngram", s, ids, ["grounded"])
            if cells:
                out.append(f"  n-gram grounded {s}: " + cells)
    for t in targets(results):
        state = 'MET' if t['met'] else 'not met' if t['met'] is False else 'n/a'
        if t.get("unresolved"):
            state += " (unresolved)"
        out.append(f"  #{t['issue']} {state}: {t['goal']} — {t['measured']}")
    return "\n".join(out)


# ---------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------


def make_plots(results, out_dir: Path) -> Dict[str, str]:
    """Write the PNGs (matplotlib, the ``plot`` extra); {} when it is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    made: Dict[str, str] = {}
    for key, fn in (("tps", _plot_tps), ("theory", _plot_theory), ("verify", _plot_verify)):
        fig = fn(results, plt)
        if fig is None:
            continue
        fig.savefig(out_dir / PLOT_FILES[key], dpi=110, bbox_inches="tight")
        plt.close(fig)
        made[key] = PLOT_FILES[key]
    return made


def _colour(eid: str) -> str:
    if eid == "plain":
        return "#7f7f7f"
    if eid.startswith("gamma") or eid == "auto":
        return "#1f77b4" if eid != "auto" else "#08306b"
    if eid.startswith("ngram"):
        return "#2ca02c"
    if eid == "llama-completion":
        return "#000000"
    if eid.startswith("llama-server"):
        return "#9467bd"
    if eid.startswith("llama-"):
        return "#d62728"
    return "#ff7f0e"


def _plot_tps(results, plt):
    pairs = [p for p in results["pairs"] if any(pp == p for r in results["runs"] for pp in r.get("pairs", ()))]
    settings = list(results["settings"])
    if not pairs or not settings:
        return None
    n_eng = max(len(shown_engines(results, p, s)) for p in pairs for s in settings)
    fig, axes = plt.subplots(len(pairs), len(settings), squeeze=False,
                             figsize=(4.2 * len(settings), 0.42 * n_eng * len(pairs) + 1.2 * len(pairs)))
    for i, p in enumerate(pairs):
        for j, s in enumerate(settings):
            eids = shown_engines(results, p, s)
            ax = axes[i][j]
            med, lo, hi, labels, cols = [], [], [], [], []
            for e in eids:
                sm = summarize(results, runs_of(results, p, s, e))
                if sm["tps_median"] is None:
                    continue
                med.append(sm["tps_median"])
                lo.append(sm["tps_median"] - sm["tps_min"])
                hi.append(sm["tps_max"] - sm["tps_median"])
                labels.append(_short(results, e))
                cols.append(_colour(e))
            y = list(range(len(med)))[::-1]
            ax.barh(y, med, xerr=[lo, hi], color=cols, capsize=2)
            ax.set_yticks(y)
            ax.set_yticklabels(labels, fontsize=8)
            ax.set_title(f"{results['pairs'][p]['label']} · {results['settings'][s]['label']}", fontsize=9)
            ax.set_xlabel("tokens/s", fontsize=8)
            ax.tick_params(axis="x", labelsize=8)
            ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def _short(results, eid: str) -> str:
    fixed = {"plain": "ours plain", "gamma2": "ours γ=2", "gamma4": "ours γ=4", "gamma6": "ours γ=6",
             "gamma8": "ours γ=8", "auto": "ours auto", "ngram": "ours n-gram",
             "ngram-draft": "ours n-gram+draft", "llama-completion": "llama-completion (plain)",
             "llama-speculative": "llama-speculative", "llama-speculative-simple": "llama-spec-simple",
             "pld2": "lcp PromptLookup 2", "pld10": "lcp PromptLookup 10",
             "lcp-plain": "lcp plain", "llama-server-plain": "llama-server plain"}
    if eid in fixed:
        return fixed[eid]
    info = results.get("engines", {}).get(eid, {})
    short = eid.replace("llama-speculative-simple", "llama-spec-simple")
    if info.get("draft_max"):
        short = short.rsplit("-n", 1)[0] + f" (n-max {info['draft_max']})"
    return short


def _plot_theory(results, plt):
    pts = []
    for p in results["pairs"]:
        for s in results["settings"]:
            for e in engines_of(results, p):
                sm = summarize(results, runs_of(results, p, s, e))
                if sm["predicted"] is not None and sm["ratio"] is not None and e != "plain":
                    pts.append((p, s, e, sm["predicted"], sm["ratio"]))
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(6.2, 5.4))
    markers = {"t0": "o", "t0.7": "s", "t1": "^"}
    pair_col = {"memory": "#1f77b4", "compute": "#d62728", "ngram": "#2ca02c"}
    for p, s, e, pred, meas in pts:
        ax.scatter(pred, meas, marker=markers.get(s, "o"), color=pair_col.get(p, "k"), s=36)
        ax.annotate(_short(results, e).replace("ours ", ""), (pred, meas), fontsize=6,
                    xytext=(3, 2), textcoords="offset points")
    lo = min(min(x[3], x[4]) for x in pts) * 0.9
    hi = max(max(x[3], x[4]) for x in pts) * 1.08
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="measured = predicted")
    ax.plot([lo, hi], [0.9 * lo, 0.9 * hi], "k--", lw=0.8, label="0.9 × predicted")
    ax.axhline(1.0, color="#999999", lw=0.6)
    for p, col in pair_col.items():
        if p in results["pairs"]:
            ax.scatter([], [], color=col, label=f"{results['pairs'][p]['label']} pair")
    for s, mk in markers.items():
        if s in results["settings"]:
            ax.scatter([], [], marker=mk, color="#555555", label=results["settings"][s]["label"])
    ax.set_xlabel("predicted speed-up (theory, α from the run, c and v(k) calibrated in the run)")
    ax.set_ylabel(f"measured speed-up over {baseline_label(results)} (median of per-block ratios)")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _plot_verify(results, plt):
    cals = results.get("calibrations", [])
    if not cals:
        return None
    fig, ax = plt.subplots(figsize=(6.2, 4.4))
    styles = {"t0": "-", "t0.7": "--", "t1": ":"}
    targets_seen: Dict[str, str] = {}
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    for c in cals:
        col = targets_seen.setdefault(c["target"], palette[len(targets_seen) % len(palette)])
        k = list(range(1, len(c["v"]) + 1))
        how = {"draft": "with its draft model", "ngram": "n-gram decoder"}.get(c["role"], c["role"])
        label = f"{c['target'].replace('qwen2.5-coder-0.5b-', '').upper()} target ({how}), " \
                f"{results['settings'].get(c['setting'], {}).get('label', c['setting'])}"
        ax.plot(k, c["v"], styles.get(c["setting"], "-"), color=col,
                marker="." if c["role"] == "draft" else "x", label=label)
    kmax = max(len(c["v"]) for c in cals)
    ax.plot([1, kmax], [1, 1], color="#999999", lw=0.6)
    ax.set_xlabel("rows in one target pass, k = γ + 1")
    ax.set_ylabel("v(k) = T_target(k) / T_target(1)")
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
