"""Split γ=auto's loss against γ=0 in a serving run into uneven finishing
and slower steps.

    python -m bench.serving_spread bench/serving_k4_focused_results.json

A burst's aggregate rate (tokens over the time until its *last* request
finishes) falls when drafting for some requests lets the others fall behind,
even if the batch emits its tokens as fast as before. The mean time to
complete a request does not carry that penalty. Where the two ratios of auto
to γ=0 differ, the difference is the spread of finishing times; where they
agree, the steps themselves are slower or faster. Blocks are split by how much
auto drafted (≤ ``--drafted`` tokens: it ran about the same passes as γ=0).
Medians of per-block ratios with a bootstrap 95% interval; no time is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .common import ratio_text
from .serving import paired_runs


def mean_completion(run: Dict[str, Any]) -> float:
    """Mean seconds from a request's arrival to its last token."""
    return statistics.mean(q["done"] - q["sent"] for q in run["requests"])


def rows(results: Dict[str, Any], a: str, b: str, drafted: int) -> List[str]:
    """Table rows: blocks where ``a`` drafted more than ``drafted`` tokens, and the rest."""
    out = []
    pairs = paired_runs(results, a, b)
    for name, keep in ((f"{a} drafted > {drafted} tokens", lambda n: n > drafted),
                       (f"{a} drafted ≤ {drafted} tokens", lambda n: n <= drafted)):
        sel = [(x, y) for x, y in pairs if keep((x.get("stats") or {}).get("drafted") or 0)]
        agg = [x["agg_tps"] / y["agg_tps"] for x, y in sel]
        done = [mean_completion(y) / mean_completion(x) for x, y in sel]
        out.append(f"| {name} | {len(sel)} | {ratio_text(agg)} | {ratio_text(done)} |")
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.serving_spread", description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, nargs="+", help="files written by python -m bench.serving")
    ap.add_argument("--engines", nargs=2, default=("batched-auto", "batched-g0"), metavar=("A", "B"),
                    help="the engines to compare (default batched-auto batched-g0)")
    ap.add_argument("--drafted", type=int, default=20, help="split blocks at this many drafted tokens (default 20)")
    args = ap.parse_args(argv)
    a, b = args.engines
    for path in args.results:
        results = json.loads(path.read_text())
        print(f"{path.name} (git {results.get('git', '?')})\n")
        print(f"| blocks | n | aggregate tok/s, {a} / {b} | mean completion time, {b} / {a} |")
        print("|---|---|---|---|")
        print("\n".join(rows(results, a, b, args.drafted)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
