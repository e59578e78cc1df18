"""Structured output (JSON schemas), ours against llama-server, side by side.

    python -m bench.structured                 # the demo pair (F32 / Q4_0), T = 0 and T = 0.7
    python -m bench.structured --quick         # one block per setting, to see that it runs

Six prompts asking for JSON: extraction into schemas of several shapes and
function-call arguments.  Engines, one at a time, in an order rotated from
block to block (a block = one prompt at one setting):

- ``ours-auto``: SpeculativeDecoder γ=auto with the draft, ``grammar=`` the schema;
- ``ours-g0``: the same at γ=0, without a draft;
- ``ours-auto-unmasked``: ``ours-auto`` with the draft sampling from its own
  logits, not under the grammar's mask (exact too, docs/math.md §11);
- ``server-plain``: llama-server without a draft, the schema as its ``json_schema``;
- ``server-md{N}``: llama-server with ``-md`` the draft and ``--spec-draft-n-max N``
  for N in ``--draft-max`` (the report takes the best N per setting).

Reported: medians of per-block ratios of decode tok/s [bootstrap 95%
interval], the share of tokens the grammar forced, α masked and unmasked,
and the share of outputs ``jsonschema`` accepts.  Writes
bench/results/structured/structured_results.json and its section of
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from .common import (
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
from .suite import F32, Q4_0

SECTION = "## Structured output: JSON schemas, ours against llama-server"
N_CTX = 2048
MAX_TOKENS = 256
SETTINGS = {"t0": ("T=0 (greedy)", 0.0, 1.0), "t0.7": ("T=0.7, top_p=0.95", 0.7, 0.95)}

_NAME = {"type": "string", "minLength": 1, "maxLength": 40}
#: (name, instruction, schema)
WORKLOAD = [
    ("invoice", "Extract the invoice as JSON: Invoice 2291 from Northwind Traders, dated 2024-03-05, for "
     "3 boxes of green tea at 4.50 each and 1 kettle at 29.99.",
     {"type": "object", "properties": {
         "number": {"type": "integer"}, "vendor": _NAME, "date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
         "items": {"type": "array", "minItems": 1, "maxItems": 6, "items": {"type": "object", "properties": {
             "description": _NAME, "quantity": {"type": "integer", "minimum": 1, "maximum": 1000},
             "unit_price": {"type": "number", "minimum": 0}},
             "required": ["description", "quantity", "unit_price"], "additionalProperties": False}}},
      "required": ["number", "vendor", "date", "items"], "additionalProperties": False}),
    ("contact", "Extract the contact as JSON: Dr. Amelia Hart, cardiologist at St. Mary's Hospital, "
     "phone 555-0142, email a.hart@stmarys.example.",
     {"type": "object", "properties": {
         "name": _NAME, "title": _NAME, "organization": _NAME, "phone": _NAME,
         "email": {"type": "string", "maxLength": 60}},
      "required": ["name", "organization"], "additionalProperties": False}),
    ("review", "Classify this review as JSON (sentiment, a 1-5 rating, and the topics it mentions): "
     "'Shipping took three weeks and the box was crushed, but the blender itself works great.'",
     {"type": "object", "properties": {
         "sentiment": {"enum": ["positive", "negative", "mixed", "neutral"]},
         "rating": {"type": "integer", "minimum": 1, "maximum": 5},
         "topics": {"type": "array", "maxItems": 5, "items": {"enum": ["shipping", "packaging", "quality",
                                                                        "price", "service"]}}},
      "required": ["sentiment", "rating", "topics"], "additionalProperties": False}),
    ("people", "List every person with their age and city as JSON: Tom (31) lives in Leeds; his sister "
     "Ann, 28, moved to Bristol; their father Jim is 63 and still in Leeds.",
     {"type": "object", "properties": {"people": {"type": "array", "minItems": 1, "maxItems": 6, "items": {
         "type": "object", "properties": {"name": _NAME, "age": {"type": "integer", "minimum": 0, "maximum": 130},
                                          "city": _NAME},
         "required": ["name", "age", "city"], "additionalProperties": False}}},
      "required": ["people"], "additionalProperties": False}),
    ("weather_call", "Call the weather tool for Paris and Lyon in celsius, for the next 3 days. Answer with "
     "the call as JSON.",
     {"type": "object", "properties": {"name": {"const": "get_forecast"}, "arguments": {
         "type": "object", "properties": {
             "cities": {"type": "array", "minItems": 1, "maxItems": 4, "items": _NAME},
             "unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1, "maximum": 14}},
         "required": ["cities", "unit", "days"], "additionalProperties": False}},
      "required": ["name", "arguments"], "additionalProperties": False}),
    ("search_call", "Call the code search tool to find Python functions named parse_date in the repository "
     "acme/utils, at most 10 results. Answer with the call as JSON.",
     {"type": "object", "properties": {"name": {"const": "search_code"}, "arguments": {
         "type": "object", "properties": {
             "query": _NAME, "repository": _NAME, "language": {"enum": ["python", "go", "rust", "java"]},
             "max_results": {"type": "integer", "minimum": 1, "maximum": 100}},
         "required": ["query", "repository", "language", "max_results"], "additionalProperties": False}},
      "required": ["name", "arguments"], "additionalProperties": False}),
]


def valid(text: str, schema: dict) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


class Ours(OursSingle):
    """One in-process decoder of this checkout (γ fixed by the engine), the
    draft's proposals masked by the grammar or not."""

    def __init__(self, gamma: Any, *, draft: bool = True, mask_draft: bool = True) -> None:
        super().__init__(gamma, draft=draft, n_ctx=N_CTX)
        self.mask_draft = mask_draft

    def start(self, k: int, threads: int) -> None:
        super().start(k, threads)
        self.dec._loop.core.mask_draft = self.mask_draft

    def run(self, text: str, schema: dict, temperature: float, top_p: float, seed: int) -> Dict[str, Any]:
        from specdec_cpu import SamplingParams

        params = SamplingParams(temperature=temperature, top_p=top_p, seed=seed)
        self.dec.reset()  # every engine starts from an empty cache (the servers: cache_prompt off)
        t0 = time.perf_counter()
        gen = self.dec.generate(text, max_tokens=MAX_TOKENS, params=params, grammar=schema)
        s = gen.stats
        return {"tps": s.tokens_per_second, "tokens": s.tokens, "wall_s": time.perf_counter() - t0,
                "forced": s.forced, "drafted": s.drafted, "accepted": s.accepted,
                "mean_alpha": s.mean_alpha if s.alpha_rows else None,
                "mean_gamma": statistics.fmean(s.gammas) if s.gammas else 0.0, "valid": valid(gen.text, schema),
                "finish_reason": gen.finish_reason}


def server_run(url: str, text: str, schema: dict, temperature: float, top_p: float, seed: int) -> Dict[str, Any]:
    r = llama_server.server_complete(url, text, MAX_TOKENS, temperature=temperature, top_p=top_p, seed=seed,
                                     cache_prompt=False, extra={"json_schema": schema})
    return {"tps": r.tokens_per_s, "tokens": r.n_predicted, "wall_s": r.wall_seconds,
            "acceptance": r.acceptance, "valid": valid(r.text, schema)}


def run(args) -> Dict[str, Any]:
    from specdec_cpu.demo_models import ensure_model

    target, draft = ensure_model(F32), ensure_model(Q4_0)
    peer_paths = llama_cli.ensure_peers()
    engines = ["ours-auto", "ours-g0", "ours-auto-unmasked", "server-plain", *(f"server-md{n}" for n in args.draft_max)]
    results: Dict[str, Any] = {
        "command": args.command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine_info(args.threads), "versions": versions(peer_paths), "engines": engines,
        "settings": args.settings, "blocks": args.blocks, "max_tokens": MAX_TOKENS, "runs": [], "complete": False}
    out = args.output_dir / "structured_results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        say("loading our decoders and starting the llama-servers")
        ours = {"ours-auto": Ours("auto"), "ours-g0": Ours(0, draft=False),
                "ours-auto-unmasked": Ours("auto", mask_draft=False)}
        for o in ours.values():
            o.start(1, args.threads)
            stack.callback(o.stop)
        servers = llama_server.start_servers(stack, target, draft, args.draft_max, ctx=N_CTX, threads=args.threads)
        runner = {e: o.run for e, o in ours.items()} | {e: partial(server_run, url) for e, url in servers.items()}
        tok = ours["ours-g0"].dec.tokenizer
        block = 0
        try:
            _, instruction, schema = WORKLOAD[0]  # warm-up: every engine once, not recorded
            text = tok.chat_prompt([{"role": "user", "content": instruction}])
            for e in engines:
                runner[e](text, schema, 0.0, 1.0, 0)
            for sid in args.settings:
                label, temperature, top_p = SETTINGS[sid]
                for b in range(args.blocks):
                    name, instruction, schema = WORKLOAD[b % len(WORKLOAD)]
                    text = tok.chat_prompt([{"role": "user", "content": instruction}])
                    seed = args.seed + block
                    for pos, e in enumerate(rotated(engines, block)):
                        rec = paired_run(lambda: runner[e](text, schema, temperature, top_p, seed),
                                         (RuntimeError, llama_server.PeerRunError, ValueError),
                                         engine=e, setting=sid, block=block, prompt=name, seed=seed, position=pos)
                        results["runs"].append(rec)
                        say(f"{sid} block {block} ({name}) {e:18s} " + (
                            f"ERROR {rec['error']}" if rec.get("error") else
                            f"{rec['tps']:6.2f} tok/s  {rec['tokens']} tokens  valid {rec['valid']}"
                            + (f"  forced {rec['forced']}  α {rec['mean_alpha']}" if e in ours else "")))
                    block += 1
                    out.write_text(json.dumps(results, indent=1))
            results["complete"] = True
        except KeyboardInterrupt:
            say("interrupted: writing what was measured so far")
    results["finished"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return results


def best_server(runs, sid: str) -> Optional[str]:
    """The llama-server mode with the highest median decode tok/s at ``sid``."""
    meds = {e: median(r["tps"] for r in runs if r["engine"] == e and r["setting"] == sid)
            for e in {r["engine"] for r in runs if r["engine"].startswith("server-")}}
    meds = {e: m for e, m in meds.items() if m}
    return max(meds, key=meds.get) if meds else None


def render(results: Dict[str, Any], data: str = "structured_results.json") -> str:
    runs = results["runs"]
    m, v = results["machine"], results["versions"]
    L = [SECTION, "", "Generated by `python -m bench.structured` (every run in "
         f"[structured_results.json]({data})):", "", "```", results["command"], "```", "",
         f"- {results['date']}{'' if results.get('complete') else ' (interrupted: partial)'}; F32 target, Q4_0 "
         f"draft (the demo pair); up to {results['max_tokens']} tokens per answer (the schema ends it); "
         f"{m.get('cpu')}, {m.get('cores')} cores; llama.cpp {v.get('llama_cpp', '?')}. Blocks: one of the six "
         "prompts of the workload at one setting, every engine once, in an order rotated from block to block; "
         "no prompt cache (every engine decodes the prompt).",
         "- Ratios: median of per-block ratios of decode tok/s [bootstrap 95% interval]; the best llama-server "
         "mode is chosen per setting by its median. Forced: tokens the grammar forced / tokens. α: mean exact "
         "acceptance of the draft model's rows (masked: the draft samples under the grammar's mask, as ours "
         "runs; unmasked: from its own logits).", ""]
    L += ["| setting | best llama-server | ours-auto / best server | ours-auto / server-plain | "
          "ours-auto / ours-g0 | forced share | α masked | α unmasked | valid (ours-auto, ours-g0, servers) |",
          "|---|---|---|---|---|---|---|---|---|"]
    for sid in results["settings"]:
        if not any(r["setting"] == sid for r in runs):
            continue
        best = best_server(runs, sid)
        auto = [r for r in runs if r["setting"] == sid and r["engine"] == "ours-auto" and r.get("tps")]
        unm = [r for r in runs if r["setting"] == sid and r["engine"] == "ours-auto-unmasked" and r.get("tps")]
        forced = sum(r["forced"] for r in auto) / max(sum(r["tokens"] for r in auto), 1)

        def share(es) -> str:
            rs = [r for r in runs if r["setting"] == sid and r["engine"] in es and not r.get("error")]
            return f"{sum(r['valid'] for r in rs)}/{len(rs)}"
        L.append(f"| {SETTINGS[sid][0]} | {best} | {ratio_text(paired_ratios(runs, 'ours-auto', best, sid))} | "
                 f"{ratio_text(paired_ratios(runs, 'ours-auto', 'server-plain', sid))} | "
                 f"{ratio_text(paired_ratios(runs, 'ours-auto', 'ours-g0', sid))} | {forced:.0%} | "
                 f"{median(r['mean_alpha'] for r in auto) or 0:.3f} | "
                 f"{median(r['mean_alpha'] for r in unm) or 0:.3f} | "
                 f"{share({'ours-auto'})}, {share({'ours-g0'})}, "
                 f"{share({e for e in results['engines'] if e.startswith('server-')})} |")
    L += ["", "| setting | engine | tok/s (median) | tokens (median) | mean γ | valid |", "|---|---|---|---|---|---|"]
    for sid in results["settings"]:
        for e in results["engines"]:
            rs = [r for r in runs if r["setting"] == sid and r["engine"] == e and r.get("tps")]
            if rs:
                L.append(f"| {SETTINGS[sid][0]} | {e} | {median(r['tps'] for r in rs):.2f} | "
                         f"{median(r['tokens'] for r in rs):.0f} | "
                         f"{median(r.get('mean_gamma') for r in rs) or 0:.2f} | "
                         f"{sum(r['valid'] for r in rs)}/{len(rs)} |")
    errors = [r for r in runs if r.get("error")]
    if errors:
        L += ["", f"{len(errors)} run(s) failed, e.g. {errors[0]['engine']}: {errors[0]['error'][:200]}"]
    return "\n".join(L) + "\n"


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.structured", description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", default="t0,t0.7", help="comma-separated: t0, t0.7")
    ap.add_argument("--blocks", type=int, default=12, help="blocks per setting (prompts rotate)")
    ap.add_argument("--draft-max", default="4,8,16", help="llama-server --spec-draft-n-max values to run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="one block per setting, one draft-max (8)")
    ap.add_argument("--output-dir", type=Path, default=results_dir("structured"))
    ap.add_argument("--report-only", type=Path, default=None, metavar="RESULTS.json")
    args = ap.parse_args(argv)
    args.settings = [s for s in args.settings.split(",") if s]
    args.draft_max = [int(n) for n in args.draft_max.split(",") if n]
    if args.quick:
        args.blocks, args.draft_max = 1, [8]
    args.command = "python -m bench.structured " + " ".join(argv if argv is not None else sys.argv[1:])
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    results = json.loads(args.report_only.read_text()) if args.report_only else run(args)
    print(publish("structured", results, render, SECTION, output_dir=args.output_dir, name="structured_results.json",
                  report_only=args.report_only))
    return 0


if __name__ == "__main__":
    sys.exit(main())
