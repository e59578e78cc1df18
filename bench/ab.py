"""Single stream, this checkout against the previous main, side by side.

    python -m bench.ab --baseline-python PATH                  # memory-bound pair (F32 / Q4_0), T = 0, 0.7, 1
    python -m bench.ab --baseline-python PATH --pair compute   # compute-bound pair (Q4_K_M / Q4_0)
    python -m bench.ab --baseline-python PATH --quick          # one block, 32 tokens, T = 0: does it run?
    python -m bench.ab --report-only bench/results/ab/ab_results.json     # re-render the section

``--baseline-python`` (or $SPECDEC_BASELINE_PYTHON) imports the previous
main's specdec_cpu; ``--new-python`` (default: this Python) this checkout's.
Engines, one at a time, in an order rotated from block to block:

- ``baseline-auto``, ``new-auto``: SpeculativeDecoder γ=auto with the draft;
- ``baseline-g0``, ``new-g0``: γ=0 and no draft (plain decoding through the package);
- ``llama-plain``: llama.cpp's ``llama-completion`` (bench/engines/llama_cli.py).

Each of ours runs in a fresh process of its checkout's Python
(bench/ab_worker.py: load, an 8-token warm-up, then ``--tokens`` tokens with
``ignore_eos`` on the block's prompt of bench/prompts.py).  Both checkouts
plan from the same pass times, which the baseline measures before the first
block into a calibration directory every engine reads.  Reported per
setting: medians of per-block ratios of decode tok/s [bootstrap 95%
interval].  Writes bench/results/ab/ab_results.json and its section of
bench/results/ab/RESULTS.md (``--output-dir``'s RESULTS.md): the evidence for
one change, which its commit and bench/HISTORY.md cite, not a current result.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from .ab_worker import WARM_PROMPT
from .common import (
    BENCH,
    baseline_python,
    baseline_versions,
    fmt,
    machine_info,
    median,
    pair_tokenizer,
    paired_ratios,
    paired_run,
    publish,
    ratio_text,
    redact_baseline,
    redact_calibration,
    results_dir,
    rotated,
    say,
    versions,
)
from .engines import llama_cli
from .prompts import PROMPTS
from .suite import F32, Q4_0, Q4_K_M, SETTINGS

WORKER = BENCH / "ab_worker.py"
SECTION = "## Single stream, this checkout against the previous main"
ENGINES = ("baseline-auto", "baseline-g0", "new-auto", "new-g0", "llama-plain")
#: (numerator, denominator) of the reported ratios
RATIOS = (("new-auto", "baseline-auto"), ("new-g0", "baseline-g0"), ("new-auto", "llama-plain"),
          ("baseline-auto", "llama-plain"), ("new-auto", "new-g0"))
PAIRS = {"memory": ("memory-bound: F32 target / Q4_0 draft", F32, Q4_0),
         "compute": ("compute-bound: Q4_K_M target / Q4_0 draft", Q4_K_M, Q4_0)}
N_CTX = 2048
TIMEOUT = 900.0


def worker(python: str, target: Path, draft: Optional[Path], gamma: Any, request: Dict[str, Any], *,
           tokens: int, threads: int, extra: Sequence[str] = (), env: Optional[Dict[str, str]] = None
           ) -> Dict[str, Any]:
    """Run bench/ab_worker.py under ``python``; its JSON line."""
    cmd = [python, str(WORKER), "--target", str(target), "--gamma", str(gamma), "--tokens", str(tokens),
           "--threads", str(threads), "--n-ctx", str(N_CTX), *extra] + (["--draft", str(draft)] if draft else [])
    proc = subprocess.run(cmd, input=json.dumps(request), capture_output=True, text=True, timeout=TIMEOUT,
                          env=env)
    if proc.returncode != 0 or not proc.stdout.strip():
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"worker exited with {proc.returncode}: {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def request_of(text: str, setting, seed: int) -> Dict[str, Any]:
    return {"prompt": text, "temperature": setting.temperature, "top_p": setting.top_p, "top_k": setting.top_k,
            "min_p": setting.min_p, "seed": seed}


def run_engine(engine: str, args, target: Path, draft: Path, text: str, setting, seed: int) -> Dict[str, Any]:
    if engine == "llama-plain":
        r = llama_cli.run_plain(target, text, args.tokens, threads=args.threads, seed=seed, ctx=N_CTX,
                                ignore_eos=True, timeout=TIMEOUT, **setting.peer_kwargs())
        perf = r.target_perf
        wall = perf["total_ms"] / 1e3 if "total_ms" in perf else None
        return {"tokens": r.n_decoded, "tps": r.tokens_per_s_with_sampling or r.tokens_per_s,
                "tps_eval_only": r.tokens_per_s, "wall_s": wall, "process_wall_s": r.wall_seconds,
                "prompt_s": r.prompt_seconds, "decode_s": r.decode_seconds}
    side, gamma = engine.split("-")
    python = args.baseline_python if side == "baseline" else args.new_python
    auto = gamma == "auto"
    return worker(python, target, draft if auto else None, "auto" if auto else 0,
                  request_of(text, setting, seed), tokens=args.tokens, threads=args.threads)


def run(args) -> Dict[str, Any]:
    from specdec_cpu.demo_models import ensure_model

    label, tname, dname = PAIRS[args.pair]
    target, draft = ensure_model(tname), ensure_model(dname)
    peer_paths = llama_cli.ensure_peers()
    results: Dict[str, Any] = {
        "command": args.command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine_info(args.threads), "versions": versions(peer_paths),
        "baseline_versions": baseline_versions(args.baseline_python),
        "pair": args.pair, "pair_label": label, "tokens": args.tokens, "threads": args.threads,
        "blocks": args.blocks, "settings": args.settings, "n_ctx": N_CTX, "runs": [], "complete": False}
    out = args.output_dir / "ab_results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    cal_dir = Path(tempfile.mkdtemp(prefix="ab-calibration-"))
    os.environ["SPECDEC_CALIBRATION_DIR"] = str(cal_dir)  # every engine's (the workers inherit it)
    try:
        say(f"the baseline measures the pair's pass times into the shared calibration store ({label})")
        first = worker(args.baseline_python, target, draft, "auto", {"prompt": WARM_PROMPT}, tokens=8,
                       threads=args.threads)
        results["calibration_run"] = {k: first.get(k) for k in ("load_s", "progress", "calibrated")}
        results["calibration"] = [redact_calibration(json.loads(f.read_text()))
                                  for f in sorted(cal_dir.glob("*.json"))]
        llama_cli.run_plain(target, WARM_PROMPT, 8, threads=args.threads, ctx=N_CTX, timeout=TIMEOUT)  # page cache
        block = 0
        for sid in args.settings:
            setting = SETTINGS[sid]
            for b in range(args.blocks):
                prompt = PROMPTS[b % len(PROMPTS)]
                text = pair_tokenizer().chat_prompt(prompt.messages())
                seed = args.seed + block
                for pos, engine in enumerate(rotated(ENGINES, block)):
                    rec = paired_run(lambda: run_engine(engine, args, target, draft, text, setting, seed),
                                     (RuntimeError, llama_cli.PeerRunError, subprocess.TimeoutExpired, ValueError),
                                     engine=engine, setting=sid, block=block, prompt=prompt.name, seed=seed,
                                     position=pos)
                    results["runs"].append(rec)
                    say(f"{sid} block {block} ({prompt.name}) {engine:13s} " + (
                        f"ERROR {rec['error']}" if rec.get("error") else
                        f"{rec['tps']:6.2f} tok/s  wall {fmt(rec.get('wall_s'), 2)} s  mean γ "
                        f"{fmt(rec.get('mean_gamma'), 2)}  α {fmt(rec.get('mean_alpha'), 3)}"))
                block += 1
                out.write_text(json.dumps(results, indent=1))
        results["complete"] = True
    except KeyboardInterrupt:
        say("interrupted: writing what was measured so far")
    finally:
        shutil.rmtree(cal_dir, ignore_errors=True)
    results["finished"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return results


def render(results: Dict[str, Any], data: str = "ab_results.json") -> str:
    runs = results["runs"]
    m, v, bv = results["machine"], results["versions"], results["baseline_versions"]
    n_blocks = len({r["block"] for r in runs})
    cal = (results.get("calibration_run") or {}).get("progress") or []
    L = [SECTION, "", f"Generated by `python -m bench.ab` (every run in [ab_results.json]({data})):", "",
         "```", results["command"], "```", "",
         f"- {results['date']}{'' if results.get('complete') else ' (interrupted: partial)'}; "
         f"{results['pair_label']}, {results['tokens']} new tokens per run (`ignore_eos`: every engine the same "
         f"work), {results['threads']} threads, n_ctx {results['n_ctx']}; {m.get('cpu')}, {m.get('cores')} cores. "
         f"{n_blocks} blocks; each block one prompt of bench/prompts.py (rotating) and one seed, the five "
         "engines one at a time in an order rotated from block to block.",
         f"- This checkout: specdec-cpu {v.get('specdec_cpu')} at git {v.get('specdec_cpu_git', '?')}; the "
         f"previous main: {bv.get('specdec_cpu')} at git {bv.get('specdec_cpu_git', '?')}; llama.cpp "
         f"{v.get('llama_cpp', '?')}.",
         "- `*-auto`: SpeculativeDecoder γ=auto with the draft; `*-g0`: γ=0 without a draft (plain decoding "
         "through the package); each in a fresh process of its checkout's Python (bench/ab_worker.py), after "
         "an 8-token warm-up generation on another prompt. `llama-plain`: llama.cpp's `llama-completion`, "
         "its own decode tok/s with sampling. "
         + ("Both checkouts plan from the same pass times, measured once before the first block by the previous "
            "main at first use" + (f" ({cal[-1][1]})" if cal else "")
            + " and stored in a calibration directory every engine reads."
            if (results.get("calibration_run") or {}).get("calibrated", True) else
            "The previous main's first run stored no calibration (γ=auto measures nothing up front): every γ=auto "
            "run, of either checkout, learns the pass times from its own first passes."),
         "- tok/s: decode tok/s (tokens / (generation − prompt processing), as `GenerationStats` and llama.cpp "
         "report it); wall: the generate call (prompt and decode; llama-plain: its `total time`). Ratios: "
         "median of per-block ratios of decode tok/s [bootstrap 95% interval over blocks].", ""]
    uncal = [r for r in runs if r["engine"].endswith("auto") and r.get("calibrated") is False]
    if uncal:
        L += [f"- **{len(uncal)} γ=auto run(s) found no stored calibration** (engines "
              f"{', '.join(sorted({r['engine'] for r in uncal}))}): they started from priors and learned the "
              "pass times from their first passes.", ""]
    errors = [r for r in runs if r.get("error")]
    if errors:
        L += [f"- {len(errors)} run(s) failed, e.g. {errors[0]['engine']}: {errors[0]['error'][:200]}", ""]
    settings = [s for s in results["settings"] if any(r["setting"] == s for r in runs)]
    L += ["| setting | " + " | ".join(f"{a} / {b}" for a, b in RATIOS) + " |",
          "|---|" + "---|" * len(RATIOS)]
    for sid in settings:
        L.append(f"| {SETTINGS[sid].label} | "
                 + " | ".join(ratio_text(paired_ratios(runs, a, b, sid)) for a, b in RATIOS) + " |")
    L += ["", "| setting | engine | tok/s (median) | wall s (median) | mean γ | mean α | drafted / accepted "
          "per run |", "|---|---|---|---|---|---|---|"]
    for sid in settings:
        for e in ENGINES:
            rs = [r for r in runs if r["setting"] == sid and r["engine"] == e and r.get("tps")]
            if not rs:
                continue
            med = lambda k: median(r.get(k) for r in rs)  # noqa: E731
            drafted = (f"{fmt(med('drafted'), 0)} / {fmt(med('accepted'), 0)}"
                       if e.endswith("auto") else "–")
            L.append(f"| {SETTINGS[sid].label} | {e} | {fmt(med('tps'), 2)} | {fmt(med('wall_s'), 2)} | "
                     f"{fmt(med('mean_gamma'), 2)} | {fmt(med('mean_alpha'), 3)} | {drafted} |")
    return "\n".join(L) + "\n"


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline-python", default=None,
                    help="a Python importing the previous main's specdec_cpu (default: $SPECDEC_BASELINE_PYTHON)")
    ap.add_argument("--new-python", default=sys.executable,
                    help="a Python importing this checkout's specdec_cpu (default: this one)")
    ap.add_argument("--pair", choices=list(PAIRS), default="memory")
    ap.add_argument("--settings", type=lambda s: s.split(","), default=list(SETTINGS),
                    help=f"sampling settings (default {','.join(SETTINGS)})")
    ap.add_argument("--blocks", type=int, default=10, help="blocks per setting (default 10: each prompt twice)")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per run (default 128)")
    ap.add_argument("--threads", type=int, default=2, help="threads of every engine (default 2)")
    ap.add_argument("--seed", type=int, default=1234, help="base seed (block i uses seed + i)")
    ap.add_argument("--quick", action="store_true", help="one block, 32 tokens, T = 0")
    ap.add_argument("--output-dir", type=Path, default=results_dir("ab"), help="where ab_results.json goes")
    ap.add_argument("--report-only", type=Path, default=None, metavar="AB_RESULTS_JSON")
    args = ap.parse_args(argv)
    args.command = " ".join(["python -m bench.ab", *redact_baseline(sys.argv[1:] if argv is None else argv)])
    if args.quick:
        args.blocks, args.tokens, args.settings = 1, 32, ["t0"]
    unknown = [s for s in args.settings if s not in SETTINGS]
    if unknown:
        ap.error(f"unknown settings {', '.join(unknown)}; known: {', '.join(SETTINGS)}")
    args.baseline_python = baseline_python(args.baseline_python)
    if args.report_only is None and not args.baseline_python:
        ap.error("give --baseline-python PATH or set $SPECDEC_BASELINE_PYTHON")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    results = json.loads(args.report_only.read_text()) if args.report_only else run(args)
    publish("ab", results, render, SECTION, output_dir=args.output_dir, name="ab_results.json",
            report_only=args.report_only, results_md=args.output_dir / "RESULTS.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
