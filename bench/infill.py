"""Fill-in-the-middle for code assistants: ours against llama-server ``/infill``.

    python -m bench.infill            # the demo pair (F32 / Q4_0), greedy, 64-token completions
    python -m bench.infill --quick    # two blocks, to see that it runs

Each block cuts one of this package's modules inside a function: the prefix,
1-3 hidden lines, the suffix, and another module as extra context
(``input_extra``).  Every engine completes the middle with 64 new tokens
(``ignore_eos``), streamed, from an empty prompt cache:

- ``ours-model``, ``ours-ngram``, ``ours-hybrid``: SpeculativeDecoder γ=auto
  with the draft model, with prompt lookup (the suffix and the extra file are
  part of the prompt), with both; ``ours-g0``: γ=0;
- ``server-plain``: llama-server's ``/infill`` without a draft;
  ``server-md{N}``: with ``-md`` the draft, ``--spec-draft-n-max N``.

Reported: medians of per-block ratios of decode tok/s [bootstrap 95%
interval] against the faster llama-server mode, and the median time to first
token.  Writes bench/results/infill/infill_results.json and its section of
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .common import (
    BENCH,
    machine_info,
    median,
    paired_ratios,
    paired_run,
    publish,
    ratio_text,
    results_dir,
    rotated,
    say,
    versions,
)
from .engines import llama_cli, llama_server
from .engines.ours_single import OursSingle
from .structured import best_server
from .suite import F32, Q4_0

PACKAGE = BENCH.parent / "python" / "specdec_cpu"
SECTION = "## Fill in the middle: ours against llama-server /infill"
N_CTX = 4096
TOKENS = 64
#: Source files the workload cuts (real code of this repository), and the extra file each gets.
FILES = [("core/step.py", "core/sequence.py"), ("planning/policy.py", "planning/batch_planner.py"),
         ("decoding/loop.py", "core/step.py"), ("constraints/state.py", "constraints/compiled.py"),
         ("core/penalties.py", "params.py"), ("drafters/ngram.py", "drafters/base.py")]
MAX_PREFIX_CHARS, MAX_SUFFIX_CHARS, MAX_EXTRA_CHARS = 3000, 1500, 2500


def cut(path: str, extra: str, rng: random.Random) -> Dict[str, Any]:
    """One FIM case: a prefix ending inside a function body, 1-3 hidden lines, the suffix."""
    lines = (PACKAGE / path).read_text().splitlines(keepends=True)
    inside = [i for i, ln in enumerate(lines) if ln.startswith("        ") and ln.strip()
              and not ln.strip().startswith(("#", '"""'))]
    i = rng.choice(inside[len(inside) // 4:])
    k = rng.randint(1, 3)
    prefix = "".join(lines[:i])[-MAX_PREFIX_CHARS:]
    suffix = "".join(lines[i + k:])[:MAX_SUFFIX_CHARS]
    text = (PACKAGE / extra).read_text()[:MAX_EXTRA_CHARS]
    return {"name": f"{path}:{i + 1}", "prefix": prefix, "suffix": suffix,
            "extra": [{"filename": f"specdec_cpu/{extra}", "text": text}], "middle": "".join(lines[i:i + k])}


def workload(n: int, seed: int) -> List[Dict[str, Any]]:
    rng = random.Random(seed)
    return [cut(*FILES[b % len(FILES)], rng) for b in range(n)]


class Ours(OursSingle):
    """Our single-stream decoder on one FIM case, from an empty cache."""

    def run(self, case: Dict[str, Any], seed: int) -> Dict[str, Any]:
        from specdec_cpu import SamplingParams

        self.dec.reset()
        ids = self.dec.infill_prompt(case["prefix"], case["suffix"], case["extra"])
        t0 = time.perf_counter()
        stream = self.dec.stream(ids, max_tokens=TOKENS, params=SamplingParams(temperature=0.0, ignore_eos=True))
        ttft = None
        for piece in stream:
            if ttft is None and piece:
                ttft = time.perf_counter() - t0
        s = stream.result.stats
        return {"tps": s.tokens_per_second, "tokens": s.tokens, "ttft_s": ttft, "prompt_tokens": len(ids),
                "drafted": s.drafted, "accepted": s.accepted, "by_drafter": s.by_drafter,
                "mean_gamma": statistics.fmean(s.gammas) if s.gammas else 0.0}


def server_run(url: str, case: Dict[str, Any], seed: int) -> Dict[str, Any]:
    r = llama_server.server_complete(url, "", TOKENS, temperature=0.0, seed=seed, stream=True, cache_prompt=False,
                                     endpoint="/infill",
                                     extra={"input_prefix": case["prefix"], "input_suffix": case["suffix"],
                                            "input_extra": case["extra"], "ignore_eos": True})
    return {"tps": r.tokens_per_s, "tokens": r.n_predicted, "ttft_s": r.ttft_s, "prompt_tokens": r.prompt_tokens,
            "acceptance": r.acceptance}


def run(args) -> Dict[str, Any]:
    from specdec_cpu.demo_models import ensure_model

    target, draft = ensure_model(F32), ensure_model(Q4_0)
    peer_paths = llama_cli.ensure_peers()
    engines = ["ours-model", "ours-ngram", "ours-hybrid", "ours-g0", "server-plain",
               *(f"server-md{n}" for n in args.draft_max)]
    cases = workload(args.blocks, args.seed)
    results: Dict[str, Any] = {
        "command": args.command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine_info(args.threads), "versions": versions(peer_paths), "engines": engines,
        "tokens": TOKENS, "cases": [{k: c[k] for k in ("name", "middle")} for c in cases], "runs": [],
        "complete": False}
    out = args.output_dir / "infill_results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        say("loading our decoders and starting the llama-servers")
        ours = {"ours-model": Ours("auto", n_ctx=N_CTX),
                "ours-ngram": Ours("auto", draft=False, ngram=True, n_ctx=N_CTX),
                "ours-hybrid": Ours("auto", ngram=True, n_ctx=N_CTX),
                "ours-g0": Ours(0, draft=False, n_ctx=N_CTX)}
        for o in ours.values():
            o.start(1, args.threads)
            stack.callback(o.stop)
        servers = llama_server.start_servers(stack, target, draft, args.draft_max, ctx=N_CTX, threads=args.threads)
        runner = {e: o.run for e, o in ours.items()} | {e: partial(server_run, url) for e, url in servers.items()}
        try:
            for e in engines:  # warm-up, not recorded
                runner[e](cases[0], 0)
            for block, case in enumerate(cases):
                for pos, e in enumerate(rotated(engines, block)):
                    rec = paired_run(lambda: runner[e](case, args.seed + block),
                                     (RuntimeError, llama_server.PeerRunError, ValueError),
                                     engine=e, setting="t0", block=block, prompt=case["name"], position=pos)
                    results["runs"].append(rec)
                    say(f"block {block} ({case['name']}) {e:14s} " + (
                        f"ERROR {rec['error']}" if rec.get("error") else
                        f"{rec['tps']:6.2f} tok/s  ttft {rec['ttft_s'] or 0:.3f} s  prompt {rec['prompt_tokens']}"))
                out.write_text(json.dumps(results, indent=1))
            results["complete"] = True
        except KeyboardInterrupt:
            say("interrupted: writing what was measured so far")
    results["finished"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return results


def render(results: Dict[str, Any], data: str = "infill_results.json") -> str:
    runs = results["runs"]
    m, v = results["machine"], results["versions"]
    best = best_server(runs, "t0")
    L = [SECTION, "", f"Generated by `python -m bench.infill` (every run in [infill_results.json]({data})):",
         "", "```", results["command"], "```", "",
         f"- {results['date']}{'' if results.get('complete') else ' (interrupted: partial)'}; F32 target, Q4_0 "
         f"draft (the demo pair, a coder model with FIM tokens); greedy, {results['tokens']} new tokens per "
         f"completion (`ignore_eos`), streamed, no prompt cache; {m.get('cpu')}, {m.get('cores')} cores; "
         f"llama.cpp {v.get('llama_cpp', '?')}. {len(results['cases'])} blocks: a prefix and suffix cut from "
         "one of this package's modules around 1-3 hidden lines, another module as extra context; every engine "
         "once per block, in an order rotated from block to block.",
         f"- Ratios: median of per-block ratios of decode tok/s [bootstrap 95% interval]; the faster "
         f"llama-server mode (by median) is {best}.", "",
         "| engine | tok/s (median) | / " + str(best) + " (the faster llama-server) | / ours-g0 | time to first "
         "token (median, s) | mean γ |", "|---|---|---|---|---|---|"]
    for e in results["engines"]:
        rs = [r for r in runs if r["engine"] == e and r.get("tps")]
        if not rs:
            continue
        L.append(f"| {e} | {median(r['tps'] for r in rs):.2f} | {ratio_text(paired_ratios(runs, e, best, 't0'))} | "
                 f"{ratio_text(paired_ratios(runs, e, 'ours-g0', 't0'))} | {median(r['ttft_s'] for r in rs):.3f} | "
                 f"{median(r.get('mean_gamma') for r in rs) or 0:.2f} |")
    errors = [r for r in runs if r.get("error")]
    if errors:
        L += ["", f"{len(errors)} run(s) failed, e.g. {errors[0]['engine']}: {errors[0]['error'][:200]}"]
    return "\n".join(L) + "\n"


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.infill", description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=12, help="FIM cases (one block each)")
    ap.add_argument("--draft-max", default="4,8,16", help="llama-server --spec-draft-n-max values to run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="two blocks, one draft-max (8)")
    ap.add_argument("--output-dir", type=Path, default=results_dir("infill"))
    ap.add_argument("--report-only", type=Path, default=None, metavar="RESULTS.json")
    args = ap.parse_args(argv)
    args.draft_max = [int(n) for n in args.draft_max.split(",") if n]
    if args.quick:
        args.blocks, args.draft_max = 2, [8]
    args.command = "python -m bench.infill " + " ".join(argv if argv is not None else sys.argv[1:])
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    results = json.loads(args.report_only.read_text()) if args.report_only else run(args)
    print(publish("infill", results, render, SECTION, output_dir=args.output_dir, name="infill_results.json",
                  report_only=args.report_only))
    return 0


if __name__ == "__main__":
    sys.exit(main())
