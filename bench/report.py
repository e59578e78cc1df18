"""Render the suite's results.json: its RESULTS.md sections, the Targets check and the plots.

Speed-ups are computed here from the runs' tok/s, so an older results.json renders with today's rules:
the median over blocks of an engine's tok/s over the baseline's in the same block (llama.cpp's plain
decoding, else ours), with a bootstrap interval (bench/common.py).
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .common import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, fmt, median, stat

#: Headings this module writes; every other "## " section of RESULTS.md is kept.
OWN_HEADINGS = ("## End-to-end decoding", "## Targets")
PLOT_FILES = {"tps": "plot_tokens_per_second.png", "theory": "plot_measured_vs_predicted.png",
              "verify": "plot_verify_cost.png"}
PLOT_TITLES = {"tps": "Tokens/s per engine, pair and setting (median, min–max bars)",
               "theory": "Measured vs predicted speed-up over plain decoding",
               "verify": "Measured verify cost v(k) = T_target(k) / T_target(1) of each target"}
FIXED_GAMMA = ("gamma2", "gamma4", "gamma6", "gamma8")
SPEC_OURS = FIXED_GAMMA + ("auto",)
#: measured / predicted counts as a miss outside this band, either way.
THEORY_BAND = (0.9, 1.1)
Kinds = Optional[Sequence[str]]
#: The shell-quoted word after " -p " in a peer's command line (a ' is written '\'' inside it).
PROMPT_ARG = re.compile(r" -p '(?:[^']|'\\'')*'")


def baseline_id(results) -> str:
    """The denominator of "× plain": llama.cpp's plain decoding when the run has it."""
    b = results.get("baseline", "llama-completion")
    return b if any(r["engine"] == b and r.get("tps") for r in results["runs"]) else results.get("control", "plain")


def baseline_label(results) -> str:
    return "llama.cpp plain" if baseline_id(results) == "llama-completion" else "our plain"


def run_ratio(results, r: Dict[str, Any], to: Optional[str] = None) -> Optional[float]:
    """A run's tok/s over that of engine ``to`` (default: the baseline) in its block."""
    to = to or baseline_id(results)
    base = next((x["tps"] for x in results["runs"] if x["block"] == r["block"] and x["engine"] == to and x.get("tps")),
                None)
    return r["tps"] / base if base and r.get("tps") else None


def runs_of(results, pair: str, setting: str, engine: Optional[str] = None, kinds: Kinds = None) -> List[dict]:
    return [r for r in results["runs"] if pair in r.get("pairs", ()) and r["setting"] == setting
            and (engine is None or r["engine"] == engine) and (kinds is None or r["kind"] in kinds)]


def engines_of(results, pair: str) -> List[str]:
    order = list(results.get("engines", {}))
    present = {r["engine"] for r in results["runs"] if pair in r.get("pairs", ())}
    return [e for e in order if e in present] + sorted(present - set(order))


def _info(results, eid: str) -> Dict[str, Any]:
    return results.get("engines", {}).get(eid, {})


def family_of(results, eid: str) -> str:
    return _info(results, eid).get("family") or eid


def variants(results, pair: str, family: str) -> List[str]:
    return [e for e in engines_of(results, pair) if family_of(results, e) == family]


def setting_label(results, eid: str) -> str:
    return _info(results, eid).get("setting_label") or engine_label(results, eid)


def engine_label(results, eid: str) -> str:
    return _info(results, eid).get("label", eid)


def _family_label(results, eid: str) -> str:
    return _info(results, eid).get("family_label") or family_of(results, eid)


def fastest(results, pair: str, setting: str, eids: Sequence[str], kinds: Kinds = None) -> Optional[str]:
    """The engine of ``eids`` with the highest median tok/s over the blocks of (pair, setting)."""
    meds = {e: median(r.get("tps") for r in runs_of(results, pair, setting, e, kinds)) for e in eids}
    meds = {e: m for e, m in meds.items() if m is not None}
    return max(meds, key=meds.get) if meds else None


def best_variant(results, pair: str, setting: str, family: str, kinds: Kinds = None) -> Optional[str]:
    return fastest(results, pair, setting, variants(results, pair, family), kinds)


def shown_engines(results, pair: str, setting: str) -> List[str]:
    """The engines of a pair's table: each family by its best variant at this setting."""
    out: List[str] = []
    for eid in engines_of(results, pair):
        fam = family_of(results, eid)
        if fam == eid and runs_of(results, pair, setting, eid):
            out.append(eid)
        elif fam != eid and fam not in {family_of(results, e) for e in out}:
            best = best_variant(results, pair, setting, fam)
            out += [best] if best else []
    return out


def ratios(results, pair: str, setting: str, eid: str, kinds: Kinds = None, to: Optional[str] = None) -> List[float]:
    """Per-block tok/s of ``eid`` over ``to`` (default: the baseline), same block."""
    out = [run_ratio(results, r, to) for r in runs_of(results, pair, setting, eid, kinds)]
    return [x for x in out if x is not None]


def block_ratios(results, pair: str, setting: str, a: str, b: str, kinds: Kinds = None) -> List[float]:
    """Per-block tok/s of engine ``a`` over engine ``b`` in the same block."""
    return ratios(results, pair, setting, a, kinds, to=b)


def summarize(results, pair: str, setting: str, eid: str, kinds: Kinds = None) -> Dict[str, Any]:
    """One engine's tok/s range, ratio and measured/predicted (stat dicts), and medians of its per-run figures."""
    ok = [r for r in runs_of(results, pair, setting, eid, kinds) if r.get("tps")]
    tps = [r["tps"] for r in ok]
    rat = [run_ratio(results, r) for r in ok]
    out = {k: median(r.get(k) for r in ok) for k in ("acceptance", "mean_alpha", "tokens_per_step", "mean_gamma",
                                                      "predicted", "overhead_fraction", "tokens")}
    out.update(tps_min=min(tps, default=None), tps_median=median(tps), tps_max=max(tps, default=None),
               ratio=stat(rat), mp=stat([x / r["predicted"] for x, r in zip(rat, ok)
                                         if x is not None and r.get("predicted")]))
    return out


def _x(x: Optional[float]) -> str:
    return "–" if x is None else f"{x:.2f}×"


def _ci(st: Dict[str, Any]) -> str:
    return "" if st["lo"] is None or st["hi"] is None else f" [{st['lo']:.2f}–{st['hi']:.2f}]"


def _xs(st: Dict[str, Any]) -> str:
    return _x(st["median"]) + _ci(st)


def _num_ci(st: Dict[str, Any]) -> str:
    """A stat dict as a plain figure with its interval (measured / predicted)."""
    return "–" if st["median"] is None else fmt(st["median"], 2) + _ci(st)


def _pct(x: Optional[float]) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _tps(s: Dict[str, Any]) -> str:
    if s["tps_median"] is None:
        return "failed"
    return f"{s['tps_min']:.1f} – **{s['tps_median']:.1f}** – {s['tps_max']:.1f}"


def _rate(s: Dict[str, Any], missing: str) -> str:
    """A summary as "median tok/s, × baseline"."""
    return missing if s["tps_median"] is None else f"{s['tps_median']:.1f}, {_x(s['ratio']['median'])}"


def shown_label(results, pair: str, eid: str) -> str:
    """An engine's label in a pair's table; a family's best variant says it is the best of the sweep."""
    n = len(variants(results, pair, family_of(results, eid)))
    if family_of(results, eid) == eid or n < 2:
        return engine_label(results, eid)
    return f"{_family_label(results, eid)}, fastest of {n}: {setting_label(results, eid)}"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def pair_table(results, pair: str, setting: str) -> List[str]:
    lines = [f"| engine | tok/s min – **median** – max | × {baseline_label(results)} (median of per-block ratios) "
             "[95% interval] | acceptance | mean α | tokens/step | mean γ | predicted × | measured / predicted "
             "[95% interval] | Python overhead | tokens/run (median) |", "|---" * 11 + "|"]
    for eid in shown_engines(results, pair, setting):
        s = summarize(results, pair, setting, eid)
        ours = _info(results, eid).get("kind") == "ours"
        lines.append(_row([
            shown_label(results, pair, eid), _tps(s), _xs(s["ratio"]), fmt(s["acceptance"], 2),
            fmt(s["mean_alpha"], 3), fmt(s["tokens_per_step"], 2) if ours else "–",
            fmt(s["mean_gamma"], 1) if ours and eid != "plain" else "–", _x(s["predicted"]), _num_ci(s["mp"]),
            _pct(s["overhead_fraction"]) if ours else "–", fmt(s["tokens"], 0)]))
    return lines


def sweep_table(results, pair: str, setting: str) -> List[str]:
    """Every variant of each family at this setting: median tok/s and × baseline; the best in bold."""
    fams = [f for f in dict.fromkeys(family_of(results, e) for e in engines_of(results, pair))
            if len(variants(results, pair, f)) > 1]
    if not fams:
        return []
    lines = [f"| peer | each setting: median tok/s, × {baseline_label(results)} (best in bold) |", "|---|---|"]
    for fam in fams:
        best = best_variant(results, pair, setting, fam)
        cells = []
        for eid in variants(results, pair, fam):
            cell = f"{setting_label(results, eid)}: " + _rate(summarize(results, pair, setting, eid), "failed")
            cells.append(f"**{cell}**" if eid == best else cell)
        lines.append(f"| {_family_label(results, best or fam)} | " + " · ".join(cells) + " |")
    return lines


def ngram_kind_table(results, setting: str) -> List[str]:
    kinds = [k for k in ("grounded", "open", "summary") if any(p["kind"] == k for p in results["prompts"].values())]
    names = {k: ", ".join(n for n, p in results["prompts"].items() if p["kind"] == k) for k in kinds}
    lines = [_row(["engine"] + [f"{k} ({names[k]}): tok/s, × {baseline_label(results)}" for k in kinds]),
             "|---|" + "---|" * len(kinds)]
    for eid in shown_engines(results, "ngram", setting):
        lines.append(_row([shown_label(results, "ngram", eid)]
                          + [_rate(summarize(results, "ngram", setting, eid, [k]), "–") for k in kinds]))
    return lines


def calibration_line(results, pair: str, setting: str) -> str:
    """The pair's calibration at ``setting`` (the n-gram pair's, else its target's with the draft model)."""
    want = [[results["pairs"][pair]["target"], role, setting] for role in ("ngram", "draft")[pair != "ngram":]]
    cals = [c for w in want for c in results.get("calibrations", []) if [c["target"], c["role"], c["setting"]] == w]
    if not cals:
        return "_No calibration for this pair and setting._"
    cal, v = cals[0], cals[0]["v"]
    c = "0 (n-gram lookup)" if pair == "ngram" else f"{cal['c']:.3f}"
    return (f"Calibrated in this run at this setting: T_target(1) = {cal['target_ms'][0]:.1f} ms, c = {c}, "
            f"v(k) for k = 2..{len(v)}: {', '.join(f'{x:.2f}' for x in v[1:])}; calibration α = "
            f"{fmt(cal.get('alpha'), 3)}.")


def _straddles(st: Dict[str, Any], threshold: float, band=None) -> bool:
    """Whether the interval of ``st`` includes the threshold (or an edge of ``band``)."""
    lo, hi = st.get("lo"), st.get("hi")
    if lo is None or hi is None:
        return False
    return (lo < band[0] <= hi) or (lo <= band[1] < hi) if band else lo < threshold <= hi


def _target(issue: int, goal: str, stats: Sequence[Dict[str, Any]], threshold: float, shown: str, note: str = "",
            band=None) -> Dict[str, Any]:
    """One goal, met when the median of every stat of ``stats`` is ≥ ``threshold`` (or inside ``band``);
    not measured when one is None, unresolved when an interval includes the threshold (or an edge of the band)."""
    meds = [st["median"] for st in stats]
    met = None if None in meds else all(band[0] <= m <= band[1] if band else m >= threshold for m in meds)
    return {"issue": issue, "goal": goal, "measured": shown, "note": note, "met": met,
            "unresolved": met is not None and any(_straddles(st, threshold, band) for st in stats)}


def targets(results) -> List[Dict[str, Any]]:
    """The issues' benchmark goals, each judged on a median of per-block ratios with its interval, at every
    setting it names (every setting of the run when it names none); a peer is taken at its best variant."""
    out: List[Dict[str, Any]] = []
    pairs, settings = results.get("pairs", {}), results.get("settings", {})
    base = baseline_label(results)

    def r(pair, s, eid, kinds=None):
        return stat(ratios(results, pair, s, eid, kinds))

    def vs(pair, s, a, b, kinds=None):
        return stat(block_ratios(results, pair, s, a, b, kinds))

    def label(s):
        return settings[s]["label"]

    # issue #3: the memory-bound pair
    if "memory" in pairs and "t1" in settings:
        auto, bf = r("memory", "t1", "auto"), fastest(results, "memory", "t1", FIXED_GAMMA)
        extra = f"; best fixed γ: {bf[5:]} at {_xs(r('memory', 't1', bf))}" if bf else ""
        out.append(_target(3, "T = 1, top_k 0, top_p 1: ≥ 1.5× plain decoding", [auto], 1.5,
                           f"γ=auto {_xs(auto)}{extra}", f"memory-bound pair, × {base}; our own plain decoding "
                           f"ran at {_xs(r('memory', 't1', 'plain'))} of it"))
    for s, peer, thr, goal in (
            ("t1", "llama-speculative-simple", 1.1, "T = 1: ≥ 1.1× `llama-speculative-simple`"),
            ("t1", "llama-speculative", 1.0, "T = 1: at least on par with `llama-speculative` (which is not exact)"),
            ("t0", "llama-speculative-simple", 1.0, "T = 0: at least as fast as `llama-speculative-simple`")):
        best = best_variant(results, "memory", s, peer)
        if best is None or not runs_of(results, "memory", s, "auto"):
            continue
        st = vs("memory", s, "auto", best)
        out.append(_target(3, goal, [st], thr, f"γ=auto / {peer} ({setting_label(results, best)}, its fastest): "
                           f"{_xs(st)}", "'on par' read as ≥ 1.00×" if "par" in goal else ""))
    if "memory" in pairs:
        for s in settings:
            stats = {e: st for e in SPEC_OURS if (st := summarize(results, "memory", s, e)["mp"])["median"] is not None}
            if stats:
                out.append(_target(
                    3, "Measured speed-up ≥ 0.9 of the theory's prediction from the α, c and v(k) measured in the "
                    f"same run ({label(s)})", list(stats.values()), THEORY_BAND[0],
                    ", ".join(f"{e.replace('gamma', 'γ=')} {_num_ci(st)}" for e, st in stats.items()),
                    f"memory-bound pair, measured × {base} over predicted; a miss outside "
                    f"{THEORY_BAND[0]}–{THEORY_BAND[1]} for any engine", band=THEORY_BAND))
        ov = {(s, e): v for s in settings for e in SPEC_OURS + ("plain",)
              if (v := summarize(results, "memory", s, e)["overhead_fraction"]) is not None}
        worst = max(ov.items(), key=lambda kv: kv[1]) if ov else None
        out.append(_target(3, "Python orchestration overhead ≤ 5% of step time",
                           [{"median": None if worst is None else -worst[1]}], -0.05,
                           "–" if worst is None else f"worst median {_pct(worst[1])} ({worst[0][1]}, "
                           f"{label(worst[0][0])}); median over all {_pct(median(ov.values()))}",
                           "decode time outside draft, target and sampling kernels, memory-bound pair"))
    # issue #4
    for s in settings:
        st = r("compute", s, "auto")
        if st["median"] is None:
            continue
        best = best_variant(results, "compute", s, "llama-speculative")
        peer = f"; llama-speculative, its fastest setting: {_x(r('compute', s, best)['median'])}" if best else ""
        out.append(_target(4, "Compute-bound pair (Qwen Q4_K_M target, Q4_0 draft): `gamma=\"auto\"` ≥ 0.97× plain "
                              f"decoding ({label(s)})", [st], 0.97, f"γ=auto {_xs(st)}{peer}", f"× {base}"))
    for s in settings:
        bf = fastest(results, "memory", s, FIXED_GAMMA)
        if bf is None or not runs_of(results, "memory", s, "auto"):
            continue
        st = vs("memory", s, "auto", bf)
        out.append(_target(4, "Memory-bound pair (F32 target, Q4_0 draft): `gamma=\"auto\"` within 3% of the best "
                              f"fixed γ in {{2, 4, 6, 8}}, or better ({label(s)})", [st], 0.97,
                           f"γ=auto / γ={bf[5:]} (the fastest fixed γ): {_xs(st)}", "median of per-block ratios"))
    for pair in ("memory", "compute"):
        for s in settings:
            st = summarize(results, pair, s, "auto")["mp"]
            if st["median"] is not None:
                out.append(_target(4, "For each pair, the measured speed-up against the theory's prediction: aim "
                                      f"for ≥ 0.9 ({pairs[pair]['label']}, {label(s)})", [st], THEORY_BAND[0],
                                   f"γ=auto measured/predicted {_num_ci(st)}",
                                   f"measured × {base}; a miss outside {THEORY_BAND[0]}–{THEORY_BAND[1]}",
                                   band=THEORY_BAND))
    # issue #7: the n-gram pair
    ngram_settings = [s for s in settings if runs_of(results, "ngram", s, "ngram")]
    for s in ngram_settings:
        st = r("ngram", s, "ngram", ["grounded"])
        out.append(_target(7, "Code-editing and document-grounded prompts, F32 target: ≥ 1.5× plain decoding "
                              f"({label(s)})", [st], 1.5, f"n-gram {_xs(st)}", f"× {base}"))
    for s in ngram_settings:
        best = best_variant(results, "ngram", s, "pld", ["grounded"])
        if best is None:
            continue
        blocks = block_ratios(results, "ngram", s, "ngram", best, ["grounded"])
        st = stat(blocks)
        out.append(_target(7, "… and ≥ 1.2× llama-cpp-python's `LlamaPromptLookupDecoding` on the same target and "
                              f"prompts ({label(s)})", [st], 1.2,
                           f"n-gram / PromptLookup {setting_label(results, best)} (its fastest on these prompts): "
                           f"{_xs(st)} (blocks: {', '.join(f'{b:.2f}' for b in blocks)})"))
    for s in settings:
        rows = runs_of(results, "ngram", s, "ngram", ["open"])
        if rows:
            st = r("ngram", s, "ngram", ["open"])
            worst = min((x for x in (run_ratio(results, y) for y in rows) if x is not None), default=None)
            out.append(_target(7, f"Open-ended prompts: never below 0.97× plain decoding ({label(s)})", [st], 0.97,
                               f"median {_xs(st)}, worst single run {_x(worst)}",
                               f"× {base}; judged on the median over the open prompts"))
    # issue #6: the duration of a default run
    dur, cfg = results.get("duration_seconds"), results["config"]
    full = (not cfg.get("quick") and cfg.get("engines") is None and cfg.get("tokens") == 128 and cfg.get("repeats")
            == 1 and [len(cfg.get(k, ())) for k in ("pairs", "settings", "prompts")] == [3, 3, 5])
    if dur is not None and (cfg.get("quick") or full):
        limit = 10 if cfg.get("quick") else 60
        out.append(_target(6, f"{'`--quick`' if cfg.get('quick') else 'The full run'} finishes within {limit} "
                              "minutes on this 2-core machine", [{"median": -dur / 60}], -limit, f"{dur / 60:.1f} min",
                           "" if results.get("complete") else "run interrupted"))
    return out


def aa_noise(results) -> str:
    """How far identical work differs: γ=auto runs that never drafted against our plain run of their block."""
    rs = [run_ratio(results, r, to="plain") for r in results["runs"]
          if r["engine"] == "auto" and r.get("gamma_runs") and all(g == 0 for g, _ in r["gamma_runs"])]
    rs = [x for x in rs if x is not None]
    if len(rs) < 3:
        return ""
    return (f"Noise floor of this run: {len(rs)} γ=auto runs never drafted, i.e. did exactly the work of our plain "
            f"decoding; against our plain run of their block they measured {min(rs):.2f}× – "
            f"{statistics.median(rs):.2f}× (median) – {max(rs):.2f}×. Differences of that size between single runs "
            f"are machine noise; the medians over {results['config']['repeats'] * len(results['prompts'])} blocks "
            "per setting are steadier, and their intervals say how much: a goal whose interval includes its "
            "threshold is marked as not resolved by this run.")


def targets_lines(results) -> List[str]:
    lines = ["| issue | goal | measured [95% interval] | met |", "|---|---|---|---|"]
    for t in targets(results):
        met = {True: "met", False: "**not met**", None: "not measured"}[t["met"]]
        met += " (not resolved: the interval includes the threshold)" if t["unresolved"] else ""
        note = f" ({t['note']})" if t["note"] else ""
        lines.append(f"| #{t['issue']} | {t['goal']} | {t['measured']}{note} | {met} |")
    return lines


def render(results, plots: Dict[str, str], data: str = "results.json") -> str:
    cfg, m, v = results["config"], results.get("machine", {}), results.get("versions", {})
    L = ["## End-to-end decoding", "", "Generated by the benchmark suite (`python -m bench`); every number below "
         f"comes from the one run described here, and every individual run is in [results.json]({data})."]
    if not results.get("complete"):
        L += ["", "**This run was interrupted: the tables cover only what was measured.**"]
    peers = (f"llama.cpp peers built from the vendored llama.cpp of the llama-cpp-python "
             f"{v.get('peer_build', {}).get('llama_cpp_python', v.get('llama_cpp_python'))} sdist (their "
             f"`--version`: `{v['llama_cpp']}`), " if v.get("llama_cpp") else "")
    L += ["", "```", results["command"], "```", "",
          f"- Run: {results.get('started')} → {results.get('finished')}, "
          f"{(results.get('duration_seconds') or 0) / 60:.1f} min; load average (1/5/15 min) at start "
          f"{_la(results.get('load_average_start'))}, at end {_la(results.get('load_average_end'))}"
          + _run_loads(results) + ".",
          f"- Machine: {m.get('cpu')}, {m.get('cores')} cores, {m.get('memory_gb', '?')} GB; kernel ISA in use "
          f"`{m.get('isa')}` (supported: {', '.join(m.get('isas_supported', []))}); {cfg['threads']} threads for "
          f"every engine; {m.get('platform')}, Python {m.get('python')}.",
          f"- Versions: specdec-cpu {v.get('specdec_cpu')}"
          + (f" (git {v['specdec_cpu_git']})" if v.get("specdec_cpu_git") else "")
          + f", llama-cpp-python {v.get('llama_cpp_python')}, {peers}numpy {v.get('numpy')}"
          + (f", matplotlib {v['matplotlib']}" if v.get("matplotlib") else "") + ".",
          f"- Workload: {len(results['prompts'])} prompt(s) × {cfg['repeats']} repeat(s) per setting, at most "
          f"{cfg['tokens']} new tokens each, context {cfg['ctx']}, base seed {cfg['seed']}.",
          "", "### Method", ""] + method_lines(results)
    L += ["", "Prompts (bench/prompts.py), each sent as one user message:", "", "| prompt | kind | what |",
          "|---|---|---|"] + [f"| {n} | {p['kind']} | {p['description']} |" for n, p in results["prompts"].items()]
    L.append("")
    if plots:
        L += ["### Plots", ""]
        for key, f in plots.items():
            L += [f"![{PLOT_TITLES[key]}]({f})", f"*{PLOT_TITLES[key]}* ([{f}]({f}))", ""]
    for pair, info in results["pairs"].items():
        for s, sinfo in results["settings"].items():
            if not runs_of(results, pair, s):
                continue
            L += [f"### {info['label'].capitalize()} pair ({info['description']}), {sinfo['label']}", ""]
            L += pair_table(results, pair, s)
            sweep = sweep_table(results, pair, s)
            if sweep:
                L += ["", "Peers' settings, every one run in every block (the table above shows each peer's best, "
                          "by median tok/s):", ""] + sweep
            L += ["", calibration_line(results, pair, s) + contention_line(results, pair, s), ""]
            extra = in_run_line(results, pair, s)
            L += [extra, ""] if extra else []
            if pair == "ngram":
                L += ["By prompt kind:", ""] + ngram_kind_table(results, s) + [""]
    failed = [r for r in results["runs"] if r.get("error")]
    if failed:
        L += ["### Failed runs", ""] + [f"- block {r['block']} {r['setting']} {r['prompt']} {r['engine']}: "
                                        f"{r['error']}" for r in failed] + [""]
    L += command_lines(results)
    errs = ([f"llama.cpp peers: {results['peer_error']}"] if results.get("peer_error") else []) + list(
        results.get("peer_start_errors") or [])
    if errs:
        L += ["### Peers that did not run", ""] + [f"- {e}" for e in errs] + [""]
    L += ["## Targets", "", "Each goal of the issues' benchmark sections, as measured in this run (the issue's "
          "wording quoted; met means the number reached the goal's threshold):", ""] + targets_lines(results)
    noise = aa_noise(results)
    L += ["", noise] if noise else []
    L += ["", "Kernel timings are in the [Kernels](#kernels) section below, written by `python -m bench.kernels`.", ""]
    return "\n".join(L)


def command_lines(results) -> List[str]:
    """The command line of each peer family's first run."""
    cmds: Dict[str, tuple] = {}
    for r in results["runs"]:
        if r.get("command"):
            cmds.setdefault(family_of(results, r["engine"]), (r["engine"], r["command"]))
    if not cmds:
        return []
    L = ["### Peer command lines (first run of each; prompt abbreviated; `<cache>` is `$SPECDEC_CACHE_DIR`, else "
         "`~/.cache/specdec-cpu`; the other settings of a peer differ only in the flags the method lists; "
         "llama-server listens on a free port of 127.0.0.1, its sampling flags are only defaults: each run is one "
         "`POST /completion` that sets them, see the last line)", ""]
    L += ["- {}: `{}`".format(e, PROMPT_ARG.sub(" -p '<prompt>'", c, count=1)) for e, c in cmds.values()]
    if any(_info(results, e).get("kind") == "server" for e, _ in cmds.values()):
        L.append("- llama-server request: `POST /completion` with `{\"prompt\": <the templated prompt, raw>, "
                 "\"n_predict\": N, \"temperature\": T, \"top_k\": K, \"top_p\": P, \"min_p\": M, \"seed\": S, "
                 "\"samplers\": [\"temperature\", \"top_k\", \"top_p\", \"min_p\"], \"stream\": false, "
                 "\"return_tokens\": true, \"cache_prompt\": true}`")
    return L + [""]


def method_lines(results) -> List[str]:
    """The "Method" bullets: how this run measured what the tables show."""
    eng = results.get("engines", {})
    kinds = {e.get("kind") for e in eng.values()}
    base = baseline_id(results)
    sweep = results["config"].get("peer_draft_max")
    sweep = ", ".join(map(str, sweep)) if isinstance(sweep, list) else str(sweep)
    L = [
        "- **Baseline.** " + (
            "The denominator of every \"× plain\" figure and of every goal is llama.cpp's own plain decoding, "
            "`llama-completion`, run in every block (what a user would otherwise run). Our plain decoding (γ = 0, "
            "the same engine as our speculative runs) runs in every block as well, as a control: its row gives the "
            "ratio of the two." if base == "llama-completion" else
            "llama.cpp's plain decoding did not run, so speed-ups are against our plain decoding (γ = 0)."),
        "- **Interleaving and statistics.** For each (target, setting, prompt, repeat) every engine runs once, back "
        "to back, in an order rotated by one from block to block, so that a change of machine load hits all engines "
        "alike. tok/s is reported as min – median – max over the blocks; a speed-up is the **median over blocks of "
        "per-block ratios** (an engine's tok/s over the baseline's in the same block), and so is every comparison "
        "of two engines. Beside each is a 95% interval: a percentile bootstrap of that median, resampling the "
        f"blocks with replacement ({BOOTSTRAP_RESAMPLES} resamples, fixed seed {BOOTSTRAP_SEED}). Pairs sharing the "
        "F32 target (memory-bound and n-gram) run in the same blocks and share the baseline.",
        "- **Same input, same sampling.** Every engine gets the same text: the prompt with the model's chat template "
        "already applied (llama.cpp tools run with the raw prompt: `-no-cnv` for `llama-completion`; the "
        "speculative examples never apply a template; llama-server's `/completion` takes it raw). "
        + _prompt_token_check(results) + " The llama.cpp tools get the sampler chain `temperature;top_k;top_p;min_p` "
        "(ours: temperature → top-k → top-p → min-p), llama-server the same list in each request's `samplers`. "
        "llama-cpp-python's `Llama` applies its fixed chain (top-k → top-p → min-p → temperature), which differs "
        "from ours only where top-p truncates (T = 0.7).",
        "- **Tokens/s, not wall time.** Models stop at an end-of-generation token, so runs can be shorter than the "
        "token budget (the tokens of every run are in results.json); all rates are decode-phase tokens per second "
        "(prompt processing excluded). Ours: `GenerationStats.tokens_per_second`. `llama-completion`: generated "
        "tokens over eval + sampling time of its perf report. `llama-speculative[-simple]`: their own `decoded N "
        "tokens in X seconds` line. llama-server: the `timings` of its own answer, `predicted_per_second` = "
        "(`predicted_n` − 1) / `predicted_ms`, its clock starting when the prompt is done (not the client's wall "
        "time, which includes HTTP and the prompt). llama-cpp-python: (n − 1) tokens from the first generated "
        "token to the last.",
    ]
    servers = [e for e in eng.values() if e.get("kind") == "server"]
    ngram_srv = [e for e in servers if e.get("spec_type") and e.get("spec_type") != "draft-simple"]
    peers = [text for cond, text in (
        ("speculative" in kinds,
         "`llama-speculative` (the draft samples, the target accepts by comparing the two distributions; not exact) "
         "and `llama-speculative-simple` (greedy draft, the target samples and keeps matching tokens), each with "
         f"`--spec-draft-n-max` {sweep} (their default is 3) and `--spec-draft-n-min 0`, same threads "
         "(`-t/-tb/-td/-tbd`)"),
        (any(e.get("spec_type") == "draft-simple" for e in servers),
         "`llama-server -md DRAFT --spec-type draft-simple` (llama-server's speculative decoding with a draft model, "
         "the algorithm of `llama-speculative-simple`; in this llama.cpp revision `-md` alone enables no "
         f"speculation) with `--spec-draft-n-max` {sweep} and `--spec-draft-n-min 0`, `--parallel 1` (one client), "
         "the same context and threads; one server per setting of the sweep, started before the target's first "
         "block and kept for all its blocks, as a server runs"),
        (any(not e.get("spec_type") for e in servers),
         "`llama-server` without speculation (`--parallel 1`): llama.cpp's plain decoding as a server runs it, a "
         "second plain control beside `llama-completion` and the reference for llama-server's speculative modes"),
        (bool(ngram_srv),
         "llama-server's draftless speculative modes on the n-gram pair (`--spec-type`, no draft model, "
         "`--parallel 1`): " + "; ".join(f"`{e['spec_type']}`" + (
             f" with `{' '.join(e['server_args'])}`" if e.get("server_args") else " with its defaults")
             for e in ngram_srv)),
        ("lcp" in kinds,
         "llama-cpp-python's `Llama(draft_model=LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=N))` "
         "with its default N = 10 and N = 2 (its documentation's advice for CPU-only machines)")) if cond]
    if peers:
        L.append("- **Peers, at their best settings.** " + "; ".join(peers) + ". " + (
            "Each peer with several settings runs every one of them in every block; per (pair, setting) the tables "
            "and goals use the one with the highest median tok/s over the blocks (a choice made after the fact, "
            "which if anything favours the peer), and a table under each pair's table shows the whole sweep; "
            "results.json keeps every run." if any(e.get("family") for e in eng.values()) else ""))
    return L + [
        "- **Goals.** Each is judged on one statistic, the median of per-block ratios (against llama.cpp's plain "
        "decoding, or against a peer's best setting block by block), at every setting it names — at every setting "
        "of the run when it names none — with its interval. A goal is met when the median reaches the threshold; "
        "when the interval includes the threshold the run does not resolve it, and the table says so. measured / "
        f"predicted counts as a miss outside {THEORY_BAND[0]}–{THEORY_BAND[1]}, either way.",
        "- **Theory.** Each pair is calibrated in the same run at each setting (`specdec_cpu.planning.calibrate`, "
        "fresh measurement, γ_max = 8): T_target(k) for k = 1..9 gives v(k), T_draft(1) / T_target(1) gives c. The "
        "predicted speed-up of a run uses the mean α measured in that run: `theory.speedup(α, γ, c, v)` for fixed "
        "γ; for γ = auto and n-gram runs, whose γ varies per step (0 included), Σ E[tokens](α, γ_i) / Σ (γ_i·c + "
        "v(γ_i + 1)) over the steps. n-gram lookup is taken as free (c = 0). The theory predicts the speed-up over "
        "plain decoding at the calibrated T_target(1); measured / predicted is the median over blocks of (the run's "
        f"ratio to {'llama.cpp' if base == 'llama-completion' else 'our'} plain decoding in its block) / (its "
        "prediction). γ = auto starts from this calibration (its controllers are reset at each setting) and "
        "refines α, c and v online.",
        "- **Caches and controllers.** Before each block the block's prompt is given to every model of ours (target "
        "and draft), outside the timed runs: a draft model otherwise takes in the prompt during its first draft, "
        "which the statistics count as decode time, while the peers' decode figures exclude both models' prompt "
        "processing. Each decoder (one per drafting mode) stays loaded for the whole target; its γ=auto "
        "controllers carry what they learnt from one prompt to the next, as in a server process, and are reset "
        "only when a setting's calibration is attached.",
        "- **Python overhead**: decode time not spent in the draft model, the target model or a sampling kernel "
        "(`GenerationStats.overhead_seconds / decode_seconds`).",
    ]


def _others_cores(results, run) -> Optional[float]:
    """Other processes' cores during ``run``; None for a llama-server run of a suite whose meter counted the
    server's own CPU (before ``server_cpu_is_ours``)."""
    server = _info(results, run["engine"]).get("kind") == "server"
    return None if server and not results["config"].get("server_cpu_is_ours") else run.get("others_cores")


def _run_loads(results) -> str:
    runs, out = results["runs"], ""
    loads = [r["load_1min"] for r in runs if r.get("load_1min") is not None]
    if loads:
        out += (f"; 1-min load average at the start of each run (ours included): median "
                f"{statistics.median(loads):.2f}, max {max(loads):.2f}")
    others = [x for x in (_others_cores(results, r) for r in runs) if x is not None]
    unmetered = sum(1 for r in runs if r.get("others_cores") is not None and _others_cores(results, r) is None)
    if others:
        thr = results["config"].get("busy_cores_threshold", 0.25)
        out += (f". Other processes' CPU use during each run (all busy CPU time minus ours): median "
                f"{statistics.median(others):.2f} cores, max {max(others):.2f}; above {thr} cores in "
                f"{sum(1 for x in others if x > thr)} of {len(others)} runs (per run in results.json)")
        if unmetered:
            out += (f"; the {unmetered} llama-server runs are left out: this run's meter counted the server's own "
                    "CPU as another process's")
        if results["config"].get("wait_for_quiet"):
            out += "; before each block the suite waited (up to 60 s) while others used more than that"
    return out


def in_run_line(results, pair: str, setting: str) -> str:
    """Step costs seen in the timed runs: T(1) from our plain runs, v(γ+1) = T(γ+1)/T(1) from the fixed-γ runs,
    c = draft seconds per drafted token / T(1), and the theory's prediction from them."""
    def per_step(eid, what="target_seconds", per="steps"):
        return median(r[what] / r[per] for r in runs_of(results, pair, setting, eid)
                      if r.get(per) and r.get(what) is not None)

    t1 = per_step("plain")
    v = {int(e[5:]) + 1: tk / t1 for e in FIXED_GAMMA if t1 and (tk := per_step(e)) is not None}
    if not v:
        return ""
    ds = [d for k in v if (d := per_step(f"gamma{k - 1}", "draft_seconds", "drafted")) is not None]
    vs = ", ".join(f"v({k}) = {x:.2f}" for k, x in sorted(v.items()))
    line = f"Step costs seen in the timed runs themselves: T(1) = {1000 * t1:.1f} ms (plain runs), {vs} (fixed-γ runs)"
    if ds:
        from specdec_cpu.planning import theory

        c = statistics.median(ds) / t1
        line += f", c = {c:.3f} (draft time per drafted token, its sampling included)"
        alphas = {k: summarize(results, pair, setting, f"gamma{k - 1}")["mean_alpha"] for k in v}
        preds = [f"γ={k - 1} {float(theory.expected_tokens(alphas[k], k - 1)) / ((k - 1) * c + x):.2f}×"
                 for k, x in sorted(v.items()) if alphas[k] is not None]
        if preds:
            line += f"; with these costs and each run's α the theory predicts {', '.join(preds)}"
    return line + "."


def contention_line(results, pair: str, setting: str) -> str:
    rows = [r for r in runs_of(results, pair, setting) if _others_cores(results, r) is not None]
    if not rows:
        return ""
    thr = results["config"].get("busy_cores_threshold", 0.25)
    busy = [r for r in rows if _others_cores(results, r) > thr]
    return (f" Runs disturbed by other processes (> {thr} cores): {len(busy)} of {len(rows)}, "
            f"in {len({r['block'] for r in busy})} of {len({r['block'] for r in rows})} blocks.")


def _la(la) -> str:
    return "?" if not la else " / ".join(f"{x:.2f}" for x in la)


def _prompt_token_check(results) -> str:
    ours = {(r["target"], r["prompt"]): r["prompt_tokens"] for r in results["runs"]
            if r["engine"] == "plain" and r.get("prompt_tokens")}
    checked = [r for r in results["runs"] if r["engine"] != "plain" and r.get("prompt_tokens")
               and (r["target"], r["prompt"]) in ours]
    if not checked:
        return ""
    bad = [f"{r['engine']} on {r['prompt']}: {r['prompt_tokens']} vs {ours[(r['target'], r['prompt'])]}"
           for r in checked if r["prompt_tokens"] != ours[(r["target"], r["prompt"])]]
    if bad:
        return "Prompt token counts differ from ours in: " + "; ".join(sorted(set(bad))[:6]) + "."
    return f"The prompt token counts every engine reports agree with ours in all {len(checked)} runs that report one."


def write_results_md(results, path: Path, plots: Dict[str, str], data: str = "results.json") -> None:
    """Write our sections first, keeping every other "## " section of the file (a Kernels placeholder if none)."""
    kept: List[List[str]] = []
    keep = False
    for line in (path.read_text() if path.exists() else "").splitlines():
        if line.startswith("## "):
            keep = line.strip() not in OWN_HEADINGS
            kept += [[]] if keep else []
        if keep:
            kept[-1].append(line)
    sections = ["\n".join(s).rstrip() for s in kept]
    if not any(s.startswith("## Kernels") for s in sections):
        sections.append("## Kernels\n\n_Not measured yet: run `python -m bench.kernels` (it writes this section)._")
    path.write_text("# Benchmark results\n\n" + render(results, plots, data) + "\n" + "\n\n".join(sections) + "\n")


def headline(results) -> str:
    """A few lines for the terminal: the comparisons people ask for first."""
    out = ["", f"headline (median tok/s, × {baseline_label(results)}, median of per-block ratios [95% interval]):"]
    spec = ["llama-completion", "plain", "gamma4", "auto", "llama-speculative", "llama-speculative-simple",
            "llama-server-draft"]
    ngram = ["llama-completion", "plain", "ngram", "pld"]
    if "ngram" in results["pairs"]:
        ngram += list(dict.fromkeys(family_of(results, e) for e in engines_of(results, "ngram")
                                    if e.startswith("llama-server-") and family_of(results, e) not in ngram))
    for pair, name, eids, kinds in (("memory", None, spec, None), ("compute", None, spec, None),
                                    ("ngram", "n-gram grounded", ngram, ["grounded"])):
        for s in results["settings"] if pair in results["pairs"] else ():
            cells = []
            for e in eids:
                e = best_variant(results, pair, s, e, kinds) or e  # a family by its fastest variant
                sm = summarize(results, pair, s, e, kinds)
                if sm["tps_median"] is not None:
                    cells.append(f"{e} {sm['tps_median']:.1f} ({_xs(sm['ratio'])})")
            if cells:
                out.append(f"  {name or results['pairs'][pair]['label']} {s}: " + ", ".join(cells))
    for t in targets(results):
        state = "MET" if t["met"] else "not met" if t["met"] is False else "n/a"
        out.append(f"  #{t['issue']} {state}{' (unresolved)' if t['unresolved'] else ''}: {t['goal']} — "
                   f"{t['measured']}")
    return "\n".join(out)


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
        if fig is not None:
            fig.tight_layout()
            fig.savefig(out_dir / PLOT_FILES[key], dpi=110, bbox_inches="tight")
            plt.close(fig)
            made[key] = PLOT_FILES[key]
    return made


def _colour(eid: str) -> str:
    for test, col in ((eid == "plain", "#7f7f7f"), (eid == "auto", "#08306b"), (eid.startswith("gamma"), "#1f77b4"),
                      (eid.startswith("ngram"), "#2ca02c"), (eid == "llama-completion", "#000000"),
                      (eid.startswith("llama-server"), "#9467bd"), (eid.startswith("llama-"), "#d62728")):
        if test:
            return col
    return "#ff7f0e"


_SHORT = {"plain": "ours plain", "auto": "ours auto", "ngram": "ours n-gram", "ngram-draft": "ours n-gram+draft",
          "llama-completion": "llama-completion (plain)", "llama-speculative": "llama-speculative",
          "llama-speculative-simple": "llama-spec-simple", "pld2": "lcp PromptLookup 2",
          "pld10": "lcp PromptLookup 10", "lcp-plain": "lcp plain", "llama-server-plain": "llama-server plain",
          **{g: f"ours γ={g[5:]}" for g in FIXED_GAMMA}}


def _short(results, eid: str) -> str:
    if eid in _SHORT:
        return _SHORT[eid]
    n = results.get("engines", {}).get(eid, {}).get("draft_max")
    short = eid.replace("llama-speculative-simple", "llama-spec-simple")
    return short.rsplit("-n", 1)[0] + f" (n-max {n})" if n else short


def _plot_tps(results, plt):
    pairs = [p for p in results["pairs"] if any(p in r.get("pairs", ()) for r in results["runs"])]
    settings = list(results["settings"])
    if not pairs or not settings:
        return None
    n_eng = max(len(shown_engines(results, p, s)) for p in pairs for s in settings)
    fig, axes = plt.subplots(len(pairs), len(settings), squeeze=False,
                             figsize=(4.2 * len(settings), 0.42 * n_eng * len(pairs) + 1.2 * len(pairs)))
    for i, p in enumerate(pairs):
        for j, s in enumerate(settings):
            ax = axes[i][j]
            sms = [(e, summarize(results, p, s, e)) for e in shown_engines(results, p, s)]
            sms = [(e, sm) for e, sm in sms if sm["tps_median"] is not None]
            y = list(range(len(sms)))[::-1]
            ax.barh(y, [sm["tps_median"] for _, sm in sms], capsize=2, color=[_colour(e) for e, _ in sms],
                    xerr=[[sm["tps_median"] - sm["tps_min"] for _, sm in sms],
                          [sm["tps_max"] - sm["tps_median"] for _, sm in sms]])
            ax.set_yticks(y, [_short(results, e) for e, _ in sms], fontsize=8)
            ax.set_title(f"{results['pairs'][p]['label']} · {results['settings'][s]['label']}", fontsize=9)
            ax.set_xlabel("tokens/s", fontsize=8)
            ax.tick_params(axis="x", labelsize=8)
            ax.grid(axis="x", alpha=0.3)
    return fig


def _plot_theory(results, plt):
    pts = [(p, s, e, sm["predicted"], sm["ratio"]["median"])
           for p in results["pairs"] for s in results["settings"] for e in engines_of(results, p) if e != "plain"
           for sm in [summarize(results, p, s, e)]
           if sm["predicted"] is not None and sm["ratio"]["median"] is not None]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(6.2, 5.4))
    markers = {"t0": "o", "t0.7": "s", "t1": "^"}
    pair_col = {"memory": "#1f77b4", "compute": "#d62728", "ngram": "#2ca02c"}
    for p, s, e, pred, meas in pts:
        ax.scatter(pred, meas, marker=markers.get(s, "o"), color=pair_col.get(p, "k"), s=36)
        ax.annotate(_short(results, e).replace("ours ", ""), (pred, meas), fontsize=6, xytext=(3, 2),
                    textcoords="offset points")
    lo, hi = min(min(x[3], x[4]) for x in pts) * 0.9, max(max(x[3], x[4]) for x in pts) * 1.08
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="measured = predicted")
    ax.plot([lo, hi], [0.9 * lo, 0.9 * hi], "k--", lw=0.8, label="0.9 × predicted")
    ax.axhline(1.0, color="#999999", lw=0.6)
    for p in [p for p in pair_col if p in results["pairs"]]:
        ax.scatter([], [], color=pair_col[p], label=f"{results['pairs'][p]['label']} pair")
    for s in [s for s in markers if s in results["settings"]]:
        ax.scatter([], [], marker=markers[s], color="#555555", label=results["settings"][s]["label"])
    ax.set(xlabel="predicted speed-up (theory, α from the run, c and v(k) calibrated in the run)",
           ylabel=f"measured speed-up over {baseline_label(results)} (median of per-block ratios)")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    return fig


def _plot_verify(results, plt):
    cals = results.get("calibrations", [])
    if not cals:
        return None
    fig, ax = plt.subplots(figsize=(6.2, 4.4))
    styles = {"t0": "-", "t0.7": "--", "t1": ":"}
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    colours: Dict[str, str] = {}
    for c in cals:
        col = colours.setdefault(c["target"], palette[len(colours) % len(palette)])
        how = {"draft": "with its draft model", "ngram": "n-gram decoder"}.get(c["role"], c["role"])
        label = (f"{c['target'].replace('qwen2.5-coder-0.5b-', '').upper()} target ({how}), "
                 f"{results['settings'].get(c['setting'], {}).get('label', c['setting'])}")
        ax.plot(range(1, len(c["v"]) + 1), c["v"], styles.get(c["setting"], "-"), color=col,
                marker="." if c["role"] == "draft" else "x", label=label)
    ax.plot([1, max(len(c["v"]) for c in cals)], [1, 1], color="#999999", lw=0.6)
    ax.set(xlabel="rows in one target pass, k = γ + 1", ylabel="v(k) = T_target(k) / T_target(1)")
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3)
    return fig
