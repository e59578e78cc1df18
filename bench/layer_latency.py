"""What each serving layer adds to one request's latency.

    python -m bench.layer_latency                  # 1 and 2 threads × both Ray settings, 100 rounds each
    python -m bench.layer_latency --threads 1 --ray-settings ours --rounds 50
    python -m bench.layer_latency --fresh-prompts  # a new prompt every round: its prompt pass included

The serving sweep's time to first token mixes the layers' cost with prompt passes, batching and machine
noise, each worth tens of milliseconds.  This isolates the layers: one decoder is loaded three ways at once
(``BatchedDecoder`` called directly, ``specdec-cpu serve`` over HTTP, Ray Serve's HTTP proxy with one replica)
and one client sends the same greedy one-token request (its prompt in every prompt cache) down each path in turn
(the server both with a bare httpx client and with the ``openai`` client), the order rotated every round.
The per-round differences between successive paths are what each adds (medians, bootstrap 95% interval);
``GET /health``, alternately bare and through Ray's proxy, is the HTTP paths' floor.  Writes the results file
``--output`` names and a section of bench/RESULTS.md; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import httpx

from specdec_cpu.server.ray_deployment import LOW_LATENCY_ENV

from .common import (
    RESULTS_MD,
    bootstrap_ci,
    link,
    machine_info,
    notes_of,
    results_dir,
    rotated,
    versions,
    write_section,
)
from .engines.base import Request
from .engines.ours_batched import OpenAIServer, OursBatched
from .serving import chat_prompts
from .suite import SETTINGS

HEADING = "## Serving layers' added latency"
FRESH_HEADING = "## Serving layers' added latency, a new prompt every request"
HEALTH_ROUNDS = 200
#: Ray Serve's own values of the settings ``serve --ray`` changes (Ray 2.x)
RAY_DEFAULTS = {"RAY_SERVE_ENABLE_HA_PROXY": "0", "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "1",
                "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "1", "RAY_SERVE_PROXY_USE_GRPC": "0"}
#: --ray-settings: the environment each runs Ray with, over ``serve --ray``'s
#: LOW_LATENCY_ENV, and its name in the tables
RAY_SETTINGS = {"ours": ({}, "serve --ray's (HAProxy)"),
                "python-proxy": ({"RAY_SERVE_ENABLE_HA_PROXY": "0"}, "serve --ray's, Ray's Python proxy"),
                "defaults": (RAY_DEFAULTS, "Ray's defaults")}
#: (path id, what it is); each is compared with the one before it.  "http-raw" is
#: the "http" server read by a bare HTTP client (httpx, one line of SSE parsing):
#: the server's own share, without the openai client's.
PATHS = (("direct", "BatchedDecoder called directly"),
         ("http-raw", "specdec-cpu serve, bare httpx client"),
         ("http", "specdec-cpu serve, openai client"),
         ("ray", "Ray Serve's HTTP ingress, 1 replica, openai client"))


def _latency(engine, prompt: str) -> tuple[float, Optional[float]]:
    """Seconds from sending one greedy one-token request to its token, and
    the decoder's own time to first token when called directly (else None)."""
    rec = Request(stream=0, sent=0.0)
    t0 = time.perf_counter()
    engine.request(prompt, SETTINGS["t0"], 1, 1, rec, t0)
    if rec.first is None:
        raise RuntimeError(f"{engine.id}: the request returned no token")
    return rec.first, rec.decoder_ttft


class _DecoderClock:
    """The decoder's own time to first token of a server's requests, one at a
    time: the growth of its ``/metrics`` histogram's sum, read after each
    request (the scrape is outside the measured span)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.total, self.count = engine.decoder_ttft_total()

    def last(self) -> float:
        total, count = self.engine.decoder_ttft_total()
        if count != self.count + 1:
            raise RuntimeError(f"{self.engine.id}: {count - self.count} requests since the last reading, not 1")
        ttft, self.total, self.count = total - self.total, total, count
        return ttft


def _raw_latency(client, url: str, prompt: str) -> float:
    """The same request as ``_latency``'s, streamed with a bare httpx client."""
    body = {"model": "bench", "prompt": prompt, "max_tokens": 1, "temperature": 0, "seed": 1, "stream": True}
    t0 = time.perf_counter()
    with client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                return time.perf_counter() - t0
    raise RuntimeError("the request returned no token")


def measure(threads: int, rounds: int, ray_settings: str, fresh: bool = False) -> Dict[str, List[float]]:
    """Latencies (seconds) of every path and its decoder's own, one list each, aligned by round.

    ``ray_settings`` (a key of RAY_SETTINGS) changes Ray's environment over LOW_LATENCY_ENV, which the
    environment wins over and the Ray processes inherit."""
    for name in LOW_LATENCY_ENV:
        os.environ.pop(name, None)
    os.environ.update(RAY_SETTINGS[ray_settings][0])
    engines = {"direct": OursBatched("auto"), "http": OpenAIServer("http", PATHS[2][1], "ours"),
               "ray": OpenAIServer("ray", PATHS[3][1], "ours", replicas=1)}
    started = []
    prompt = chat_prompts(1, "latency")[0]
    order = [p for p, _ in PATHS]
    out: Dict[str, List[float]] = {key: [] for key in order + [f"{p}-decoder" for p in order]}
    raw = httpx.Client(timeout=120)
    try:
        for e in engines.values():
            print(f"threads={threads}, Ray settings {ray_settings}: loading {e.label}", file=sys.stderr, flush=True)
            e.start(1, threads)
            started.append(e)
            for _ in range(3):  # fills the prompt cache and warms the path
                _latency(e, prompt)
        _raw_latency(raw, engines["http"].url, prompt)
        clocks = {"http": _DecoderClock(engines["http"]), "ray": _DecoderClock(engines["ray"])}

        def one(pid: str, prompt: str) -> tuple[float, float]:
            """(latency, the decoder's own time to first token) of one request."""
            if pid == "http-raw":
                return _raw_latency(raw, engines["http"].url, prompt), clocks["http"].last()
            latency, decoder = _latency(engines[pid], prompt)
            return latency, decoder if decoder is not None else clocks[pid].last()

        for r in range(rounds):
            if fresh:  # one prompt per path (the two server paths share an engine's cache), alike but for a digit
                prompts = {pid: chat_prompts(1, f"fresh{threads}.{r}.{i}")[0] for i, pid in enumerate(order)}
            for pid in rotated(order, r):
                latency, decoder = one(pid, prompts[pid] if fresh else prompt)
                out[pid].append(latency)
                out[f"{pid}-decoder"].append(decoder)
        # The HTTP paths' floor: a request that decodes nothing.
        with httpx.Client() as http:
            for r in range(HEALTH_ROUNDS):
                for pid in rotated(("http", "ray"), r):
                    t0 = time.perf_counter()
                    http.get(engines[pid].url + "/health").raise_for_status()
                    out.setdefault(f"{pid}-health", []).append(time.perf_counter() - t0)
    finally:
        raw.close()
        for e in started:
            e.stop()
    return out


def _added(a: Sequence[float], b: Sequence[float]) -> str:
    """The median of the per-round differences a − b in ms, with its bootstrap 95% interval, as a table cell."""
    diffs = [1000 * (x - y) for x, y in zip(a, b)]
    ci = bootstrap_ci(diffs)
    return f"{statistics.median(diffs):+.1f} [{ci[0]:+.1f}, {ci[1]:+.1f}]"


def summary(lat: Dict[str, List[float]]) -> List[Dict[str, Any]]:
    """Per path: median latency, and what it adds over the path before it (``_added``)."""
    return [{"path": pid, "label": label, "median_ms": 1000 * statistics.median(lat[pid]), "n": len(lat[pid]),
             "vs": prev or "–", "added": _added(lat[pid], lat[prev]) if prev else "–"}
            for prev, (pid, label) in zip([None, *(p for p, _ in PATHS)], PATHS)]


def outside_summary(lat: Dict[str, List[float]]) -> List[Dict[str, Any]]:
    """``summary`` of each request's time outside the decoder (latency − the decoder's own time to first token,
    of the same request: one process ran both, so the pass and that process's speed cancel), with the decoder's
    median."""
    rows = summary({pid: [a - d for a, d in zip(lat[pid], lat[f"{pid}-decoder"])] for pid, _ in PATHS})
    return [row | {"decoder_ms": 1000 * statistics.median(lat[f"{row['path']}-decoder"])} for row in rows]


def render(results: Dict[str, Any], results_file: Path, results_md: Path = RESULTS_MD) -> str:
    """The section of one run, read from ``results_file`` and written into ``results_md``."""
    output, data = Path(results_file).name, link(results_file, results_md)
    fresh = results.get("fresh_prompts", False)
    workload = ("a new templated chat prompt every request (each path its own, of the same template and "
                "length; none seen before by any engine), so every request runs its prompt's pass and its "
                "first token: the first token of a new conversation" if fresh else
                "the same greedy one-token request (a templated chat prompt held in each engine's prompt "
                "cache)")
    out = [FRESH_HEADING if fresh else HEADING, "",
           "Generated by `python -m bench.layer_latency`; every number comes from the run described here "
           f"(every latency is in [{output}]({data or output})).", "",
           "```", results["command"], "```", "",
           f"- Run: {results['started']} → {results['finished']} (code at git {results['git']}); machine: "
           f"{results['machine'].get('cpu', '?')}, {results['machine'].get('cores', '?')} cores.",
           "- Workload: F32 target / Q4_0 draft (Qwen2.5-Coder-0.5B-Instruct) loaded three ways at once; one "
           f"client sends {'a greedy one-token request with ' if fresh else ''}{workload} to each path in turn, "
           "the order rotated every round. Latency: request sent → its token "
           "received. Added: median of per-round differences [bootstrap 95% interval].", "",
           "| threads | Ray settings | path | rounds | latency p50 ms | added over | added ms, median [95% interval] |",
           "|---|---|---|---|---|---|---|"]
    for run in results["runs"]:
        t, rs, lat = run["threads"], run["settings_label"], run["latencies"]
        for row in summary(lat):
            out.append(f"| {t} | {rs} | {row['label']} | {row['n']} | {row['median_ms']:.1f} | {row['vs']} | "
                       f"{row['added']} |")
        h, r = lat["http-health"], lat["ray-health"]
        out.append(f"| {t} | {rs} | GET /health through Ray's ingress (no decoding) | {len(r)} | "
                   f"{1000 * statistics.median(r):.1f} | the same, bare server ({1000 * statistics.median(h):.1f} "
                   f"ms) | {_added(r, h)} |")
    out += ["", "The same requests, outside the decoder: each request's latency minus its decoder's own time "
            "to first token (submission → first token: `first_token_seconds` of the direct call's stats, the "
            "growth of `specdec_time_to_first_token_seconds_sum` in the server's `/metrics`). Both come from "
            "the process that ran the pass, so the pass and that process's speed cancel and what is left is "
            "the path alone.", "",
            "| threads | Ray settings | path | decoder's TTFT p50 ms | outside the decoder p50 ms | added over | "
            "added ms, median [95% interval] |", "|---|---|---|---|---|---|---|"]
    for run in results["runs"]:
        for row in outside_summary(run["latencies"]):
            out.append(f"| {run['threads']} | {run['settings_label']} | {row['label']} | {row['decoder_ms']:.1f} | "
                       f"{row['median_ms']:.1f} | {row['vs']} | {row['added']} |")
    own = ("its prompt's pass, a few hundred milliseconds, in whichever process serves that path (two "
           "processes running the same pass can differ by several percent for their whole lifetime, so these "
           "differences carry that too)" if fresh else "one 1-row target pass")
    out += ["", "Goals: the HTTP layer adds under 5 ms to time to first token (server issue); Ray adds under "
            f"10 ms per request at 1 client (Ray issue). Each request's own cost, {own}, is the "
            "same on every path; what differs is the path: the server's own share is the bare-client row, the "
            "openai client's the row after it, and the `GET /health` row shows the proxy's cost without a "
            "pass's noise around it. With 2 threads llama.cpp's threads occupy both cores while the server's "
            "event loop, Ray's proxy and the client need one too. Ray settings: those `serve --ray` gives a local "
            "cluster (`LOW_LATENCY_ENV` in specdec_cpu/serving/ray_app.py: HAProxy forwarding each request to the "
            "replica's own HTTP server, the replica's app on its process's main event loop), the same with Ray's "
            "Python proxy instead of HAProxy (its router on its main loop, gRPC to the replica), or Ray Serve's "
            "defaults (Python proxy)."]
    return "\n".join(out + ["", *notes_of(results_file)]).rstrip() + "\n"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.layer_latency", description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=lambda s: [int(t) for t in s.split(",")], default="1,2",
                    help="llama.cpp threads per engine, a run for each (default 1,2)")
    ap.add_argument("--rounds", type=int, default=100, help="requests per path and thread count (default 100)")
    ap.add_argument("--ray-settings", type=lambda s: s.split(","), default="ours,python-proxy",
                    help="Ray Serve settings, a run for each: ours (serve --ray's, HAProxy ingress), "
                         "python-proxy (the same with Ray's Python proxy), defaults (Ray's own)")
    ap.add_argument("--fresh-prompts", action="store_true",
                    help="a new prompt every round (its prompt pass included), not one held in the prompt cache")
    ap.add_argument("--output", type=Path,
                    help="results file (default bench/results/layer_latency/layer_latency_results.json, "
                         "_fresh_results.json with --fresh-prompts)")
    ap.add_argument("--results-md", type=Path, default=RESULTS_MD)
    ap.add_argument("--report-only", type=Path, metavar="RESULTS_JSON")
    args = ap.parse_args(argv)
    if not set(args.ray_settings) <= set(RAY_SETTINGS):
        ap.error(f"--ray-settings takes {', '.join(RAY_SETTINGS)}, got {','.join(args.ray_settings)}")
    if args.rounds < 2 or any(t < 1 for t in args.threads):
        ap.error("--rounds must be >= 2 and every --threads >= 1")
    if args.output is None:
        name = "layer_latency_fresh_results.json" if args.fresh_prompts else "layer_latency_results.json"
        args.output = results_dir("layer_latency") / name
    args.command = " ".join(["python -m bench.layer_latency", *argv])
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv if argv is not None else sys.argv[1:])
    if args.report_only:
        results = json.loads(args.report_only.read_text())
    else:
        results = {"command": args.command,
                   "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                   "machine": machine_info(max(args.threads)), "git": versions(None).get("specdec_cpu_git"),
                   "fresh_prompts": args.fresh_prompts, "runs": []}
        for t in args.threads:
            for rs in args.ray_settings:
                results["runs"].append({"threads": t, "ray_settings": rs, "settings_label": RAY_SETTINGS[rs][1],
                                        "latencies": measure(t, args.rounds, rs, args.fresh_prompts)})
        results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        args.output.write_text(json.dumps(results, indent=1) + "\n")
    fresh = results.get("fresh_prompts", False)
    section = render(results, args.report_only or args.output, args.results_md)
    write_section(args.results_md, section, FRESH_HEADING if fresh else HEADING,
                  after=HEADING if fresh else "## Serving with Ray")
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
