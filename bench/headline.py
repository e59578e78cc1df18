"""The README's headline table, generated from the studies' result files.

Each row: the median of per-block ratios of decode tok/s, ours over a
llama.cpp engine run in the same block, [bootstrap 95% interval].  The
README holds the table between two markers; ``python -m bench.headline``
rewrites it, ``--check`` fails when it is stale (tests/test_readme.py), and
``--run`` first reruns the command each result file records (the suite,
bench.structured and bench.infill: about three hours on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from . import report
from .common import BENCH, median, paired_ratios, stat

README = BENCH.parent / "README.md"
START, END = "<!-- headline:start (python -m bench.headline) -->", "<!-- headline:end -->"

#: llama.cpp's exact speculative peers (llama-speculative is left out: it is
#: not exact, bench/RESULTS.md "Is it exact?").
EXACT_SPECULATIVE = ("llama-speculative-simple", "llama-server-draft")
SERVER_NGRAM = ("llama-server-ngram-simple", "llama-server-ngram-map-k", "llama-server-ngram-mod")


def _load(name: str, results_dir: Path) -> Optional[Dict[str, Any]]:
    path = results_dir / name
    return json.loads(path.read_text()) if path.exists() else None


def _ratio(values: Sequence[float]) -> str:
    s = stat(values)
    if s["median"] is None:
        return "–"
    ci = f" [{s['lo']:.2f}–{s['hi']:.2f}]" if s["lo"] is not None else ""
    return f"**{s['median']:.2f}×**{ci}"


def _peer(results: Dict[str, Any], eid: str) -> str:
    return report.engine_label(results, eid).removeprefix("llama.cpp ")


def _fastest(results: Dict[str, Any], pair: str, setting: str, families: Sequence[str],
             kinds: Optional[Sequence[str]] = None) -> Optional[str]:
    """The fastest variant (median tok/s) over the given engine families."""
    best, best_tps = None, -1.0
    for fam in families:
        eid = report.best_variant(results, pair, setting, fam, kinds) or (
            fam if report.runs_of(results, pair, setting, fam, kinds) else None)
        if eid is None:
            continue
        tps = median(r.get("tps") for r in report.runs_of(results, pair, setting, eid, kinds)) or 0.0
        if tps > best_tps:
            best, best_tps = eid, tps
    return best


def suite_rows(results: Dict[str, Any]) -> List[List[str]]:
    """Rows from the end-to-end suite (python -m bench)."""
    rows: List[List[str]] = []
    plain = f"plain decoding ({report.baseline_id(results)})"
    for setting, temp in (("t1", "T = 1"), ("t0.7", "T = 0.7, top-p 0.95")):
        rows.append([f"One stream, memory-bound pair (F32 target, Q4_0 draft), {temp}", "γ=auto",
                     plain, _ratio(report.ratios(results, "memory", setting, "auto"))])
    peer = _fastest(results, "memory", "t1", EXACT_SPECULATIVE)
    if peer:
        rows.append(["One stream, memory-bound pair, T = 1", "γ=auto",
                     f"fastest exact speculative peer: {_peer(results, peer)}",
                     _ratio(report.block_ratios(results, "memory", "t1", "auto", peer))])
    rows.append(["One stream, compute-bound pair (Q4_K_M target, Q4_0 draft), T = 1: speculation cannot pay",
                 "γ=auto", plain, _ratio(report.ratios(results, "compute", "t1", "auto"))])
    grounded = ("grounded",)
    peer = _fastest(results, "ngram", "t0.7", SERVER_NGRAM, grounded)
    if peer:
        rows.append(["Code editing and answers from a document, prompt lookup, T = 0.7", "n-gram",
                     f"fastest n-gram mode: {_peer(results, peer)}",
                     _ratio(report.block_ratios(results, "ngram", "t0.7", "ngram", peer, grounded))])
    return rows


def structured_rows(results: Dict[str, Any]) -> List[List[str]]:
    """Rows from python -m bench.structured (JSON schemas)."""
    from .structured import SETTINGS, best_server

    best = best_server(results["runs"], "t0.7")
    if not best:
        return []
    return [[f"JSON under a schema, {SETTINGS['t0.7'][0]}", "γ=auto, grammar-forced drafts",
             f"llama-server's fastest mode ({best})",
             _ratio(paired_ratios(results["runs"], "ours-auto", best, "t0.7"))]]


def infill_rows(results: Dict[str, Any]) -> List[List[str]]:
    """Rows from python -m bench.infill (fill-in-the-middle)."""
    from .structured import best_server

    best = best_server(results["runs"], "t0")
    if not best:
        return []
    return [["Fill-in-the-middle in this package's code, greedy", "n-gram", f"llama-server /infill ({best})",
             _ratio(paired_ratios(results["runs"], "ours-ngram", best, "t0"))]]


#: (result file, its rows)
STUDIES: Sequence[tuple[str, Callable[[Dict[str, Any]], List[List[str]]]]] = (
    ("suite/results.json", suite_rows),
    ("structured/structured_results.json", structured_rows),
    ("infill/infill_results.json", infill_rows),
)


def render(results_dir: Path = BENCH / "results") -> str:
    """The table, with the machine it was measured on."""
    rows: List[List[str]] = []
    machine, dates = None, set()
    for name, make in STUDIES:
        data = _load(name, results_dir)
        if data is not None:
            rows += make(data)
            machine = machine or data.get("machine")
            dates.add(str(data.get("date") or data.get("started") or "?")[:10])
    where = f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores" if machine else "?"
    lines = [f"Measured on {where} ({', '.join(sorted(dates))}), on the demo models "
             "(Qwen2.5-Coder-0.5B-Instruct); the median of per-block ratios of decode tok/s, ours over "
             "llama.cpp run in the same block, [95% interval]. Every peer at its fastest "
             "setting; the commands and every table: [bench/RESULTS.md](bench/RESULTS.md); "
             "`python -m bench.headline --run` measures this table again.", "",
             "| workload | ours | against llama.cpp's | ours ÷ theirs |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def splice(text: str, table: str) -> str:
    """``text`` with the block between the markers replaced by ``table``."""
    head, sep, rest = text.partition(START)
    if not sep or END not in rest:
        raise ValueError(f"README has no {START} ... {END} block")
    return head + START + "\n" + table + "\n" + END + rest.split(END, 1)[1]


def rerun(results_dir: Path) -> None:
    """Run again the command each of the table's result files records (``python -m bench...``)."""
    for name, _ in STUDIES:
        data = _load(name, results_dir)
        if data is None:
            raise SystemExit(f"{results_dir / name} is missing: it records the command to rerun")
        command = shlex.split(data["command"])
        print(f"running {data['command']}", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, *command[1:]], cwd=BENCH.parent, check=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.headline", description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if README.md's table differs from the results")
    ap.add_argument("--run", action="store_true", help="measure again first: rerun each result file's command")
    ap.add_argument("--readme", type=Path, default=README)
    ap.add_argument("--results-dir", type=Path, default=BENCH / "results")
    args = ap.parse_args(argv)
    if args.run:
        rerun(args.results_dir)
    old = args.readme.read_text()
    new = splice(old, render(args.results_dir))
    if args.check:
        if new != old:
            print(f"{args.readme}: the headline table is stale; run python -m bench.headline", file=sys.stderr)
            return 1
        return 0
    args.readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
