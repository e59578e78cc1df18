"""The end-to-end benchmark suite: ours against plain decoding and the peers.

    python -m bench                # the full run (about 85 minutes on an idle 2-core machine)
    python -m bench --quick        # a few minutes: 2 prompts, T=0 and T=1, 64 tokens
    python -m bench --report-only bench/results/suite/results.json   # re-render tables and plots
    python -m bench --dry-run      # what would run, and how long it should take

For every (pair, setting, prompt, repeat) the engines run back to back in an order rotated from block to
block; each pair is calibrated in the same run at each setting, so that every run of ours is compared with the
theory's prediction.  Writes bench/results/suite/ (results.json, plots) and its sections of bench/RESULTS.md
(bench/report.py); progress and an ETA go to stderr.
"""

from __future__ import annotations

import argparse
import gc
import json
import signal
import sys
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from specdec_cpu.demo_models import ensure_model

from . import common, report, suite
from .common import BUSY_CORES, CpuMeter, load_average, machine_info, rotated, versions, wait_until_quiet
from .engines import llama_cli, llama_server
from .engines.llama_cpp_python import LcpRunner
from .engines.ours_single import generation_record
from .prompts import PROMPTS, by_name
from .suite import BASELINE, CONTROL, ENGINES, PAIRS, Q4_0, QUICK, SETTINGS, EngineSpec, Pair, Setting

#: γ_max the pairs are calibrated up to (T_target is measured for k = 1..9 rows).
CALIBRATION_GAMMA_MAX = 8
#: A peer run that takes longer than this is recorded as failed (a very busy machine).
PEER_TIMEOUT = 600.0
PEER_ERRORS = (llama_cli.PeerRunError, llama_cli.PeerBuildError, OSError)
#: A full run's defaults of what --quick changes (suite.QUICK).
FULL = dict(settings=tuple(SETTINGS), prompts=tuple(p.name for p in PROMPTS), engines=None,
            draft_max=suite.DEFAULT_DRAFT_MAX, tokens=128, repeats=1)


def _csv(choices: Sequence[str], what: str):
    def parse(text: str) -> List[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(bad) or '(none)'}; choose from {', '.join(choices)}")
        return items
    return parse


def _int_list(text: str) -> List[int]:
    try:
        out = sorted({int(t) for t in text.split(",") if t.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not out:
        raise argparse.ArgumentTypeError("expected at least one value")
    return out


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    q = QUICK
    ap = argparse.ArgumentParser(
        prog="python -m bench",
        description="End-to-end speculative decoding benchmark: ours vs plain decoding, "
                    "llama.cpp's tools and llama-cpp-python's prompt lookup.")
    ap.add_argument("--quick", action="store_true",
                    help=f"a few-minute run: prompts {','.join(q['prompts'])}, settings {','.join(q['settings'])}, "
                         f"{q['tokens']} tokens, engines {','.join(q['engines'])}, draft-length sweep "
                         f"{','.join(map(str, q['draft_max']))} (explicit options still win)")
    ap.add_argument("--pairs", type=_csv(list(PAIRS), "pair"), default=None,
                    help=f"model pairs (default all: {','.join(PAIRS)})")
    ap.add_argument("--settings", type=_csv(list(SETTINGS), "setting"), default=None,
                    help=f"sampling settings (default all: {','.join(SETTINGS)})")
    ap.add_argument("--engines", type=_csv(suite.known_ids(), "engine"), default=None,
                    help="engines or engine families (default: every engine of each pair; "
                         f"'{CONTROL}' and '{BASELINE}' always run). Known: {','.join(suite.known_ids())}")
    ap.add_argument("--prompts", type=_csv([p.name for p in PROMPTS], "prompt"), default=None,
                    help=f"prompts (default all: {','.join(p.name for p in PROMPTS)})")
    ap.add_argument("--tokens", type=int, default=None, help="new tokens per run (default 128)")
    ap.add_argument("--repeats", type=int, default=None, help="repeats per prompt (default 1)")
    ap.add_argument("--threads", type=int, default=2, help="threads of every engine (default 2)")
    ap.add_argument("--peer-draft-max", type=_int_list, default=None,
                    help="the --spec-draft-n-max sweep of llama-speculative, llama-speculative-simple "
                         f"and llama-server -md (default {','.join(map(str, suite.DEFAULT_DRAFT_MAX))}; "
                         f"--quick: {','.join(map(str, q['draft_max']))})")
    ap.add_argument("--ctx", type=int, default=1024, help="context size of every engine (default 1024)")
    ap.add_argument("--seed", type=int, default=1234, help="base seed (block i uses seed + i)")
    ap.add_argument("--output-dir", type=Path, default=common.results_dir("suite"),
                    help="where results.json and the plots go (default bench/results/suite; another "
                         "directory gets its own RESULTS.md, else bench/RESULTS.md is written)")
    ap.add_argument("--no-wait", dest="wait", action="store_false",
                    help="start every block at once (default: when other processes use more than "
                         f"{BUSY_CORES} cores, wait up to 60 s before a block, 5 min in all)")
    ap.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    ap.add_argument("--report-only", type=Path, metavar="RESULTS.json", default=None,
                    help="re-render RESULTS.md and the plots from a results.json, run nothing")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the engines, blocks and estimated duration, run nothing")
    args = ap.parse_args(argv)
    d = q if args.quick else FULL
    args.peer_draft_max = args.peer_draft_max or list(d["draft_max"])
    if args.peer_draft_max != list(suite.DEFAULT_DRAFT_MAX):
        suite.set_draft_sweep(args.peer_draft_max)
    args.pairs = args.pairs or list(PAIRS)
    args.settings = args.settings or list(d["settings"])
    args.prompts = args.prompts or list(d["prompts"])
    args.tokens = args.tokens or d["tokens"]
    args.repeats = args.repeats or d["repeats"]
    for name in ("tokens", "repeats", "threads", "ctx"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")
    if min(args.peer_draft_max) < 1:
        ap.error("--peer-draft-max values must be >= 1")
    engines = args.engines or d["engines"]
    args.engines = None if engines is None else suite.expand(engines)
    return args


def _mmss(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


class Progress:
    """Counts estimated work done; the ETA rescales the estimate by what was observed."""

    def __init__(self, total_estimate: float) -> None:
        self.t0, self.total, self.done_est, self.done_real = time.monotonic(), total_estimate, 0.0, 0.0

    def add(self, estimate: float, real: float) -> None:
        self.done_est += estimate
        self.done_real += real

    def eta(self) -> float:
        scale = min(max(self.done_real / self.done_est if self.done_est > 0 else 1.0, 0.3), 5.0)
        return max(self.total - self.done_est, 0.0) * scale

    def say(self, text: str) -> None:
        print(f"[{_mmss(time.monotonic() - self.t0)} elapsed, ETA {_mmss(self.eta())}] {text}", file=sys.stderr,
              flush=True)


def _is_f32(target: str) -> bool:
    return target.endswith("f32")


def estimate_run(target: str, engine: EngineSpec, tokens: int) -> float:
    f32 = _is_f32(target)
    tps = 14.0 if f32 else 40.0
    if engine.kind == "ours" and engine.gamma != 0:
        tps *= 1.4 if f32 else 1.0
    elif engine.kind == "speculative" or (engine.kind == "server" and engine.uses_draft_model):
        tps *= 1.4 if f32 else (0.8 if engine.draft_max <= 4 else 0.6 if engine.draft_max <= 8 else 0.4)
    elif engine.kind == "server" and engine.spec_type:
        tps *= 1.5
    elif engine.kind == "lcp" and engine.num_pred_tokens:
        tps *= 1.2
    # process start, model load and prompt (the servers keep their models loaded)
    fixed = {"completion": 3.0 if f32 else 1.5, "speculative": 4.5 if f32 else 5.5,
             "server": 2.0 if f32 else 0.8, "lcp": 0.5, "ours": 0.1}[engine.kind]
    return tokens / tps + fixed


def estimate_calibrations(group: "Group", quick: bool) -> float:
    """The group's calibrations at one setting: one per drafting mode of ours."""
    n = len({e.drafter for e in group.engines if e.kind == "ours"} - {"plain"})
    return n * (12.0 if _is_f32(group.target) else 6.0) * (0.6 if quick else 1.0)


def estimate_total(groups: List["Group"], args: argparse.Namespace) -> float:
    total = 0.0
    n_blocks = len(args.settings) * len(args.prompts) * args.repeats
    for g in groups:
        n_servers = sum(1 for e in g.engines if e.kind == "server")
        total += (25.0 if _is_f32(g.target) else 10.0) + n_servers * (8.0 if _is_f32(g.target) else 4.0)
        total += len(args.settings) * estimate_calibrations(g, args.quick)
        total += n_blocks * (2.0 + sum(estimate_run(g.target, e, args.tokens) for e in g.engines))
    return total


@dataclass
class Group:
    """Pairs sharing one target model: their engines run in the same blocks."""

    target: str
    target_path: Path
    pairs: List[Pair]
    engines: List[EngineSpec]
    decoders: Dict[str, Any] = field(default_factory=dict)  # role -> SpeculativeDecoder
    draft_paths: Dict[str, Optional[Path]] = field(default_factory=dict)  # role -> draft file
    cost_models: Dict[str, Any] = field(default_factory=dict)  # role -> CostModel at the current setting
    lcp: Any = None
    servers: Dict[str, Any] = field(default_factory=dict)  # engine id -> running llama-server
    stack: ExitStack = field(default_factory=ExitStack)  # stops the servers
    errors: List[str] = field(default_factory=list)  # peers that could not be started

    def pair_ids_of(self, engine: EngineSpec) -> List[str]:
        return [p.id for p in self.pairs if engine.id in (CONTROL, BASELINE) or engine.id in suite.pair_engines(p.id)]

    @property
    def model_draft(self) -> Optional[str]:
        return next((p.draft for p in self.pairs if p.draft), None)

    def draft_file(self) -> Path:
        return ensure_model(self.model_draft or Q4_0)

    def plain_decoder(self):
        for role in ("draft", "ngram", "plain", "ngram-draft"):
            if role in self.decoders:
                return self.decoders[role]
        raise RuntimeError("no decoder for plain decoding")


def build_groups(args: argparse.Namespace) -> List[Group]:
    by_target: Dict[str, Group] = {}
    for pid in args.pairs:
        pair = PAIRS[pid]
        if pair.target not in by_target:
            by_target[pair.target] = Group(pair.target, ensure_model(pair.target), [], [])
        by_target[pair.target].pairs.append(pair)
    for group in by_target.values():
        ids = {CONTROL, BASELINE}
        for pair in group.pairs:
            ids.update(e for e in suite.pair_engines(pair.id, optional=args.engines is not None)
                       if args.engines is None or e in args.engines)
        group.engines = [e for e in ENGINES.values() if e.id in ids]
    return [g for g in by_target.values() if len(g.engines) > 2 or args.engines is not None]


def load_group(group: Group, args: argparse.Namespace, progress: Progress) -> None:
    """Load every decoder, the llama-cpp-python model and the llama-servers the group's engines need."""
    from specdec_cpu import SpeculativeDecoder

    roles = {e.drafter for e in group.engines if e.kind == "ours"}
    draft = group.model_draft or (Q4_0 if roles & {"draft", "ngram-draft"} else None)
    draft_path = ensure_model(draft) if draft else None
    if "plain" in roles:
        roles.discard("plain")
        if not roles & {"draft", "ngram"}:
            roles.add("draft" if draft_path is not None and group.model_draft else "plain")
    for role in sorted(roles):
        path = draft_path if role == "draft" else ensure_model(Q4_0) if role == "ngram-draft" else None
        kw = dict(ngram=True) if role in ("ngram", "ngram-draft") else {}
        group.decoders[role] = SpeculativeDecoder.from_gguf(group.target_path, path, gamma=0, n_ctx=args.ctx,
                                                            n_threads=args.threads, seed=args.seed, **kw)
        group.draft_paths[role] = path
    if any(e.kind == "lcp" for e in group.engines):
        group.lcp = LcpRunner(group.target_path, args.threads, args.ctx)
    for engine in [e for e in group.engines if e.kind == "server"]:
        try:
            # one client, the suite's context and threads; sampling is set per request
            group.servers[engine.id] = group.stack.enter_context(llama_server.llama_server(
                group.target_path, draft=group.draft_file() if engine.uses_draft_model else None,
                spec_type=engine.spec_type or None, draft_max=engine.draft_max or None,
                draft_min=0 if engine.uses_draft_model else None, parallel=1, ctx=args.ctx,
                threads=args.threads, seed=args.seed, extra_args=engine.server_args, startup_timeout=PEER_TIMEOUT))
        except PEER_ERRORS as exc:
            progress.say(f"{engine.id}: llama-server did not start, running without it: {exc}")
            group.engines.remove(engine)
            group.errors.append(f"{engine.id}: {str(exc).strip().splitlines()[0][:300]}")
    progress.say(f"loaded {group.target} ({', '.join(sorted(group.decoders))}"
                 f"{', llama-cpp-python' if group.lcp else ''}"
                 f"{f', {len(group.servers)} llama-server(s)' if group.servers else ''})")


def predicted_speedup(engine: EngineSpec, stats, cost_model) -> Optional[float]:
    """The theory's speed-up for a run, from its measured α and the pair's calibration (c, v(k)) at the setting;
    for varying γ, Σ E[tokens](α, γ_i) / Σ (γ_i·c + v(γ_i + 1)) over the steps (an n-gram lookup costs c = 0)."""
    from specdec_cpu.planning import theory

    if cost_model is None or engine.gamma == 0 or not stats.steps:
        return None
    if not stats.alpha_rows:
        return 1.0 if not stats.drafted else None
    alpha = min(max(stats.mean_alpha, 0.0), 1.0)
    c = cost_model.cost
    if engine.drafter == "ngram":
        c = 0.0
    elif engine.drafter == "ngram-draft":
        drafted = {k: v[0] for k, v in stats.by_drafter.items()}
        total = sum(drafted.values())
        c = c * (drafted.get("model", 0) / total) if total else c
    fixed = isinstance(engine.gamma, int)
    v = cost_model.verify_curve(max(max(stats.gammas), engine.gamma if fixed else 1, 1) + 1)
    if fixed:
        return float(theory.speedup(alpha, engine.gamma, c, v))
    tokens = spent = 0.0
    for g, n in Counter(stats.gammas).items():
        tokens += n * (float(theory.expected_tokens(alpha, g)) if g else 1)
        spent += n * (g * c + float(v[g + 1]) if g else 1)
    return tokens / spent if spent > 0 else None


def run_engine(group: Group, engine: EngineSpec, setting: Setting, text: str, seed: int,
               args: argparse.Namespace) -> Dict[str, Any]:
    rec: Dict[str, Any] = {"engine": engine.id}
    if engine.draft_max:
        rec["draft_max"] = engine.draft_max
    t0 = time.perf_counter()
    peer = dict(timeout=PEER_TIMEOUT, seed=seed, **setting.peer_kwargs())
    cli = dict(threads=args.threads, ctx=args.ctx, **peer)
    try:
        if engine.kind == "ours":
            plain = engine.id == "plain"
            dec = group.plain_decoder() if plain else group.decoders[engine.drafter]
            gen = dec.generate(text, max_tokens=args.tokens, params=setting.params(seed), gamma=engine.gamma)
            rec.update(generation_record(gen))
            rec["predicted"] = predicted_speedup(engine, gen.stats,
                                                 group.cost_models.get("draft" if plain else engine.drafter))
            rec["text"] = gen.text
        elif engine.kind == "completion":
            r = llama_cli.run_plain(group.target_path, text, args.tokens, **cli)
            rec.update(r.record())
            if r.tokens_per_s_with_sampling:  # a generation loop pays for sampling too, as the speculative tools
                rec["tps"], rec["tps_eval_only"] = r.tokens_per_s_with_sampling, r.tokens_per_s
        elif engine.kind == "speculative":
            rec.update(llama_cli.run_speculative(group.target_path, group.draft_file(), text, args.tokens,
                                                 draft_max=engine.draft_max, variant=engine.variant, **cli).record())
        elif engine.kind == "server":
            r = llama_server.run_server(group.servers[engine.id], text, args.tokens, **peer)
            rec.update(r.record(), finish=r.target_perf.get("stop_type"), timings=r.target_perf)
        elif engine.kind == "lcp":
            rec.update(group.lcp.run(text, args.tokens, setting, seed, engine.num_pred_tokens))
        else:  # pragma: no cover
            raise ValueError(engine.kind)
    except PEER_ERRORS + (RuntimeError, ValueError) as exc:
        rec["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
        rec["tps"] = None
    rec["wall_seconds"] = time.perf_counter() - t0
    return rec


def warm_up(group: Group, args: argparse.Namespace, progress: Progress) -> None:
    """One short generation per decoder and per peer tool (page cache, first-call setup)."""
    t0 = time.monotonic()
    text = "<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n"
    for dec in group.decoders.values():
        for gamma in (0, 2) if dec.has_drafter else (0,):
            dec.generate(text, max_tokens=8, params=SETTINGS["t0"].params(), gamma=gamma)
    if group.lcp is not None:
        group.lcp.run(text, 8, SETTINGS["t0"], 1, 2)
    cli = dict(threads=args.threads, ctx=args.ctx, timeout=PEER_TIMEOUT)
    try:
        if any(e.kind == "completion" for e in group.engines):
            llama_cli.run_plain(group.target_path, text, 8, **cli)
        for variant in sorted({e.variant for e in group.engines if e.kind == "speculative"}):
            llama_cli.run_speculative(group.target_path, group.draft_file(), text, 8, variant=variant, **cli)
        for url in group.servers.values():
            llama_server.run_server(url, text, 8, timeout=PEER_TIMEOUT)
    except llama_cli.PeerRunError as exc:
        progress.say(f"warm-up of a peer failed: {exc}")
    progress.say(f"warmed up {group.target} in {time.monotonic() - t0:.0f} s")


def prime(group: Group, text: str) -> None:
    """Give the block's prompt to every model of ours outside the timed runs: a draft model would otherwise take
    it in during its first draft, counted as decode time (the peers' figures exclude prompt processing)."""
    for dec in group.decoders.values():
        dec.generate(text, max_tokens=4, params=SETTINGS["t0"].params(), gamma=2 if dec.has_drafter else 0)


def calibrate_group(group: Group, setting: Setting, args: argparse.Namespace,
                    progress: Progress) -> List[Dict[str, Any]]:
    """Calibrate every decoder with a drafter at this setting; γ=auto then starts from this run's costs."""
    from specdec_cpu.planning.calibration import calibrate

    out = []
    models: Dict[str, Any] = {}
    for role in [r for r in ("draft", "ngram", "ngram-draft") if r in group.decoders]:
        dec = group.decoders[role]
        if role == "ngram-draft" and "draft" in models:
            cm = models["draft"]  # the same two model files: the same costs
        else:
            t0 = time.monotonic()
            cm = calibrate(dec, params=setting.params(args.seed), gamma_max=CALIBRATION_GAMMA_MAX,
                           n_tokens=16 if args.quick else 32, recalibrate=True, cache=False)
            progress.say(f"calibrated {group.target} ({role}) at {setting.label}: c={cm.cost:.3f}, "
                         f"v(5)={cm.verify_cost(5):.2f}, v(9)={cm.verify_cost(9):.2f}, "
                         f"α={cm.alpha if cm.alpha is None else round(cm.alpha, 3)} ({time.monotonic() - t0:.0f} s)")
            path = group.draft_paths.get(role)
            out.append({"target": group.target, "role": role, "setting": setting.id,
                        "draft": None if path is None else path.name, "target_ms": cm.target_ms,
                        "draft_ms": cm.draft_ms, "c": cm.cost,
                        "v": [cm.verify_cost(k) for k in range(1, cm.k_max + 1)], "alpha": cm.alpha})
        models[role] = dec.cost_model = cm  # a new cost model gives the decoder a new planner
    group.cost_models = models
    return out


def engine_info(e: EngineSpec) -> Dict[str, Any]:
    info: Dict[str, Any] = {"label": e.label, "kind": e.kind}
    if e.family:
        info.update(family=e.family, family_label=e.family_label, setting_label=e.setting_label)
    if e.draft_max:
        info["draft_max"] = e.draft_max
    if e.kind == "server":
        info.update(spec_type=e.spec_type or None, server_args=list(e.server_args))
    return info


def run_suite(args: argparse.Namespace, command: str) -> Dict[str, Any]:
    t_start = time.time()
    results: Dict[str, Any] = {
        "format": 1, "command": command,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(t_start)),
        "load_average_start": load_average(),
        "config": {
            "pairs": args.pairs, "settings": args.settings, "prompts": args.prompts,
            "engines": args.engines, "tokens": args.tokens, "repeats": args.repeats,
            "threads": args.threads, "peer_draft_max": list(args.peer_draft_max), "ctx": args.ctx,
            "seed": args.seed, "quick": args.quick, "wait_for_quiet": args.wait,
            "busy_cores_threshold": BUSY_CORES,
            "server_cpu_is_ours": True,  # others_cores of a llama-server run leaves out the server itself
        },
        "baseline": BASELINE, "control": CONTROL, "calibrations": [], "runs": [], "complete": False,
    }
    groups = build_groups(args)
    prompts = by_name(args.prompts)
    settings = [SETTINGS[s] for s in args.settings]
    peer_kinds = ("completion", "speculative", "server")
    peer_paths = None
    if any(e.kind in peer_kinds for g in groups for e in g.engines):
        try:
            peer_paths = llama_cli.ensure_peers()
        except llama_cli.PeerBuildError as exc:
            print(f"llama.cpp peers unavailable, running without them (so the speed-ups are against our "
                  f"plain decoding): {exc}", file=sys.stderr)
            results["peer_error"] = str(exc)
            for g in groups:
                g.engines = [e for e in g.engines if e.kind not in peer_kinds]
    results["machine"] = machine_info(args.threads)
    results["versions"] = versions(peer_paths)
    results["pairs"] = {p: {"label": PAIRS[p].label, "description": PAIRS[p].description, "target": PAIRS[p].target,
                            "draft": PAIRS[p].draft,
                            "engines": [e.id for g in groups for e in g.engines if p in g.pair_ids_of(e)]}
                        for p in args.pairs}
    results["engines"] = {e.id: engine_info(e) for g in groups for e in g.engines}
    results["settings"] = {s.id: {"label": s.label, "temperature": s.temperature, "top_k": s.top_k,
                                  "top_p": s.top_p, "min_p": s.min_p} for s in settings}
    results["prompts"] = {p.name: {"kind": p.kind, "description": p.description} for p in prompts}

    total = estimate_total(groups, args)
    progress = Progress(total)
    progress.say(f"{len(groups)} target(s), {len(settings)} setting(s), {len(prompts)} prompt(s) × "
                 f"{args.repeats} repeat(s), {args.tokens} tokens; estimated {_mmss(total)} on an idle machine")
    block = 0
    wait_budget = [300.0 if not args.quick else 60.0]
    try:
        for group in groups:
            t0 = time.monotonic()
            load_group(group, args, progress)
            results.setdefault("peer_start_errors", []).extend(group.errors)
            warm_up(group, args, progress)
            progress.add(25.0 if _is_f32(group.target) else 10.0, time.monotonic() - t0)
            for setting in settings:
                t0 = time.monotonic()
                results["calibrations"].extend(calibrate_group(group, setting, args, progress))
                progress.add(estimate_calibrations(group, args.quick), time.monotonic() - t0)
                for prompt in prompts:
                    text = group.plain_decoder().chat_prompt(prompt.messages())
                    for rep in range(args.repeats):
                        results["runs"].extend(run_block(group, setting, prompt, rep, block, text, args, progress,
                                                         wait_budget))
                        block += 1
            release(group)
        results["complete"] = True
    except KeyboardInterrupt:
        progress.say("interrupted: writing what was measured so far")
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime())
    results["duration_seconds"] = round(time.time() - t_start, 1)
    results["load_average_end"] = load_average()
    return results


def run_block(group: Group, setting: Setting, prompt, rep: int, block: int, text: str, args: argparse.Namespace,
              progress: Progress, wait_budget: List[float]) -> List[Dict[str, Any]]:
    """Every engine of the group once, in the block's rotated order, with per-run ratios to the block's baseline."""
    seed = args.seed + block
    runs = []
    prime(group, text)
    quiet = wait_until_quiet(progress, wait_budget) if args.wait else None
    for pos, engine in enumerate(rotated(group.engines, block)):
        load = load_average()
        server = group.servers.get(engine.id)
        meter = CpuMeter([server.pid] if server is not None else [])
        rec = run_engine(group, engine, setting, text, seed, args)
        rec.update({"others_cores": meter.others(), "others_cores_before_block": quiet,
                    "load_1min": load[0] if load else None, "block": block, "target": group.target,
                    "setting": setting.id, "prompt": prompt.name, "kind": prompt.kind, "repeat": rep,
                    "position": pos, "seed": seed, "pairs": group.pair_ids_of(engine)})
        runs.append(rec)
        progress.add(estimate_run(group.target, engine, args.tokens), rec["wall_seconds"])
        progress.say(_run_line(rec, setting))
    # ratios to llama.cpp's plain decoding (ours when llama.cpp's did not run) and to ours
    tps = {r["engine"]: r.get("tps") for r in runs}
    base_id = BASELINE if tps.get(BASELINE) else CONTROL
    base, ours = tps.get(base_id), tps.get(CONTROL)
    for r in runs:
        r["baseline"] = base_id
        r["ratio"] = (r["tps"] / base) if base and r.get("tps") else None
        r["ratio_to_ours_plain"] = (r["tps"] / ours) if ours and r.get("tps") else None
    return runs


def dry_run(args: argparse.Namespace) -> int:
    """Print what a run with these arguments would do, and its estimated duration."""
    groups = build_groups(args)
    n_blocks = len(args.settings) * len(args.prompts) * args.repeats
    print(f"{len(groups)} target(s); per target {n_blocks} block(s) = {len(args.settings)} setting(s) × "
          f"{len(args.prompts)} prompt(s) × {args.repeats} repeat(s); {args.tokens} tokens per run")
    for g in groups:
        per_block = sum(estimate_run(g.target, e, args.tokens) for e in g.engines)
        print(f"- {g.target} ({', '.join(p.id for p in g.pairs)}): {len(g.engines)} engines, "
              f"≈ {per_block:.0f} s per block")
        for e in g.engines:
            print(f"    {e.id:32s} {e.kind:12s} ≈ {estimate_run(g.target, e, args.tokens):5.1f} s/run")
    total = estimate_total(groups, args)
    print(f"estimated duration on an idle machine: {_mmss(total)} ({total / 60:.1f} min), "
          "before the waits for a quiet machine")
    return 0


def release(group: Group) -> None:
    """Stop the group's servers and drop its models before the next group loads its own."""
    group.stack.close()
    group.servers.clear()
    group.decoders.clear()
    group.cost_models = {}
    if group.lcp is not None:
        group.lcp.close()
        group.lcp = None
    gc.collect()


def _run_line(rec: Dict[str, Any], setting: Setting) -> str:
    head = f"{rec['target'].split('-')[-1]} {setting.id} {rec['prompt']} r{rec['repeat']} {rec['engine']}"
    if rec.get("error"):
        return f"{head}: FAILED {rec['error']}"
    parts = [f"{rec['tps']:.1f} tok/s" if rec.get("tps") else "no rate", f"{rec.get('tokens')} tok"]
    if rec.get("acceptance") is not None:
        parts.append(f"acc {rec['acceptance']:.2f}")
    if rec.get("mean_gamma"):
        parts.append(f"γ̄ {rec['mean_gamma']:.1f}")
    return f"{head}: " + ", ".join(parts)


def _interrupt(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # a terminated run still writes what it measured
    if args.dry_run:
        return dry_run(args)
    out_dir: Path = args.output_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.report_only is not None:
        results = json.loads(args.report_only.read_text())
    else:
        results = run_suite(args, common.command_line("python -m bench", argv))
        (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
        print(f"wrote {out_dir / 'results.json'}", file=sys.stderr)
    results_md = common.results_md_for(out_dir, common.results_dir("suite"))
    plots = {} if args.no_plots else report.make_plots(results, out_dir)
    plots = {k: common.link(out_dir / name, results_md) for k, name in plots.items()}
    report.write_results_md(results, results_md, plots, common.link(out_dir / "results.json", results_md))
    print(f"wrote {results_md}" + (f" and {len(plots)} plot(s)" if plots else ""), file=sys.stderr)
    print(report.headline(results), file=sys.stderr)
    return 0 if results.get("complete") else 1
