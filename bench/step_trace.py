"""Summarise a BatchedDecoder's step records: the planner's predictions against what its steps did.

    python -m bench.serving --ks 4 --engines batched-auto --repeats 2 --trace-steps steps.jsonl \
        --output scratch.json --results-md scratch.md    # leave the recorded sweep alone
    python -m bench.step_trace steps.jsonl            # every batch size
    python -m bench.step_trace steps.jsonl --batch 4

Per batch size, over steps whose requests all decode: the plain steps' planned and realised rates; the plain
rate predicted at the drafting steps (what each drafting decision was weighed against); per draft-row count, the
predicted and realised gain over plain; and the draft's catch-ups, their cost in plain-rate tokens against what
drafting gained, each beside the stretch of drafting steps it enabled.  Medians over steps, ratios of sums for
rates.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence


def _rate(steps: Sequence[Dict[str, Any]]) -> float:
    """Tokens per second over the steps (a ratio of sums)."""
    seconds = sum(s["seconds"] for s in steps)
    return sum(s["emitted"] for s in steps) / seconds if seconds > 0 else float("nan")


def _catch_up_ms(step: Dict[str, Any]) -> float:
    """The step's draft time spent on catch-up rows (the first pass carries them beside depth-0 drafts: pro rata)."""
    if not step["catch_up_rows"] or not step["draft_passes"]:
        return 0.0
    rows, ms, _ = step["draft_passes"][0]
    if not any(step["gammas"]):  # a step that only caught up: all its draft time
        return sum(p[1] for p in step["draft_passes"])
    return ms * step["catch_up_rows"] / max(rows, 1)


def summarise(steps: Sequence[Dict[str, Any]], batch: Optional[int] = None) -> List[str]:
    """The report's lines, per batch size (only ``batch`` if given), over steps whose requests all decode."""
    by_batch: Dict[int, List[Dict[str, Any]]] = defaultdict(list)
    for s in steps:
        if s["gammas"] and not s["prompt_rows"] and batch in (None, len(s["gammas"])):
            by_batch[len(s["gammas"])].append(s)
    out = []
    for n in sorted(by_batch):
        group = by_batch[n]
        caught = [s for s in group if s["catch_up_rows"]]
        plain = [s for s in group if not any(s["gammas"]) and not s["catch_up_rows"]]
        drafting = [s for s in group if any(s["gammas"]) and not s["catch_up_rows"]]
        out.append(f"batch {n}: {len(plain)} plain steps, {len(drafting)} drafting steps "
                   f"(+{len(caught)} with a catch-up)")
        if not plain:
            continue
        plain_real = _rate(plain)
        planned = statistics.median(1000 * s["planned_rate"] for s in plain)
        out.append(f"  plain steps: planned {planned:.1f} tok/s (median), realised {plain_real:.1f} tok/s")
        if not drafting:
            continue
        at_drafting = statistics.median(1000 * s["plain_rate"] for s in drafting)
        out.append(f"  plain batching as predicted at the drafting steps: {at_drafting:.1f} tok/s "
                   f"({at_drafting / plain_real:.2f}× what plain steps realised)")
        by_rows: Dict[int, List[Dict[str, Any]]] = defaultdict(list)
        for s in drafting:
            by_rows[sum(s["gammas"])].append(s)
        out.append("  draft rows | steps | predicted gain (median) | realised gain | acceptance (accepted/drafted)")
        for rows in sorted(by_rows):
            ss = by_rows[rows]
            predicted = statistics.median(s["planned_rate"] / s["plain_rate"] for s in ss if s["plain_rate"] > 0)
            accepted = sum(sum(s["accepted"]) for s in ss) / (rows * len(ss))
            out.append(f"  {rows:10d} | {len(ss):5d} | {predicted:23.2f} | {_rate(ss) / plain_real:13.2f} | "
                       f"{accepted:.2f}")
        gained = sum(s["emitted"] - s["seconds"] * plain_real for s in drafting)
        cost = sum(_catch_up_ms(s) for s in caught) / 1000 * plain_real
        gained += sum(s["emitted"] - (s["seconds"] - _catch_up_ms(s) / 1000) * plain_real
                      for s in caught if any(s["gammas"]))
        out.append(f"  drafting gained {gained:+.1f} tokens over plain steps' rate; the draft's catch-ups "
                   f"({sum(s['catch_up_rows'] for s in caught)} rows) took the time of {cost:.1f} tokens")
        stretches = _stretches_after_catch_ups(steps, n)
        if stretches:
            out.append("  catch-ups (judged gain: drafting steps that followed): "
                       + ", ".join(f"{g:.2f}: {k}" if g else f"–: {k}" for g, k in stretches))
    return out


def _stretches_after_catch_ups(steps: Sequence[Dict[str, Any]], batch: int) -> List[tuple]:
    """(judged gain, drafting steps of the same run that followed) for every catch-up of a ``batch``-request step."""
    out = []
    for i, s in enumerate(steps):
        if not s["catch_up_rows"] or s["prompt_rows"] or len(s["gammas"]) != batch:
            continue
        k = 0
        for t in steps[i + 1:]:
            if (t["k"], t["run"]) != (s["k"], s["run"]) or not any(t["gammas"]):
                break
            k += 1
        out.append((s["catch_up_gain"], k))
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.step_trace", description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path, help="a file written by python -m bench.serving --trace-steps")
    ap.add_argument("--batch", type=int, default=None, help="only this batch size")
    args = ap.parse_args(argv)
    steps = [json.loads(line) for line in args.trace.read_text().splitlines() if line.strip()]
    print("\n".join(summarise(steps, args.batch)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
