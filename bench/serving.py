"""Serving benchmark: K concurrent streams, ours against llama-server.

    python -m bench.serving                       # the full sweep (see --help for its size)
    python -m bench.serving --quick               # minutes: K = 1, 4, T = 1, one block
    python -m bench.serving --http                # through HTTP: ours, llama-server, llama-cpp-python's server
    python -m bench.serving --http --engines ours,ours-baseline,server-plain,server-md4 --baseline-python PATH
                                                  # this checkout against the previous main (bench/results/ab/)
    python -m bench.serving --prompts suite ...   # the suite's five prompts (up to 400 tokens) instead of short chats
    python -m bench.serving --ray                 # Ray Serve, 1 and 2 replicas of 1 thread
    python -m bench.serving --report-only bench/results/serving/serving_results.json

For each K (concurrent streams) every engine is loaded for K streams and, block after block, serves the same
K chat requests (tagged unique to their block, so that no earlier block's prompt cache answers them; ``ignore_eos``
unless ``--until-eos``) in an order rotated every block, so that a change of machine load hits all engines alike.
Arrivals are "burst" (all K at once) or "staggered" (one every ``--stagger`` seconds).  What is measured is said
in the section of bench/RESULTS.md it writes (``render``); nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from .common import (
    AB_RESULTS_MD,
    BASELINE_PYTHON_ENV,
    RESULTS_MD,
    CpuMeter,
    baseline_python,
    baseline_versions,
    bootstrap_ci,
    fmt,
    link,
    machine_info,
    median,
    notes_of,
    pair_tokenizer,
    ratio_text,
    redact_baseline,
    redact_calibration,
    results_dir,
    rotated,
    say,
    versions,
    write_section,
)
from .engines.base import Engine, Request
from .engines.llama_cpp_python import LcpServer
from .engines.llama_server import LlamaServer
from .engines.ours_batched import OpenAIServer, OursBatched
from .engines.ours_single import OursSingle
from .prompts import PROMPTS
from .suite import F32, Q4_0, SETTINGS, Setting

SERVING = results_dir("serving")
#: The RESULTS.md section and plot of each mode (direct engines, through HTTP, through Ray).
MODES = {
    "direct": ("## Serving", "plot_serving.png"),
    "http": ("## Serving over HTTP", "plot_serving_http.png"),
    "ray": ("## Serving with Ray", "plot_serving_ray.png"),
}


def section_of(results) -> tuple[str, str]:
    """The RESULTS.md heading and plot file of a run: one per mode, and its own for an HTTP A/B run or one that
    leaves a core spare (fewer threads than cores: the server and the clients no longer preempt llama.cpp)."""
    mode = results["mode"]
    heading, plot_file = MODES[mode]
    if results.get("prompts") == "suite":
        heading, plot_file = f"{heading}, the suite's prompts", plot_file.replace(".png", "_suite.png")
    if mode == "http" and AB_ENGINE in results["engines"]:
        return f"{heading}, this checkout against the previous main", plot_file.replace(".png", "_ab.png")
    if mode == "http" and _spare_cores(results):
        t = results["threads"]
        return (f"{heading}, {t} thread{'s' if t > 1 else ''} (a core to spare)",
                plot_file.replace(".png", f"_t{t}.png"))
    return heading, plot_file


def _spare_cores(results) -> bool:
    cores = results.get("machine", {}).get("cores")
    return bool(cores) and results["threads"] < cores


#: ids the "-cut" engines' draft keeps: the first 98,304 of Qwen2.5's 151,936 and its control tokens
#: (bench/HISTORY.md, "A draft cut to its common vocabulary")
DRAFT_VOCAB = 98304

#: One user message per stream (K ≤ 8 take the first K): short chat requests
#: of different kinds, each asking for a long enough answer.
USER_PROMPTS = (
    "Write a Python function that merges two sorted lists into one sorted list, with a docstring and comments.",
    "Explain how a hash table works and what happens when two keys collide.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List ten practical tips for writing clean, maintainable code, with one sentence on each.",
    "Write a SQL query that finds the five customers with the highest total order value, and explain it.",
    "Describe the differences between TCP and UDP and when to use each.",
    "Write a bash script that backs up a directory into a dated tar.gz archive and keeps the last seven.",
    "Explain what a closure is in JavaScript with two small examples.",
)


AB_ENGINE = "ours-baseline"
ENGINES: Dict[str, Callable[[], Engine]] = {
    "batched-auto": lambda: OursBatched("auto"),
    "batched-g0": lambda: OursBatched(0),
    # the draft cut to its common vocabulary (engine/vocab_cut.py): cheaper draft passes
    "batched-auto-cut": lambda: OursBatched("auto", DRAFT_VOCAB),
    # every request at one fixed γ: the best of them bounds what a choice of one γ for all could reach
    **{f"batched-g{g}": (lambda g=g: OursBatched(g)) for g in range(1, 13)},
    "single-auto": OursSingle,
    "server-plain": lambda: LlamaServer(None),
    "server-md4": lambda: LlamaServer(4),
    "server-md8": lambda: LlamaServer(8),
    # --http: the same decoder behind our HTTP server, and llama-cpp-python's server
    "http-batched-auto": lambda: OpenAIServer("http-batched-auto", "ours over HTTP (specdec-cpu serve, openai client)",
                                              "ours"),
    "ours": lambda: ENGINES["http-batched-auto"](),  # the same engine, by a shorter name
    # the same server under the previous main's Python (--baseline-python): this checkout against it
    AB_ENGINE: lambda: OpenAIServer(AB_ENGINE, "the previous main over HTTP (its specdec-cpu serve, openai client)",
                                    "ours", python=os.environ[BASELINE_PYTHON_ENV]),
    "lcp-server": LcpServer,
    # --ray: one thread per replica
    "bare-t1": lambda: OpenAIServer("bare-t1", "ours over HTTP, 1 thread (no Ray)", "ours", threads=1),
    "ray-1": lambda: OpenAIServer("ray-1", "ours through Ray Serve, 1 replica × 1 thread", "ours", replicas=1,
                                  threads=1),
    "ray-2": lambda: OpenAIServer("ray-2", "ours through Ray Serve, 2 replicas × 1 thread", "ours", replicas=2,
                                  threads=1),
}
DEFAULT_ENGINES = ("batched-auto", "batched-g0", "single-auto", "server-plain", "server-md4", "server-md8")
HTTP_ENGINES = ("batched-auto", "http-batched-auto", "server-plain", "server-md4", "lcp-server")
RAY_ENGINES = ("bare-t1", "ray-1", "ray-2")


# a run: K clients against one engine ----------------------------------------


def run_once(engine: Engine, prompts: Sequence[str], setting: Setting, max_tokens: int, arrival: str,
             stagger: float, seed: int, ignore_eos: bool = False) -> Dict[str, Any]:
    """K client threads (one per prompt), started together or staggered."""
    recs = [Request(stream=i, sent=0.0) for i in range(len(prompts))]
    barrier = threading.Barrier(len(prompts) + 1)
    t0_box: List[float] = []

    def client(i: int) -> None:
        barrier.wait()
        t0 = t0_box[0]
        if arrival == "staggered":
            time.sleep(max(0.0, t0 + i * stagger - time.perf_counter()))
        rec = recs[i]
        rec.sent = time.perf_counter() - t0
        try:
            engine.request(prompts[i], setting, max_tokens, seed + i, rec, t0, ignore_eos)
        except Exception as exc:  # recorded: a failed request is a result too
            rec.error = f"{type(exc).__name__}: {exc}"
        rec.done = time.perf_counter() - t0

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(len(prompts))]
    for t in threads:
        t.start()
    engine.mark()
    meter = CpuMeter()
    cpu0 = time.process_time()
    t0_box.append(time.perf_counter())
    barrier.wait()
    for t in threads:
        t.join()
    client_cpu = time.process_time() - cpu0  # the clients' (a server engine's decoder is elsewhere)
    ok = [r for r in recs if r.error is None]
    wall = max((r.done for r in ok), default=0.0) - min((r.sent for r in ok), default=0.0)
    tokens = sum(r.tokens for r in ok)
    gaps = [g for r in ok for g in r.gaps()]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    return {
        "engine": engine.id, "tokens": tokens, "wall_s": wall,
        "agg_tps": tokens / wall if wall > 0 and ok else None,
        "ttft_p50": _pct(ttfts, 50), "ttft_p95": _pct(ttfts, 95),
        "itl_p50": _pct(gaps, 50), "itl_p95": _pct(gaps, 95),
        "tpot_median": statistics.median([(r.done - r.sent - r.ttft) / max(r.tokens - 1, 1)
                                          for r in ok if r.ttft is not None]) if ok else None,
        "errors": [r.error for r in recs if r.error],
        "requests": [asdict(r) | {"arrivals": None} for r in recs],
        "others_cpu": meter.others(),
        "client_cpu_s": client_cpu,
        "stats": engine.stats(),
    }


def _pct(xs: Sequence[float], q: float) -> Optional[float]:
    """The ``q``-th percentile of ``xs`` (nearest rank), None for none."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(math.ceil(q / 100.0 * len(s))) - 1))]


def chat_prompts(k: int, tag: str, kind: str = "chat", block: int = 0) -> List[str]:
    """The K templated prompts of one block (each tagged, see the module docstring): the first K
    short chats (``kind`` "chat"), or the suite's prompts of bench/prompts.py ("suite") from the
    ``block``-th on, so that K = 1 meets every one in turn."""
    users, first = ([p.user for p in PROMPTS], block) if kind == "suite" else (USER_PROMPTS, 0)
    return [pair_tokenizer().chat_prompt([{"role": "user",
                                           "content": f"(request {tag}.{i}) {users[(first + i) % len(users)]}"}])
            for i in range(k)]


# the sweep ------------------------------------------------------------------


def sweep(args: argparse.Namespace) -> Dict[str, Any]:
    """Every K, block and engine of ``args``; the results are saved to ``args.output`` after every block."""
    results: Dict[str, Any] = {
        "command": args.command, "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": machine_info(args.threads), "git": versions(None).get("specdec_cpu_git"),
        "tokens": args.tokens, "ignore_eos": not args.until_eos, "stagger_s": args.stagger, "threads": args.threads,
        "mode": "http" if args.http else "ray" if args.ray else "direct", "output": args.output.name,
        "prompts": args.prompts, "engines": {}, "runs": [],
    }
    if AB_ENGINE in args.engines:
        results["baseline_versions"] = baseline_versions(os.environ[BASELINE_PYTHON_ENV])
    block = 0
    for k in args.ks:
        engines = [ENGINES[e]() for e in args.engines if not (e == "single-auto" and k != 1)]
        for e in engines:
            results["engines"][e.id] = e.label
            if args.trace_steps is not None and e.id == "batched-auto":
                e.trace_path = args.trace_steps
        started = []

        def load(e: Engine) -> None:
            say(f"K={k}: loading {e.label}")
            started.append(e)
            e.start(k, args.threads)
            e.request(chat_prompts(1, f"warm{k}")[0], SETTINGS["t1"], 8, 1, Request(0, 0.0), time.perf_counter())
            e.stats()

        try:
            for e in engines:
                if not e.alone:
                    load(e)
                if "calibration" not in results and isinstance(e, OursBatched) and e.dec.cost_model is not None:
                    # the pass times the planner started from: the report's forecast column
                    # (the model files by name only: where they lie is the machine's business)
                    results["calibration"] = redact_calibration(e.dec.cost_model.to_dict())
            for rep, sid, arrival in itertools.product(range(args.repeats), args.settings, args.arrivals):
                if arrival == "staggered" and k == 1:
                    continue
                block += 1
                prompts = chat_prompts(k, f"{block}", args.prompts, block)
                for e in rotated(engines, block):
                    if e.alone:
                        load(e)
                    run = run_once(e, prompts, SETTINGS[sid], args.tokens, arrival, args.stagger,
                                   seed=1000 * block, ignore_eos=not args.until_eos)
                    if e.alone:
                        e.stop()
                        started.remove(e)
                    run.update(k=k, setting=sid, arrival=arrival, block=block, repeat=rep)
                    results["runs"].append(run)
                    say(f"K={k} {sid} {arrival} block {block}: {e.id:13s} "
                        f"{fmt(run['agg_tps'])} tok/s, TTFT p50 {fmt(run['ttft_p50'], 2)} s"
                        + (f"  ERRORS {run['errors'][:1]}" if run["errors"] else ""))
                _save(results, args.output)
        finally:
            for e in started:
                e.stop()
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    _save(results, args.output)
    return results


def _save(results: Dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1))


# report ----------------------------------------------------------------------


def _runs(results, **match) -> List[Dict[str, Any]]:
    return [r for r in results["runs"] if all(r.get(k) == v for k, v in match.items())]


def _axes(results) -> tuple[List[int], List[str], List[str]]:
    """The K, settings and arrivals a sweep ran, in table order."""
    runs = results["runs"]
    return (sorted({r["k"] for r in runs}), [s for s in SETTINGS if any(r["setting"] == s for r in runs)],
            [a for a in ("burst", "staggered") if any(r["arrival"] == a for r in runs)])


def _goal_table(results, heading: str, engine: str, columns: Sequence[str],
                cells: Callable[[Dict[str, Any]], Optional[Sequence[str]]]) -> List[str]:
    """A "### heading" table with a row for every setting, arrivals and K where ``engine`` ran: its
    ``columns`` hold ``cells(match)`` (``match`` selects the row's runs; None leaves the row out)."""
    L = [f"### {heading}", "", "| setting | arrivals | K | " + " | ".join(columns) + " |",
         "|---" * (3 + len(columns)) + "|"]
    ks, settings, arrivals = _axes(results)
    for sid, arrival, k in itertools.product(settings, arrivals, ks):
        m = dict(k=k, setting=sid, arrival=arrival)
        if _runs(results, engine=engine, **m) and (row := cells(m)) is not None:
            L.append(f"| {SETTINGS[sid].label} | {arrival} | {k} | " + " | ".join(row) + " |")
    return L


def paired_runs(results, a: str, b: str, key: str = "agg_tps", **match) -> List[tuple[Dict[str, Any], ...]]:
    """(run of a, run of b) for every block where both ran with a ``key`` (by default: emitted tokens)."""
    by_block: Dict[int, Dict[str, Dict[str, Any]]] = {}
    for r in _runs(results, **match):
        if r[key]:
            by_block.setdefault(r["block"], {})[r["engine"]] = r
    return [(d[a], d[b]) for d in by_block.values() if a in d and b in d]


def block_ratios(results, a: str, b: str, **match) -> List[float]:
    """agg_tps(a) / agg_tps(b) for every block where both ran."""
    return [x["agg_tps"] / y["agg_tps"] for x, y in paired_runs(results, a, b, **match)]


def _ratio(results, a: str, b: str, **match) -> str:
    """``block_ratios`` as a table cell."""
    return ratio_text(block_ratios(results, a, b, **match))


def best_server(results, **match) -> Optional[str]:
    """The faster llama-server mode (median aggregate tok/s) for these runs."""
    tps = {e: [r["agg_tps"] for r in _runs(results, engine=e, **match) if r["agg_tps"]]
           for e in results["engines"] if e.startswith("server-")}
    medians = {e: statistics.median(v) for e, v in tps.items() if v}
    return max(medians, key=medians.__getitem__) if medians else None


def _vs_server(results, engine: str, **match) -> str:
    """``engine`` / the faster llama-server mode, as a table cell naming that mode."""
    srv = best_server(results, **match)
    return f"{_ratio(results, engine, srv, **match)} (vs {srv})" if srv else "–"


def render(results, data_dir: Path = SERVING, results_md: Path = RESULTS_MD) -> str:
    """The section of one sweep; ``data_dir`` holds its results file and plot."""
    mode = results["mode"]
    section, plot_file = section_of(results)
    ks, settings, arrivals = _axes(results)
    bv = results.get("baseline_versions")
    L = [section, "",
         "Generated by `python -m bench.serving`; every number comes from the run described here "
         f"(every request is in [{results['output']}]({link(data_dir / results['output'], results_md)})).", "",
         "```", results["command"], "```", "",
         f"- Run: {results['started']} → {results.get('finished', '(unfinished)')}"
         + (f" (code at git {results['git']})" if results.get("git") else "")
         + (f"; `{AB_ENGINE}`: the previous main, specdec-cpu {bv.get('specdec_cpu')} at git "
            f"{bv.get('specdec_cpu_git', '?')}, the same server command under its own Python"
            if bv else "") + "; "
         f"machine: {results['machine'].get('cpu')}, {results['machine'].get('cores')} cores, "
         f"{results['threads']} thread{'s' if results['threads'] != 1 else ''} for every engine"
         + (" (DecoderPool(K): max(1, threads // K) per decoder, its documented setting)"
            if "pool-auto" in results["engines"] else "") + ".",
         "- Workload: F32 target / Q4_0 draft (Qwen2.5-Coder-0.5B-Instruct); K concurrent streams with "
         + ("the suite's five prompts of bench/prompts.py (code-write, code-edit, chat, summary, doc-qa: 30 to "
            "400 tokens, rotated from block to block)" if results.get("prompts") == "suite" else
            "different chat prompts")
         + " (a tag unique to each block defeats prompt caches across blocks), "
         f"{results['tokens']} new tokens each"
         + (" (end-of-generation tokens banned, `ignore_eos`, in every engine: every stream is that long, so "
            "every engine does the same work; a stream ending early at a random length would change the batch "
            "the others share. Past where the model would have ended, its text is often repetitive, which "
            "drafts predict well: acceptance is higher than in answers that end by themselves)"
            if results.get("ignore_eos") else
            " at most (a stream ends at an end-of-generation token; streams' lengths differ between engines)")
         + f"; arrivals `burst` (all at once) or `staggered` (one every {results['stagger_s']} s).",
         "- Aggregate tok/s: all tokens generated / (last request finished − first sent), prompt "
         "processing included. TTFT: request sent → first text piece. ITL: gaps between successive "
         "pieces of a request (a piece is one token, or several when a multi-byte character spans "
         "tokens; speculation delivers tokens in bursts, so ITL p50 can be ~0 while p95 shows the "
         "step time" + ("; through `specdec-cpu serve` a piece is one server-sent event, all of a step's "
                        "tokens, so its ITL is the step time" if mode == "http" else "")
         + "). Ratios: median of per-block ratios [bootstrap 95% interval over blocks].",
         "- Engines: " + "; ".join(f"`{e}` {lab}" for e, lab in results["engines"].items()) + ".", ""]
    for sid, arrival in itertools.product(settings, arrivals):
        m = dict(setting=sid, arrival=arrival)
        rows = [(k, e, runs) for k in ks for e in results["engines"] if (runs := _runs(results, k=k, engine=e, **m))]
        if not rows:
            continue
        L += [f"### {SETTINGS[sid].label}, {arrival} arrivals", "",
              "| K | engine | agg tok/s min – **median** – max | TTFT p50 / p95 s | ITL p50 / p95 ms "
              "| tokens/pass | rows/pass | acceptance | × batched γ=0 |",
              "|---|---|---|---|---|---|---|---|---|"]
        for k, e, rs in rows:
            tps = sorted(r["agg_tps"] for r in rs if r["agg_tps"])
            med = lambda key: median([r.get(key) for r in rs])  # noqa: E731
            st = lambda key: median([r["stats"].get(key) for r in rs if r.get("stats")])  # noqa: E731
            cells = [f"{tps[0]:.1f} – **{statistics.median(tps):.1f}** – {tps[-1]:.1f}" if tps else "failed",
                     f"{fmt(med('ttft_p50'), 2)} / {fmt(med('ttft_p95'), 2)}",
                     f"{fmt(_ms(med('itl_p50')), 0)} / {fmt(_ms(med('itl_p95')), 0)}",
                     fmt(st("tokens_per_pass"), 2), fmt(st("rows_per_pass"), 1), fmt(st("acceptance"), 2),
                     "1.00×" if e == "batched-g0" else _ratio(results, e, "batched-g0", k=k, **m)]
            L.append(f"| {k} | {e} | " + " | ".join(cells) + " |")
        L.append("")
    if mode == "direct":
        L += goals(results) + where_time_goes(results)
    elif mode == "http":
        L += ab_goals(results) if AB_ENGINE in results["engines"] else http_goals(results)
    else:
        L += ray_goals(results)
    L += [f"![Aggregate tokens/s against K]({link(data_dir / plot_file, results_md)})", "",
          *notes_of(data_dir / results["output"])]
    return "\n".join(L)


def goals(results) -> List[str]:
    """The batched-decoding issue's goals: auto against the faster llama-server mode, γ=0 and the others."""
    from specdec_cpu.planning.forecast import forecast

    model = _calibration(results)

    def cells(m: Dict[str, Any]) -> List[str]:
        alpha = _pair_alpha(results, m["setting"])
        srv = best_server(results, **m)
        srv_vs0 = block_ratios(results, srv, "batched-g0", **m) if srv else []
        gain = forecast(model, alpha, [m["k"]])[0].gain if model is not None and alpha is not None else None
        return [_vs_server(results, "batched-auto", **m), _ratio(results, "batched-auto", "batched-g0", **m),
                f"{1.2 * statistics.median(srv_vs0):.2f}×" if srv_vs0 else "–",
                f"{gain:.2f}× (α {alpha:.2f})" if gain is not None else "–",
                _ratio(results, "batched-auto", "pool-auto", **m),
                _ratio(results, "batched-auto", "single-auto", **m) if m["k"] == 1 else "–",
                str(sum((r.get("stats") or {}).get("drafted") or 0
                        for r in _runs(results, engine="batched-auto", **m)))]

    L = _goal_table(results, "Goals (median of per-block ratios [95% interval])", "batched-auto",
                    ["auto / faster llama-server mode", "auto / batched γ=0", "auto / γ=0 that 1.2× the server needs",
                     "auto / γ=0 forecast", "auto / DecoderPool(K)", "auto / SpeculativeDecoder",
                     "tokens auto drafted"], cells)
    L += ["", "Goals of the batched-decoding issue: at every K, auto ≥ 1.2× the faster llama-server mode and "
          "≥ 0.97× batched γ=0; at K = 4, ≥ 2.4× DecoderPool(4); at K = 1, ≥ 0.97× SpeculativeDecoder.", "",
          "Where auto drafted no token (all runs of a row), it ran the same passes as γ=0: the planner "
          "found no draft that pays at that K, and the two's ratio is run-to-run noise between identical "
          "work. `specdec-cpu plan --calibration FILE --users 1,2,4,8` prints the planner's predicted gain "
          "over continuous batching for each K on a machine's measured pass times.", "",
          "\"Needs\": the gain over γ=0 that 1.2× the faster llama-server mode means in this run (1.2 × the "
          "median of that server's per-block ratios to γ=0). \"Forecast\": the gain over γ=0 the batch "
          "planner expects at this K (`specdec_cpu.planning.forecast`) from "
          + ("the pass times this run's decoder was calibrated with" if results.get("calibration")
             else "this machine's stored calibration of the pair") +
          " and the pair's acceptance at this setting (the median of auto's mean α over the runs that "
          "drafted, every K). The calibration times passes with a short cache, so the forecast is "
          "optimistic for 128-token answers, whose passes cost more: where \"needs\" is above it, the goal "
          "asks for more than drafting can add on this machine.", ""]
    return L


def _calibration(results) -> Optional[Any]:
    """The pair's CostModel: stored by the run, else this machine's cached
    calibration of the pair (runs recorded before the run stored it), else None."""
    from specdec_cpu.demo_models import model_path
    from specdec_cpu.planning.calibration import cached_calibration
    from specdec_cpu.planning.costmodel import CostModel

    if results.get("calibration"):
        return CostModel.from_dict(results["calibration"])
    target, draft = model_path(F32), model_path(Q4_0)
    if not (target.is_file() and draft.is_file()):
        return None
    model = cached_calibration(str(target), str(draft), results["threads"])
    return model if model is not None and model.draft_batch_ms else None


def _pair_alpha(results, setting: str) -> Optional[float]:
    """The median of auto's mean α over its runs at ``setting`` that drafted."""
    alphas = [r["stats"]["mean_alpha"] for r in _runs(results, engine="batched-auto", setting=setting)
              if (r.get("stats") or {}).get("mean_alpha") is not None]
    return statistics.median(alphas) if alphas else None


def _ttft_diff_text(results, a: str, b: str, **match) -> str:
    """Per block: median TTFT of a − median TTFT of b; their median in ms and its 95% interval."""
    diffs = [1000.0 * (x["ttft_p50"] - y["ttft_p50"]) for x, y in paired_runs(results, a, b, "ttft_p50", **match)]
    if not diffs:
        return "–"
    ci = bootstrap_ci(diffs)
    return f"{statistics.median(diffs):+.1f} ms" + (f" [{ci[0]:+.1f}, {ci[1]:+.1f}]" if ci else "")


def http_goals(results) -> List[str]:
    """The HTTP layer's cost: ours through `specdec-cpu serve` against BatchedDecoder called directly."""
    ours = "http-batched-auto"
    L = _goal_table(
        results, "The HTTP layer's cost (ours through `specdec-cpu serve` and the openai client, against "
        "BatchedDecoder called directly; medians of per-block values [95% interval])", ours,
        ["aggregate tok/s, HTTP / direct", "TTFT p50, HTTP − direct",
         "HTTP layer's CPU per step, server loop + client", "its share of the run's time",
         "ours over HTTP / llama-server (faster mode)", "ours over HTTP / llama-cpp-python server"],
        lambda m: [_ratio(results, ours, "batched-auto", **m), _ttft_diff_text(results, ours, "batched-auto", **m),
                   _layer_cpu_text(_runs(results, engine=ours, **m)), _vs_server(results, ours, **m),
                   _ratio(results, ours, "lcp-server", **m)])
    L += ["", "Goal of the server issue: the HTTP layer costs under 2% of aggregate throughput (ratio ≥ 0.98) "
          "and adds under 5 ms to time to first token.", "",
          "The layer's CPU (medians over blocks; runs measured before it was recorded show –): the CPU time "
          "of the server's event loop (its main thread, which parses requests and formats every event; "
          "the decoder runs on other threads) plus the benchmark process's (the `openai` clients), per "
          "decoder step and as a share of the run's wall time. llama.cpp's threads keep every core busy "
          "while a pass runs and wait for each other at every operation, so each CPU second the layer "
          "takes from them delays the passes by at most about that much: the share bounds the "
          "throughput the layer can cost, independently of the run-to-run noise of the ratio beside it.",
          "",
          "Both sides use the same decoder, threads and settings; what differs is CPU: over HTTP the "
          "server's event loop formats each step's tokens as a server-sent event and the `openai` client "
          "parses it (a pydantic object per chunk) in the benchmark process"
          + (", on a core llama.cpp's threads leave free." if _spare_cores(results) else
             ", on the same cores as llama.cpp's threads, which stall whenever one of them is preempted "
             "(a run with fewer threads than cores, `--threads 1`, shows the layer's cost on a machine "
             "with a core to spare)."), ""]
    return L


def ab_goals(results) -> List[str]:
    """This checkout's server against the previous main's, and both against the faster llama-server mode."""
    ours = "http-batched-auto"
    L = _goal_table(
        results, "This checkout against the previous main (aggregate tok/s; medians of per-block ratios "
        "[95% interval])", AB_ENGINE,
        ["ours / previous main", "ours / llama-server (faster mode)", "previous main / llama-server (faster mode)",
         "TTFT p50, ours − previous main"],
        lambda m: [_ratio(results, ours, AB_ENGINE, **m), _vs_server(results, ours, **m),
                   _vs_server(results, AB_ENGINE, **m), _ttft_diff_text(results, ours, AB_ENGINE, **m)])
    return L + ["", f"`{ours}` and `{AB_ENGINE}` run the same `specdec-cpu serve` command, threads and "
                "settings, each under its checkout's Python; each server measures the pair's pass times at "
                "first use or reads them from the calibration store both share.", ""]


def _layer_cpu_text(runs: Sequence[Dict[str, Any]]) -> str:
    """Median over runs of the HTTP layer's CPU (server loop + client): ms per step, and share of wall time."""
    rs = [r for r in runs if (r.get("stats") or {}).get("steps") and r.get("client_cpu_s") is not None
          and r.get("wall_s")]
    if not rs:
        return "– | –"
    cpu = [r["stats"]["server_loop_cpu_s"] + r["client_cpu_s"] for r in rs]
    loop = statistics.median(1000.0 * r["stats"]["server_loop_cpu_s"] / r["stats"]["steps"] for r in rs)
    client = statistics.median(1000.0 * r["client_cpu_s"] / r["stats"]["steps"] for r in rs)
    share = statistics.median(c / r["wall_s"] for c, r in zip(cpu, rs))
    return f"{loop:.2f} + {client:.2f} ms | {100.0 * share:.1f}%"


def ray_goals(results) -> List[str]:
    """Ray Serve's scaling from 1 to 2 replicas, and its overhead over the bare server."""
    L = _goal_table(
        results, "Ray Serve: scaling and overhead (1 thread per replica; medians of per-block values "
        "[95% interval])", "ray-1",
        ["2 replicas / 1 replica (aggregate tok/s)", "1 replica / bare server", "TTFT p50, 1 replica − bare server"],
        lambda m: [_ratio(results, "ray-2", "ray-1", **m), _ratio(results, "ray-1", "bare-t1", **m),
                   _ttft_diff_text(results, "ray-1", "bare-t1", **m)])
    ingress = {e: Counter((r.get("stats") or {}).get("ingress") or "not recorded" for r in _runs(results, engine=e))
               for e in ("ray-1", "ray-2")}
    if any(ingress.values()):
        L += ["", "HTTP ingress of each run (each Ray engine runs alone, started before its run and stopped "
              "after): " + "; ".join(f"`{e}` " + ", ".join(f"{v} ×{n}" for v, n in sorted(c.items()))
                                    for e, c in ingress.items() if c) + "."]
    L += ["", "Goals of the Ray issue: Ray adds under 10 ms per request at 1 client; 2 replicas ≥ 1.6× one "
          "replica's aggregate throughput on a machine with cores to spare.", "",
          "On a 2-core machine there are no cores to spare: two 1-thread replicas take both cores, "
          "and Ray's HTTP ingress, its controller, the replicas' event loops and the benchmark's clients "
          "run on the same two cores, preempting llama.cpp's threads (which wait for each other at every "
          "operation of a pass); both replicas also share one memory bus, which bounds a memory-bound "
          "F32 target. The scaling measured here is therefore a floor, not what a machine with a core "
          "per replica thread gives.", ""]
    return L


def where_time_goes(results) -> List[str]:
    """Where BatchedDecoder γ=auto's step time went, and how it batched and drafted."""

    def cells(m: Dict[str, Any]) -> Optional[List[str]]:
        rs = [r for r in _runs(results, engine="batched-auto", **m) if r.get("stats")]
        if not rs:
            return None
        # The scheduler's share is what the step's timers leave over: a hair below 0 is 0.
        shares = [median([r["stats"][key] / r["stats"]["step_s"] for r in rs if r["stats"].get("step_s")])
                  for key in ("target_s", "draft_s", "sampling_s", "scheduler_s")]
        return ["–" if x is None else f"{max(100 * x, 0.0):.0f}%" for x in shares] + [
            fmt(median([r["stats"].get(key) for r in rs]), digits)
            for key, digits in (("rows_per_pass", 1), ("tokens_per_pass", 2), ("drafted", 0), ("mean_alpha", 3))]

    return _goal_table(results, "Where the time goes (ours, BatchedDecoder γ=auto; share of step time, medians "
                       "over runs)", "batched-auto", ["target", "draft", "sampling", "scheduler", "rows/pass",
                                                     "tokens/pass", "drafted tokens/run", "mean α"], cells) + [""]


def _ms(x: Optional[float]) -> Optional[float]:
    return None if x is None else 1000.0 * x


def plot(results, path: Path) -> None:
    """Aggregate tokens/s against K, one panel per setting (burst arrivals), into ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = _axes(results)[1]
    fig, axes = plt.subplots(1, len(settings), figsize=(6 * len(settings), 4.2), squeeze=False)
    for ax, sid in zip(axes[0], settings):
        for e, label in results["engines"].items():
            ks = sorted({r["k"] for r in _runs(results, engine=e, setting=sid, arrival="burst")})
            med = [median([r["agg_tps"] for r in _runs(results, engine=e, setting=sid, arrival="burst", k=k)])
                   for k in ks]
            pts = [(k, m) for k, m in zip(ks, med) if m is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streams K")
        ax.set_ylabel("aggregate tokens/s (median)")
        ax.set_title(f"{SETTINGS[sid].label}, burst arrivals")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# command line ---------------------------------------------------------------


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.serving", description=__doc__.split("\n\n")[0])
    words = lambda s: s.split(",")  # noqa: E731
    ap.add_argument("--ks", type=lambda s: [int(x) for x in words(s)], default=[1, 2, 4, 8],
                    help="concurrent streams (default 1,2,4,8)")
    ap.add_argument("--settings", type=words, default=["t0.7", "t1"], help="sampling settings (default t0.7,t1)")
    ap.add_argument("--arrivals", type=words, default=["burst", "staggered"])
    ap.add_argument("--engines", type=words, default=list(DEFAULT_ENGINES),
                    help=f"engines (default all: {','.join(DEFAULT_ENGINES)})")
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per request (default 128)")
    ap.add_argument("--prompts", choices=["chat", "suite"], default="chat",
                    help="short chat prompts (default), or the suite's five prompts of bench/prompts.py, rotated "
                         "from block to block (up to 400 prompt tokens: a draft that lags a long prompt)")
    ap.add_argument("--until-eos", action="store_true",
                    help="let a request end at an end-of-generation token (default: ignore_eos in every engine, "
                         "so every stream has --tokens tokens)")
    ap.add_argument("--repeats", type=int, default=3, help="blocks per (K, setting, arrivals) (default 3)")
    ap.add_argument("--stagger", type=float, default=1.0, help="seconds between staggered arrivals (default 1)")
    ap.add_argument("--threads", type=int, default=2, help="threads per engine (default 2)")
    ap.add_argument("--quick", action="store_true", help="K = 1, 4; T = 1; burst; one block")
    ap.add_argument("--http", action="store_true",
                    help=f"through HTTP: engines {','.join(HTTP_ENGINES)} (the HTTP layer's cost, and the servers)")
    ap.add_argument("--ray", action="store_true",
                    help=f"Ray Serve scaling at K = 1,2,4,8, 1 thread per replica: engines {','.join(RAY_ENGINES)}")
    ap.add_argument("--baseline-python", help=f"a Python importing the previous main's specdec_cpu, for engine "
                                              f"{AB_ENGINE} (default: ${BASELINE_PYTHON_ENV})")
    ap.add_argument("--output", type=Path, default=SERVING / "serving_results.json")
    ap.add_argument("--results-md", type=Path,
                    help="where the section goes (default: bench/RESULTS.md; bench/results/ab/RESULTS.md for a run "
                         f"with {AB_ENGINE}, the evidence for one change)")
    ap.add_argument("--report-only", type=Path, metavar="RESULTS_JSON",
                    help="re-render the section and plot from a results file")
    ap.add_argument("--trace-steps", type=Path, metavar="JSONL",
                    help="append BatchedDecoder γ=auto's step records (the planner's predictions beside each "
                         "step's outcome; a 'run' field numbers the runs) to this file; summarise it with "
                         "python -m bench.step_trace")
    args = ap.parse_args(argv)
    given = list(argv if argv is not None else sys.argv[1:])
    args.command = " ".join(["python -m bench.serving", *redact_baseline(given)])
    if (args.http or args.ray) and not any(a.startswith("--engines") for a in given):
        args.engines = list(RAY_ENGINES if args.ray else HTTP_ENGINES)
    if args.output == SERVING / "serving_results.json":  # each variant its own results and section
        stem = "serving_http" if args.http else "serving_ray" if args.ray else "serving"
        stem += "_suite" if args.prompts == "suite" else ""
        folder = SERVING
        if args.http and AB_ENGINE in args.engines:
            stem, folder = stem + "_ab", AB_RESULTS_MD.parent  # this checkout against the previous main
        elif args.http and args.threads < (os.cpu_count() or 1):
            stem += f"_t{args.threads}"
        args.output = folder / f"{stem}_results.json"
    if args.quick:
        args.ks, args.settings, args.arrivals, args.repeats = [1, 4], ["t1"], ["burst"], 1
    unknown = [e for e in args.engines if e not in ENGINES] + [s for s in args.settings if s not in SETTINGS]
    if unknown:
        ap.error(f"unknown engines/settings: {', '.join(unknown)}")
    if AB_ENGINE in args.engines and args.report_only is None:
        args.baseline_python = baseline_python(args.baseline_python)
        if not args.baseline_python:
            ap.error(f"engine {AB_ENGINE} needs --baseline-python PATH or ${BASELINE_PYTHON_ENV}")
        os.environ[BASELINE_PYTHON_ENV] = args.baseline_python  # the engine's factory reads it
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    results = json.loads(args.report_only.read_text()) if args.report_only is not None else sweep(args)
    heading, plot_file = section_of(results)
    data_dir = (args.report_only or args.output).parent
    results_md = args.results_md or (AB_RESULTS_MD if AB_ENGINE in results["engines"] else RESULTS_MD)
    plot(results, data_dir / plot_file)
    write_section(results_md, render(results, data_dir, results_md), heading, after=MODES[results["mode"]][0])
    say(f"wrote {results_md} ({heading}) and {plot_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
