"""Turn bench/results.json into RESULTS.md tables, the targets check and plots."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence

#: Headings this module writes; any other "## " section of RESULTS.md (the
#: "## Kernels" section of bench/kernels.py) is kept as it is.
OWN_HEADINGS = ("## End-to-end decoding", "## Targets")

PLOT_FILES = {
    "tps": "plot_tokens_per_second.png",
    "theory": "plot_measured_vs_predicted.png",
    "verify": "plot_verify_cost.png",
}

SPEC_OURS = ("gamma2", "gamma4", "gamma6", "gamma8", "auto")


# ---------------------------------------------------------------------------
# aggregation
# ---------------------------------------------------------------------------


def _med(xs: Iterable[Optional[float]]) -> Optional[float]:
    v = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(v) if v else None


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


def summarize(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """min/median/max tok/s and medians of the per-run figures of one engine."""
    ok = [r for r in rows if r.get("tps")]
    tps = [r["tps"] for r in ok]
    mp = [r["ratio"] / r["predicted"] for r in ok
          if r.get("ratio") is not None and r.get("predicted")]
    return {
        "runs": len(rows),
        "failed": len(rows) - len(ok),
        "tps_min": min(tps) if tps else None,
        "tps_median": _med(tps),
        "tps_max": max(tps) if tps else None,
        "ratio": _med(r.get("ratio") for r in ok),
        "acceptance": _med(r.get("acceptance") for r in ok),
        "mean_alpha": _med(r.get("mean_alpha") for r in ok),
        "tokens_per_step": _med(r.get("tokens_per_step") for r in ok),
        "mean_gamma": _med(r.get("mean_gamma") for r in ok) if any("mean_gamma" in r for r in ok) else None,
        "predicted": _med(r.get("predicted") for r in ok),
        "measured_over_predicted": _med(mp),
        "overhead_fraction": _med(r.get("overhead_fraction") for r in ok),
        "tokens_median": _med(r.get("tokens") for r in ok),
        "tokens_min": min((r["tokens"] for r in ok if r.get("tokens") is not None), default=None),
    }


def block_ratios(results, pair: str, setting: str, a: str, b: Sequence[str],
                 kinds: Optional[Sequence[str]] = None) -> List[float]:
    """Per-block tok/s of engine ``a`` over the fastest of engines ``b`` in that block."""
    by_block: Dict[int, Dict[str, float]] = defaultdict(dict)
    for r in runs_of(results, pair, setting, kinds=kinds):
        if r.get("tps"):
            by_block[r["block"]][r["engine"]] = r["tps"]
    out = []
    for runs in by_block.values():
        others = [runs[e] for e in b if e in runs]
        if a in runs and others:
            out.append(runs[a] / max(others))
    return out


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


def _pct(x: Optional[float]) -> str:
    return _f(None if x is None else 100 * x, "{:.1f}%")


def _tps(s: Dict[str, Any]) -> str:
    if s["tps_median"] is None:
        return "failed"
    return f"{s['tps_min']:.1f} – **{s['tps_median']:.1f}** – {s['tps_max']:.1f}"


def engine_label(results, eid: str) -> str:
    label = results.get("engines", {}).get(eid, {}).get("label", eid)
    if eid.startswith("llama-speculative"):
        label += f" (draft-n-max {results['config'].get('peer_draft_max')})"
    return label


def pair_table(results, pair: str, setting: str) -> List[str]:
    lines = [
        "| engine | tok/s min – **median** – max | × plain (median of per-block ratios) "
        "| acceptance | mean α | tokens/step | mean γ | predicted × | measured / predicted | Python overhead "
        "| tokens/run (median) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for eid in engines_of(results, pair):
        rows = runs_of(results, pair, setting, eid)
        if not rows:
            continue
        s = summarize(rows)
        ours = results["engines"].get(eid, {}).get("kind") == "ours"
        lines.append(
            f"| {engine_label(results, eid)} | {_tps(s)} | {_x(s['ratio'])} | {_f(s['acceptance'])} | "
            f"{_f(s['mean_alpha'], '{:.3f}')} | {_f(s['tokens_per_step']) if ours else '–'} | "
            f"{_f(s['mean_gamma'], '{:.1f}') if ours and eid != 'plain' else '–'} | "
            f"{_x(s['predicted'])} | {_f(s['measured_over_predicted'])} | "
            f"{_pct(s['overhead_fraction']) if ours else '–'} | {_f(s['tokens_median'], '{:.0f}')} |")
    return lines


def ngram_kind_table(results, setting: str) -> List[str]:
    kinds = [k for k in ("grounded", "open", "summary")
             if any(p["kind"] == k for p in results["prompts"].values())]
    names = {k: ", ".join(n for n, p in results["prompts"].items() if p["kind"] == k) for k in kinds}
    head = "| engine | " + " | ".join(f"{k} ({names[k]}): tok/s, × plain" for k in kinds) + " |"
    lines = [head, "|---|" + "---|" * len(kinds)]
    for eid in engines_of(results, "ngram"):
        cells = []
        for k in kinds:
            s = summarize(runs_of(results, "ngram", setting, eid, kinds=[k]))
            cells.append("–" if s["tps_median"] is None else f"{s['tps_median']:.1f}, {_x(s['ratio'])}")
        lines.append(f"| {engine_label(results, eid)} | " + " | ".join(cells) + " |")
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


def _target(issue: int, goal: str, value: Optional[float], threshold: float, shown: str,
            note: str = "") -> Dict[str, Any]:
    met = None if value is None else bool(value >= threshold)
    return {"issue": issue, "goal": goal, "value": value, "threshold": threshold,
            "measured": shown, "met": met, "note": note}


def targets(results) -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = []
    pairs = results.get("pairs", {})
    settings = results.get("settings", {})
    have = lambda p, s: p in pairs and s in settings  # noqa: E731

    def ratio(pair, setting, eid, kinds=None):
        return summarize(runs_of(results, pair, setting, eid, kinds))["ratio"]

    if have("memory", "t1"):
        auto = ratio("memory", "t1", "auto")
        fixed = {e: ratio("memory", "t1", e) for e in ("gamma2", "gamma4", "gamma6", "gamma8")}
        fixed = {e: v for e, v in fixed.items() if v is not None}
        best = max(fixed.items(), key=lambda kv: kv[1]) if fixed else None
        extra = f"; best fixed γ: {best[0][5:]} at {best[1]:.2f}×" if best else ""
        out.append(_target(3, "T = 1, top_k 0, top_p 1: ≥ 1.5× plain decoding", auto, 1.5,
                           f"γ=auto {_x(auto)}{extra}", "memory-bound pair, median of per-block ratios"))
        for peer, thr, goal in (("llama-speculative-simple", 1.1, "T = 1: ≥ 1.1× `llama-speculative-simple`"),
                                ("llama-speculative", 1.0,
                                 "T = 1: at least on par with `llama-speculative` (which is not exact)")):
            r = _med(block_ratios(results, "memory", "t1", "auto", [peer]))
            out.append(_target(3, goal, r, thr, f"γ=auto / {peer}: {_x(r)}",
                               "median of per-block ratios; 'on par' read as ≥ 1.00×" if thr == 1.0
                               else "median of per-block ratios"))
    if have("memory", "t0"):
        r = _med(block_ratios(results, "memory", "t0", "auto", ["llama-speculative-simple"]))
        out.append(_target(3, "T = 0: at least as fast as `llama-speculative-simple`", r, 1.0,
                           f"γ=auto / llama-speculative-simple: {_x(r)}", "median of per-block ratios"))
    if have("memory", "t1"):
        mp = {e: summarize(runs_of(results, "memory", "t1", e))["measured_over_predicted"] for e in SPEC_OURS}
        mp = {e: v for e, v in mp.items() if v is not None}
        worst = min(mp.values()) if mp else None
        out.append(_target(3, "Measured speed-up ≥ 0.9 of the theory's prediction from the α, c and v(k) "
                              "measured in the same run", worst, 0.9,
                           ", ".join(f"{e.replace('gamma', 'γ=')} {v:.2f}" for e, v in mp.items()),
                           "memory-bound pair, T = 1, median per engine; met if every engine's is ≥ 0.9"))
    if "memory" in pairs:
        ov = {}
        for s in settings:
            for e in SPEC_OURS + ("plain",):
                v = summarize(runs_of(results, "memory", s, e))["overhead_fraction"]
                if v is not None:
                    ov[(s, e)] = v
        worst = max(ov.items(), key=lambda kv: kv[1]) if ov else None
        out.append(_target(3, "Python orchestration overhead ≤ 5% of step time",
                           None if worst is None else -worst[1], -0.05,
                           "–" if worst is None else
                           f"worst median {_pct(worst[1])} ({worst[0][1]}, {settings[worst[0][0]]['label']}); "
                           f"median over all {_pct(_med(ov.values()))}",
                           "decode time outside draft, target and sampling kernels, memory-bound pair"))
    if have("compute", "t1"):
        r = ratio("compute", "t1", "auto")
        out.append(_target(4, "Compute-bound pair (Qwen Q4_K_M target, Q4_0 draft): `gamma=\"auto\"` ≥ 0.97× "
                              "plain decoding", r, 0.97, f"γ=auto {_x(r)}; llama-speculative "
                           f"{_x(ratio('compute', 't1', 'llama-speculative'))}", "T = 1"))
    if have("memory", "t1"):
        auto = ratio("memory", "t1", "auto")
        fixed = {e: ratio("memory", "t1", e) for e in ("gamma2", "gamma4", "gamma6", "gamma8")}
        fixed = {e: v for e, v in fixed.items() if v is not None}
        if fixed and auto is not None:
            be, bv = max(fixed.items(), key=lambda kv: kv[1])
            out.append(_target(4, "Memory-bound pair (F32 target, Q4_0 draft): `gamma=\"auto\"` within 3% of "
                                  "the best fixed γ in {2, 4, 6, 8}, or better", auto / bv, 0.97,
                               f"γ=auto {auto:.2f}× vs best fixed γ={be[5:]} {bv:.2f}× → {auto / bv:.3f}",
                               "T = 1, medians of per-block ratios to plain"))
    for pair in ("memory", "compute"):
        if have(pair, "t1"):
            r = summarize(runs_of(results, pair, "t1", "auto"))["measured_over_predicted"]
            out.append(_target(4, f"For each pair, the measured speed-up against the theory's prediction: "
                                  f"aim for ≥ 0.9 ({pairs[pair]['label']})", r, 0.9,
                               f"γ=auto measured/predicted {_f(r)}", "T = 1"))
    if "ngram" in pairs:
        for s, info in settings.items():
            g = ratio("ngram", s, "ngram", ["grounded"])
            out.append(_target(7, "Code-editing and document-grounded prompts, F32 target: ≥ 1.5× plain "
                                  f"decoding ({info['label']})", g, 1.5, f"n-gram {_x(g)}"))
        for s, info in settings.items():
            blocks = block_ratios(results, "ngram", s, "ngram", ["pld2", "pld10"], ["grounded"])
            r = _med(blocks)
            out.append(_target(7, "… and ≥ 1.2× llama-cpp-python's `LlamaPromptLookupDecoding` on the same "
                                  f"target and prompts ({info['label']})", r, 1.2,
                               f"n-gram / faster PromptLookup config in the block: {_x(r)} "
                               f"(blocks: {', '.join(f'{b:.2f}' for b in blocks)})"))
        for s, info in settings.items():
            rows = runs_of(results, "ngram", s, "ngram", ["open"])
            o = summarize(rows)["ratio"]
            worst = min((r["ratio"] for r in rows if r.get("ratio") is not None), default=None)
            out.append(_target(7, f"Open-ended prompts: never below 0.97× plain decoding ({info['label']})",
                               o, 0.97, f"median {_x(o)}, worst single run {_x(worst)}",
                               "judged on the median over the open prompts"))
    dur = results.get("duration_seconds")
    cfg = results["config"]
    default_full = (not cfg.get("quick") and cfg.get("engines") is None and cfg.get("tokens") == 128
                    and cfg.get("repeats") == 1 and len(cfg.get("pairs", ())) == 3
                    and len(cfg.get("settings", ())) == 3 and len(cfg.get("prompts", ())) == 5)
    if dur is not None and (cfg.get("quick") or default_full):
        quick = cfg.get("quick")
        limit = 10 if quick else 60
        out.append(_target(6, f"{'`--quick`' if quick else 'The full run'} finishes within {limit} minutes "
                              "on this 2-core machine", -dur / 60, -limit, f"{dur / 60:.1f} min",
                           "" if results.get("complete") else "run interrupted"))
    return out


def aa_noise(results) -> str:
    """How far two runs doing identical work can differ here: γ=auto runs that
    never drafted (plain decoding through the same engine) against the plain
    run of their block."""
    ratios = [r["ratio"] for r in results["runs"]
              if r["engine"] == "auto" and r.get("ratio") and r.get("gamma_runs")
              and all(g == 0 for g, _ in r["gamma_runs"])]
    if len(ratios) < 3:
        return ""
    return (f"Noise floor of this run: {len(ratios)} γ=auto runs never drafted, i.e. did exactly the work "
            f"of plain decoding; against the plain run of their block they measured "
            f"{min(ratios):.2f}× – {statistics.median(ratios):.2f}× (median) – {max(ratios):.2f}×. "
            f"Differences of that size between single runs are machine noise; the medians over "
            f"{results['config']['repeats'] * len(results['prompts'])} blocks per setting are steadier, "
            f"but a goal missed or met by a few percent is within it.")


def targets_lines(results) -> List[str]:
    lines = ["| issue | goal | measured | met |", "|---|---|---|---|"]
    for t in targets(results):
        met = {True: "met", False: "**not met**", None: "not measured"}[t["met"]]
        note = f" ({t['note']})" if t["note"] else ""
        lines.append(f"| #{t['issue']} | {t['goal']} | {t['measured']}{note} | {met} |")
    return lines


# ---------------------------------------------------------------------------
# RESULTS.md
# ---------------------------------------------------------------------------


def render(results, plots: Dict[str, str]) -> str:
    cfg = results["config"]
    m = results.get("machine", {})
    v = results.get("versions", {})
    L: List[str] = ["## End-to-end decoding", ""]
    L.append("Generated by the benchmark suite (`bench/run.py`); every number below comes from the one run "
             "described here, and every individual run is in [results.json](results.json).")
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
        "- **Interleaving.** For each (target, setting, prompt, repeat) every engine runs once, back to back, "
        "in an order rotated by one from block to block, so that a change of machine load hits all engines "
        "alike. tok/s is reported as min – median – max over the blocks; speed-ups are the **median of "
        "per-block ratios** against our plain decoding (γ = 0) in the same block. Pairs sharing the F32 "
        "target (memory-bound and n-gram) run in the same blocks and share the plain baseline.",
        "- **Same input, same sampling.** Every engine gets the same text: the prompt with the model's chat "
        "template already applied (llama.cpp tools run with the raw prompt: `-no-cnv` for "
        "`llama-completion`; the speculative examples never apply a template). "
        + _prompt_token_check(results) +
        " The llama.cpp tools get the sampler chain `temperature;top_k;top_p;min_p` (ours: temperature → "
        "top-k → top-p → min-p). llama-cpp-python's `Llama` applies its fixed chain (top-k → top-p → "
        "min-p → temperature), which differs from ours only where top-p truncates (T = 0.7).",
        "- **Tokens/s, not wall time.** Models stop at an end-of-generation token, so runs can be shorter "
        "than the token budget (the tokens of every run are in results.json); all rates are "
        "decode-phase tokens per second (prompt processing excluded). Ours: "
        "`GenerationStats.tokens_per_second`. `llama-completion`: generated tokens over eval + sampling "
        "time of its perf report. `llama-speculative[-simple]`: their own `decoded N tokens in X seconds` "
        "line. llama-cpp-python: (n − 1) tokens from the first generated token to the last.",
        f"- **Peers.** `llama-speculative` (the draft samples, the target accepts by comparing the two "
        f"distributions; not exact) and `llama-speculative-simple` (greedy draft, the target samples and "
        f"keeps matching tokens) with `--spec-draft-n-max {cfg['peer_draft_max']}` (their default is 3) "
        f"and `--spec-draft-n-min 0`, same threads (`-t/-tb/-td/-tbd`). llama-cpp-python's "
        "`Llama(draft_model=LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=N))` with its "
        "default N = 10 and N = 2 (its documentation's advice for CPU-only machines).",
        "- **Theory.** Each pair is calibrated in the same run at each setting "
        "(`specdec_cpu.planning.calibrate`, fresh measurement, γ_max = 8): T_target(k) for k = 1..9 gives "
        "v(k), T_draft(1) / T_target(1) gives c. The predicted speed-up of a run uses the mean α measured in "
        "that run: `theory.speedup(α, γ, c, v)` for fixed γ; for γ = auto and n-gram runs, whose γ varies "
        "per step (0 included), Σ E[tokens](α, γ_i) / Σ (γ_i·c + v(γ_i + 1)) over the steps. n-gram "
        "lookup is taken as free (c = 0). measured / predicted is the median over blocks of (measured "
        "ratio to plain) / (predicted). γ = auto starts from this calibration (its controllers are reset "
        "at each setting) and refines α, c and v online.",
        "- **Caches and controllers.** Before each block the block's prompt is given to every model of ours "
        "(target and draft), outside the timed runs: a draft model otherwise takes in the prompt during its "
        "first draft, which the statistics count as decode time, while the peers' decode figures exclude "
        "both models' prompt processing. Each decoder (one per drafting mode) stays loaded for the whole "
        "target; its γ=auto controllers carry what they learnt from one prompt to the next, as in a server "
        "process, and are reset only when a setting's calibration is attached.",
        "- **Python overhead**: decode time not spent in the draft model, the target model or a sampling "
        "kernel (`GenerationStats.overhead_seconds / decode_seconds`).",
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
    cmds = {}
    for r in results["runs"]:
        if r.get("command") and r["engine"] not in cmds:
            cmds[r["engine"]] = r["command"]
    if cmds:
        L += ["### Peer command lines (first run of each; prompt abbreviated; `<cache>` is "
              "`$SPECDEC_CACHE_DIR`, else `~/.cache/specdec-cpu`)", ""]
        for e, c in cmds.items():
            L += [f"- {e}: `{_abbrev_prompt(c)}`"]
        L.append("")
    L += ["## Targets", "",
          "Each goal of the issues' benchmark sections, as measured in this run "
          "(the issue's wording quoted; met means the number reached the goal's threshold):", ""]
    L += targets_lines(results)
    noise = aa_noise(results)
    if noise:
        L += ["", noise]
    L += ["", "Kernel timings are in the [Kernels](#kernels) section below, written by "
              "`python bench/kernels.py`.", ""]
    return "\n".join(L)


def _run_loads(results) -> str:
    out = ""
    loads = [r["load_1min"] for r in results["runs"] if r.get("load_1min") is not None]
    if loads:
        out += (f"; 1-min load average at the start of each run (ours included): median "
                f"{statistics.median(loads):.2f}, max {max(loads):.2f}")
    others = [r["others_cores"] for r in results["runs"] if r.get("others_cores") is not None]
    if others:
        thr = results["config"].get("busy_cores_threshold", 0.25)
        busy = sum(1 for x in others if x > thr)
        out += (f". Other processes' CPU use during each run (all busy CPU time minus ours): median "
                f"{statistics.median(others):.2f} cores, max {max(others):.2f}; above {thr} cores in "
                f"{busy} of {len(others)} runs (per run in results.json)")
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
        return _med(vals)

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
            alpha = summarize(runs_of(results, pair, setting, f"gamma{k - 1}"))["mean_alpha"]
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
    rows = [r for r in runs_of(results, pair, setting) if r.get("others_cores") is not None]
    if not rows:
        return ""
    thr = results["config"].get("busy_cores_threshold", 0.25)
    busy = [r for r in rows if r["others_cores"] > thr]
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


def write_results_md(results, path: Path, plots: Dict[str, str]) -> None:
    """Write our sections, keeping every other "## " section of the file (Kernels)."""
    kept = other_sections(path.read_text() if path.exists() else "")
    if not any(s.startswith("## Kernels") for s in kept):
        kept.append("## Kernels\n\n_Not measured yet: run `python bench/kernels.py` "
                    "(it writes this section)._")
    body = "# Benchmark results\n\n" + render(results, plots) + "\n" + "\n\n".join(kept) + "\n"
    path.write_text(body)


def headline(results) -> str:
    """A few lines for the terminal: the comparisons people ask for first."""
    out = ["", "headline (median tok/s, × plain):"]

    def row(pair, s, eids, kinds=None):
        cells = []
        for e in eids:
            sm = summarize(runs_of(results, pair, s, e, kinds))
            if sm["tps_median"] is not None:
                cells.append(f"{e} {sm['tps_median']:.1f} ({_x(sm['ratio'])})")
        return ", ".join(cells)

    if "memory" in results["pairs"] and "t1" in results["settings"]:
        out.append("  memory-bound T=1: " + row("memory", "t1", ["plain", "gamma4", "auto", "llama-speculative",
                                                                  "llama-speculative-simple"]))
    if "compute" in results["pairs"] and "t1" in results["settings"]:
        out.append("  compute-bound T=1: " + row("compute", "t1", ["plain", "auto", "llama-speculative"]))
    if "ngram" in results["pairs"]:
        for s in results["settings"]:
            cells = row("ngram", s, ["plain", "ngram", "pld2", "pld10"], ["grounded"])
            if cells:
                out.append(f"  n-gram grounded {s}: " + cells)
    for t in targets(results):
        out.append(f"  #{t['issue']} {'MET' if t['met'] else 'not met' if t['met'] is False else 'n/a'}: "
                   f"{t['goal']} — {t['measured']}")
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
    if eid.startswith("llama-"):
        return "#d62728"
    return "#ff7f0e"


def _plot_tps(results, plt):
    pairs = [p for p in results["pairs"] if any(pp == p for r in results["runs"] for pp in r.get("pairs", ()))]
    settings = list(results["settings"])
    if not pairs or not settings:
        return None
    n_eng = max(len(engines_of(results, p)) for p in pairs)
    fig, axes = plt.subplots(len(pairs), len(settings), squeeze=False,
                             figsize=(4.2 * len(settings), 0.42 * n_eng * len(pairs) + 1.2 * len(pairs)))
    for i, p in enumerate(pairs):
        eids = engines_of(results, p)
        for j, s in enumerate(settings):
            ax = axes[i][j]
            med, lo, hi, labels, cols = [], [], [], [], []
            for e in eids:
                sm = summarize(runs_of(results, p, s, e))
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
    return {"plain": "ours plain", "gamma2": "ours γ=2", "gamma4": "ours γ=4", "gamma6": "ours γ=6",
            "gamma8": "ours γ=8", "auto": "ours auto", "ngram": "ours n-gram",
            "ngram-draft": "ours n-gram+draft", "llama-completion": "llama-completion",
            "llama-speculative": "llama-speculative", "llama-speculative-simple": "llama-spec-simple",
            "pld2": "lcp PromptLookup 2", "pld10": "lcp PromptLookup 10",
            "lcp-plain": "lcp plain"}.get(eid, eid)


def _plot_theory(results, plt):
    pts = []
    for p in results["pairs"]:
        for s in results["settings"]:
            for e in engines_of(results, p):
                sm = summarize(runs_of(results, p, s, e))
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
    ax.set_ylabel("measured speed-up over plain (median of per-block ratios)")
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
