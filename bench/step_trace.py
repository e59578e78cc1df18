"""Summarise a BatchedDecoder's step records: the planner's predictions
against what its steps did.

    python -m bench.serving --ks 4 --engines batched-auto --repeats 2 --trace-steps steps.jsonl \
        --output scratch.json --results-md scratch.md    # leave the recorded sweep alone
    python -m bench.step_trace steps.jsonl            # every batch size
    python -m bench.step_trace steps.jsonl --batch 4

Per batch size (steps whose requests all decode, no prompt rows in the pass):

- plain steps: the rate their plans predicted and the rate they reached;
- the rate plain batching was predicted to reach *at the drafting steps*
  (the comparison each drafting decision was made on), beside the rate plain
  steps really reached in the same file;
- drafting steps, by their draft rows: the gain over plain batching the
  plan predicted (planned / predicted plain rate) and the gain they realised
  (their tokens over their time, against the plain steps' realised rate);
- the draft's catch-up passes: their time, in tokens plain steps would have
  emitted meanwhile, against the tokens drafting steps gained over plain;
  and each catch-up's judged gain beside the drafting steps that followed it
  (a catch-up pays only over the stretch of drafting it enables).

Medians over steps, and ratios of sums for rates; no time is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence


def load(path: Path) -> List[Dict[str, Any]]:
    """The step records of a --trace-steps file."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _rate(steps: Sequence[Dict[str, Any]]) -> float:
    """Tokens per second over the steps (a ratio of sums)."""
    seconds = sum(s["seconds"] for s in steps)
    return sum(s["emitted"] for s in steps) / seconds if seconds > 0 else float("nan")


def _catch_up_ms(step: Dict[str, Any]) -> float:
    """The time of the step's draft passes spent on its catch-up rows (the
    first pass carries them beside the drafts at depth 0, pro rata)."""
    if not step["catch_up_rows"] or not step["draft_passes"]:
        return 0.0
    rows, ms, _ = step["draft_passes"][0]
    if not any(step["gammas"]):  # a step that only caught up: all its draft time
        return sum(p[1] for p in step["draft_passes"])
    return ms * step["catch_up_rows"] / max(rows, 1)


def summarise(steps: Sequence[Dict[str, Any]], batch: Optional[int] = None) -> List[str]:
    by_batch: Dict[int, List[Dict[str, Any]]] = defaultdict(list)
    for s in steps:
        if s["gammas"] and not s["prompt_rows"]:
            by_batch[len(s["gammas"])].append(s)
    out = []
    for n in sorted(by_batch):
        if batch is not None and n != batch:
            continue
        group = by_batch[n]
        plain = [s for s in group if not any(s["gammas"]) and not s["catch_up_rows"]]
        drafting = [s for s in group if any(s["gammas"]) and not s["catch_up_rows"]]
        out.append(f"batch {n}: {len(plain)} plain steps, {len(drafting)} drafting steps "
                   f"(+{sum(1 for s in group if s['catch_up_rows'])} with a catch-up)")
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
        caught = [s for s in group if s["catch_up_rows"]]
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
    """(judged gain, drafting steps before the first step that did not draft)
    for every catch-up of a decoding batch of ``batch`` requests (records of
    one run only; a gain of 0 where the file predates it)."""
    out = []
    for i, s in enumerate(steps):
        if not s["catch_up_rows"] or s["prompt_rows"] or len(s["gammas"]) != batch:
            continue
        run = (s.get("k"), s.get("run"))
        k = 0
        for t in steps[i + 1:]:
            if (t.get("k"), t.get("run")) != run or not any(t["gammas"]):
                break
            k += 1
        out.append((s.get("catch_up_gain", 0.0), k))
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.step_trace", description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path, help="a file written by python -m bench.serving --trace-steps")
    ap.add_argument("--batch", type=int, default=None, help="only this batch size")
    args = ap.parse_args(argv)
    print("\n".join(summarise(load(args.trace), args.batch)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
