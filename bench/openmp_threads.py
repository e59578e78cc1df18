"""What a thread that ran a llama.cpp pass and lives on costs every other pass.

    python -m bench.openmp_threads [--blocks 4] [--tokens 128] [--threads 2]

llama.cpp built with OpenMP runs a pass on the calling thread plus libgomp
workers, one pool per calling thread, kept while that thread lives; past
as many pool threads as CPUs libgomp makes every waiting thread sleep at
the barriers between a pass's operations (docs/architecture.md §4).  This
measures one ``BatchedDecoder`` (F32 target, Q4_0 draft) decoding one
request of ``--tokens`` tokens at T = 1 (end-of-generation banned, so
every run is that long), γ = 0 and γ = auto, in two conditions:

- **held**: another thread has run one pass of the draft model (2 threads)
  and lives on, holding its worker, as a first-use calibration on the main
  thread or a second decoder's idle scheduler did before the release;
- **released**: the same thread has called ``engine.release_threads()``,
  as every decoder now does when it stops decoding.

Each block runs all four (condition, γ) cells, in an order that rotates
from block to block.  Printed: tokens/s per cell (median over blocks), the
held / released ratio per block (median, bootstrap 95% interval), and the
machine's context switches per second during the runs (/proc/stat).
Nothing is asserted; record results in bench/RESULTS.md with the command.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import threading
import time
from typing import Dict, List

from .common import bootstrap_ci
from .suite import F32, Q4_0, SETTINGS

PROMPT = "Write a long story about a lighthouse keeper and a storm."


def _context_switches() -> int:
    with open("/proc/stat", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("ctxt "))


class Holder:
    """A thread that runs one pass of a model and then lives on, holding its
    OpenMP workers until told to release them."""

    def __init__(self, weights, threads: int) -> None:
        from specdec_cpu.engine import LlamaContext

        self.ctx = LlamaContext(weights, n_ctx=256, n_batch=32, n_threads=threads)
        self._orders: "list[str]" = []
        self._cv = threading.Condition()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from specdec_cpu.engine import release_threads

        while True:
            with self._cv:
                while not self._orders:
                    self._cv.wait()
                order = self._orders.pop(0)
            if order == "hold":
                self.ctx.truncate(0)
                self.ctx.eval([1, 2, 3, 4], 1)
            elif order == "release":
                release_threads()
            else:
                self._done.set()
                return
            self._done.set()

    def do(self, order: str) -> None:
        self._done.clear()
        with self._cv:
            self._orders.append(order)
            self._cv.notify()
        self._done.wait()

    def close(self) -> None:
        self.do("stop")
        self._thread.join()
        self.ctx.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    from specdec_cpu import BatchedDecoder
    from specdec_cpu.demo_models import ensure_model
    from specdec_cpu.engine import LlamaWeights

    target, draft = str(ensure_model(F32)), str(ensure_model(Q4_0))
    params = dataclasses.replace(SETTINGS["t1"].params(7), ignore_eos=True)
    decs = {g: BatchedDecoder.from_gguf(target, draft, max_sequences=1, n_threads=args.threads, gamma=g)
            for g in (0, "auto")}
    weights = LlamaWeights(draft)
    holder = Holder(weights, args.threads)
    cells = [(c, g) for c in ("held", "released") for g in (0, "auto")]
    tps: Dict[tuple, List[float]] = {cell: [] for cell in cells}
    switches: Dict[str, List[float]] = {"held": [], "released": []}
    try:
        for d in decs.values():  # warm: the first pass of a context pays its allocations
            d.generate(PROMPT, max_tokens=8, params=params)
        for block in range(args.blocks):
            order = cells[block % len(cells):] + cells[:block % len(cells)]
            for cond, g in order:
                holder.do("hold" if cond == "held" else "release")
                c0, t0 = _context_switches(), time.perf_counter()
                out = decs[g].generate(f"{PROMPT} ({block})", max_tokens=args.tokens, params=params)
                dt = time.perf_counter() - t0
                tps[(cond, g)].append(len(out.tokens) / dt)
                switches[cond].append((_context_switches() - c0) / dt)
                print(f"block {block + 1}: {cond:8s} γ={g!s:4s} {tps[(cond, g)][-1]:5.1f} tok/s",
                      file=sys.stderr, flush=True)
    finally:
        holder.close()
        weights.close()
        for d in decs.values():
            d.close()

    print(f"\n{args.blocks} blocks, {args.tokens} tokens per run, {args.threads} threads, T = 1\n")
    print("| γ | released tok/s | held tok/s | held / released [95% interval] |")
    print("|---|---|---|---|")
    for g in (0, "auto"):
        ratios = [h / r for h, r in zip(tps[("held", g)], tps[("released", g)])]
        ci = bootstrap_ci(ratios)
        print(f"| {g} | {statistics.median(tps[('released', g)]):.1f} | {statistics.median(tps[('held', g)]):.1f} "
              f"| {statistics.median(ratios):.2f}×" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "") + " |")
    print(f"\ncontext switches per second (machine): released {statistics.median(switches['released']):,.0f}, "
          f"held {statistics.median(switches['held']):,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
