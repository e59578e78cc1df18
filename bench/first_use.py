"""First use: γ=auto with no stored calibration, against the γ a user could have fixed instead.

    python -m bench.first_use                                # both pairs, 5 blocks, 128 tokens, T = 1
    python -m bench.first_use --pairs memory --blocks 3
    python -m bench.first_use --baseline-python PATH         # the previous main too: before / after
    python -m bench.first_use --quick                        # one block, 32 tokens: does it run?
    python -m bench.first_use --report-only bench/results/first_use/first_use_results.json

Per block (one prompt of bench/prompts.py, rotating, and one seed) and pair
(memory-bound: F32 target / Q4_0 draft; compute-bound: Q4_K_M / Q4_0), each
engine runs in a fresh process (bench/ab_worker.py, no warm-up) with an EMPTY
calibration directory of its own, in an order rotated from block to block:

- ``load``: the two files loaded with ``calibration="cached"`` and no generation: the pure load time;
- ``fresh``: γ=auto with the default ``calibration="auto"``: whatever first use costs;
- ``gamma2``, ``gamma4``, ``gamma6``: a fixed γ (``calibration="cached"``: they measure nothing);
- ``plain``: γ=0 without a draft.

``fresh`` counts its first-use cost at load (its load time minus the median
load of ``load`` and the fixed γ in the same block) plus its first
generation; the others their first generation.  Reported per pair: fresh /
best fixed γ and fresh / plain, medians of per-block ratios [bootstrap 95%
interval]; with ``--baseline-python`` every engine also runs under the
previous main, and fresh / fresh (previous main) is added.  Writes
bench/results/first_use/first_use_results.json and the "## First use" section
of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .ab import PAIRS, request_of, worker
from .common import (
    baseline_versions,
    fmt,
    machine_info,
    median,
    pair_tokenizer,
    publish,
    ratio_text,
    redact_baseline,
    results_dir,
    rotated,
    versions,
)
from .prompts import PROMPTS
from .suite import SETTINGS

SECTION = "## First use"
ENGINES = ("load", "fresh", "gamma2", "gamma4", "gamma6", "plain")
FIXED = ("gamma2", "gamma4", "gamma6")
SIDES = {"new": "this checkout", "baseline": "previous main"}


def run_one(python: str, engine: str, target: Path, draft: Path, request: Dict[str, Any],
            args: argparse.Namespace) -> Dict[str, Any]:
    """One engine in a fresh process with an empty calibration directory of its own."""
    gamma, calibration, tokens = {"load": ("auto", "cached", 0), "fresh": ("auto", "auto", args.tokens),
                                  "plain": (0, "cached", args.tokens)}.get(engine, (engine[5:], "cached", args.tokens))
    cal = tempfile.mkdtemp(prefix="first-use-")
    try:
        return worker(python, target, None if engine == "plain" else draft, gamma, request, tokens=tokens,
                      threads=args.threads, extra=["--no-warmup", "--calibration", calibration],
                      env=dict(os.environ, SPECDEC_CALIBRATION_DIR=cal))
    finally:
        shutil.rmtree(cal, ignore_errors=True)


def run(args: argparse.Namespace) -> Dict[str, Any]:
    from specdec_cpu.demo_models import ensure_model

    sides = {"new": args.new_python, **({"baseline": args.baseline_python} if args.baseline_python else {})}
    setting = SETTINGS[args.setting]
    results: Dict[str, Any] = {
        "command": args.command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine_info(args.threads), "versions": versions(None), "pairs": args.pairs,
        "setting": args.setting, "tokens": args.tokens, "threads": args.threads, "runs": []}
    if args.baseline_python:
        results["baseline_versions"] = baseline_versions(args.baseline_python)
    files = {p: (ensure_model(PAIRS[p][1]), ensure_model(PAIRS[p][2])) for p in args.pairs}
    for p, (target, draft) in files.items():  # untimed: the files into the page cache
        run_one(args.new_python, "load", target, draft, {}, args)
    order = [(side, e) for side in sides for e in ENGINES]
    for block in range(args.blocks):
        prompt = PROMPTS[block % len(PROMPTS)]
        request = request_of(pair_tokenizer().chat_prompt(prompt.messages()), setting, args.seed + block)
        for p, (target, draft) in files.items():
            for pos, (side, engine) in enumerate(rotated(order, block)):
                try:
                    rec = run_one(sides[side], engine, target, draft, request, args)
                except Exception as exc:  # recorded: a failed run is a result too
                    rec = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
                rec.update(block=block, pair=p, side=side, engine=engine, prompt=prompt.name,
                           seed=request["seed"], position=pos)
                results["runs"].append(rec)
                print(f"block {block} {p:7s} {side:8s} {engine:6s} load {rec.get('load_s', 0):5.2f} s  "
                      + (f"ERROR {rec['error']}" if "error" in rec else
                         f"first generation {rec['wall_s']:5.2f} s, mean γ {rec['mean_gamma']:.1f}"
                         if "wall_s" in rec else f"{rec['progress']}"), file=sys.stderr, flush=True)
    return results


def _block(runs: List[Dict[str, Any]], block: int, pair: str, side: str) -> Dict[str, Dict[str, Any]]:
    return {r["engine"]: r for r in runs if (r["block"], r["pair"], r["side"]) == (block, pair, side)
            and "error" not in r}


def first_use_cost(d: Dict[str, Dict[str, Any]]) -> Optional[float]:
    """``fresh``'s load time minus the block's pure load time (the median of the engines that load the
    same two files and measure nothing)."""
    pure = [d[e]["load_s"] for e in ("load",) + FIXED if e in d]
    return d["fresh"]["load_s"] - statistics.median(pure) if "fresh" in d and pure else None


def effective(runs: List[Dict[str, Any]], block: int, pair: str, side: str) -> Dict[str, float]:
    """Per engine of one block: tokens / the time that counts (see the module docstring)."""
    d = _block(runs, block, pair, side)
    out = {e: d[e]["tokens"] / d[e]["wall_s"] for e in FIXED + ("plain",) if e in d}
    cost = first_use_cost(d)
    if cost is not None:
        out["fresh"] = d["fresh"]["tokens"] / (cost + d["fresh"]["wall_s"])
    if all(e in out for e in FIXED):
        out["best fixed γ"] = max(out[e] for e in FIXED)
    return out


def _measured(rec: Dict[str, Any]) -> Optional[float]:
    """The seconds a first-use measurement reported in its progress line, if it printed one."""
    matches = (re.search(r"measured in ([\d.]+) s", msg) for _, msg in rec.get("progress") or [])
    return next((float(m.group(1)) for m in matches if m), None)


def render(results: Dict[str, Any], data: str = "first_use_results.json") -> str:
    runs = results["runs"]
    blocks = sorted({r["block"] for r in runs})
    sides = [s for s in SIDES if any(r["side"] == s for r in runs)]
    bv = results.get("baseline_versions") or {}
    L = [SECTION, "", "Generated by `python -m bench.first_use` (every run in [first_use_results.json]"
         f"({data})):", "", "```", results["command"], "```", "",
         f"- {results['date']}; {SETTINGS[results['setting']].label}, {results['tokens']} tokens (`ignore_eos`), "
         f"{results['threads']} threads; {results['machine'].get('cpu')}; {len(blocks)} block(s), each one prompt of "
         "bench/prompts.py (rotating); every engine in a fresh process with an empty calibration directory, "
         "its first generation timed, in an order rotated from block to block. This checkout at git "
         f"{results['versions'].get('specdec_cpu_git', '?')}"
         + (f"; the previous main at git {bv.get('specdec_cpu_git', '?')}" if bv else "") + ".",
         "- `fresh`: γ=auto, default calibration (none stored: first use). Its time = its first-use cost at load "
         "(its load minus the pure load of the same files in the same block, the median over `load` and the "
         "fixed γ, which measure nothing; in brackets the median the "
         "decoder's own progress line reported, where it printed one) + its first generation (prompt and "
         "decode). Fixed γ (2, 4, 6: the best of them per block) and plain (γ=0, no draft): their first "
         "generation. tok/s = tokens / that time; ratios: medians of per-block ratios [bootstrap 95% interval].",
         "- The figure that matters: memory-bound, fresh / best fixed γ (drafting pays; can γ=auto find it "
         "from nothing?); compute-bound, fresh / plain (drafting barely pays; does first use cost anything?).", "",
         "| pair | checkout | first-use cost at load, s | fresh first generation, s | fresh tok/s | best fixed γ "
         "tok/s | plain tok/s | fresh / best fixed γ | fresh / plain | fresh mean γ, first 8 steps |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    for p in results["pairs"]:
        for side in sides:
            effs = [effective(runs, b, p, side) for b in blocks]
            fresh = [r for r in runs if (r["pair"], r["side"], r["engine"]) == (p, side, "fresh") and "error" not in r]
            cost = median(first_use_cost(_block(runs, b, p, side)) for b in blocks)
            said = median(_measured(r) for r in fresh)
            first8 = median(statistics.fmean(r["first_gammas"]) for r in fresh if r.get("first_gammas"))
            cells = [PAIRS[p][0], SIDES[side], fmt(cost, 2) + (f" [{said:.2f}]" if said else ""),
                     fmt(median(r["wall_s"] for r in fresh), 2)]
            cells += [fmt(median(e.get(k) for e in effs)) for k in ("fresh", "best fixed γ", "plain")]
            cells += [ratio_text([e["fresh"] / e[k] for e in effs if "fresh" in e and k in e])
                      for k in ("best fixed γ", "plain")]
            L.append("| " + " | ".join(cells + [fmt(first8)]) + " |")
    if "baseline" in sides:
        L += ["", "| pair | fresh tok/s, this checkout / previous main |", "|---|---|"]
        for p in results["pairs"]:
            pairs = [(effective(runs, b, p, "new").get("fresh"), effective(runs, b, p, "baseline").get("fresh"))
                     for b in blocks]
            L.append(f"| {PAIRS[p][0]} | {ratio_text([a / b for a, b in pairs if a and b])} |")
    errors = [r for r in runs if "error" in r]
    if errors:
        L += ["", f"- {len(errors)} run(s) failed, e.g. {errors[0]['side']} {errors[0]['engine']}: "
              f"{errors[0]['error'][:200]}"]
    return "\n".join(L) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.first_use", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=lambda s: s.split(","), default=list(PAIRS),
                    help=f"model pairs (default {','.join(PAIRS)})")
    ap.add_argument("--setting", choices=list(SETTINGS), default="t1", help="sampling setting (default t1)")
    ap.add_argument("--blocks", type=int, default=5, help="blocks (default 5: each prompt once)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234, help="base seed (block i uses seed + i)")
    ap.add_argument("--new-python", default=sys.executable,
                    help="a Python importing this checkout's specdec_cpu (default: this one)")
    ap.add_argument("--baseline-python", default=None,
                    help="also run every engine under this Python, importing the previous main's specdec_cpu "
                         "(default: this checkout only)")
    ap.add_argument("--quick", action="store_true", help="one block, 32 tokens")
    ap.add_argument("--report-only", type=Path, default=None)
    args = ap.parse_args(argv)
    args.command = " ".join(["python -m bench.first_use", *redact_baseline(sys.argv[1:] if argv is None else argv)])
    if args.quick:
        args.blocks, args.tokens = 1, 32
    if [p for p in args.pairs if p not in PAIRS]:
        ap.error(f"--pairs: choose from {', '.join(PAIRS)}")
    results = json.loads(args.report_only.read_text()) if args.report_only else run(args)
    publish("first_use", results, render, SECTION, output_dir=results_dir("first_use"),
            name="first_use_results.json", report_only=args.report_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
