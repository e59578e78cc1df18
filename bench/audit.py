"""Is it exact?  Every engine's sampled token ids audited against the target.

    python -m bench audit                  # the full run: >= 20,000 audited tokens per engine and setting
    python -m bench audit --quick          # ~1,000 per engine and setting, to check the pipeline
    python -m bench audit --dry-run        # the engines, settings and estimated duration
    python -m bench audit --report-only    # re-render the section and plot from bench/results/audit/results.json

Every engine generates sequences of the demo pair (F32 target, Q4_0 draft) from many chat prompts, each with its
own seed, and reports the token ids it sampled (its ``ids_from`` says from where; never its text tokenized again),
which ``specdec_cpu.audit`` scores against the target with the engine's sampler chain (docs/audit.md).
"""

from __future__ import annotations

import argparse
import difflib
import gzip
import json
import math
import os
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .common import (
    BENCH,
    RESULTS_MD,
    command_line,
    link,
    machine_info,
    notes_of,
    results_dir,
    say,
    versions,
    write_section,
)
from .engines import llama_cli
from .engines.base import META_FIELDS, N_CTX, Ctx, Engine, Job, Sample
from .engines.llama_cpp_python import LcpPromptLookup
from .engines.llama_server import LlamaServer
from .engines.ours_batched import OursBatched
from .engines.ours_single import OursSingle
from .prompts import PROMPTS as SUITE_PROMPTS
from .serving import USER_PROMPTS
from .suite import F32, Q4_0, SETTINGS, Setting

SECTION = "## Is it exact?"
FORMAT = 1
FULL_TOKENS = 20000  # audited tokens per engine and setting of the full run
DRAFT_MAX = 4  # ours γ = 4 and the peers' --spec-draft-n-max
AUDIT_SETTINGS: Tuple[str, ...] = ("t1", "t0.7")

# --- prompts: open requests, and grounded ones whose answer copies text of the prompt ---

_CSV = """\
date,store,item,units,unit_price
2024-03-01,north,notebook,12,2.50
2024-03-01,south,pen,40,0.80
2024-03-02,north,stapler,3,7.25
2024-03-02,east,notebook,9,2.50
2024-03-03,south,folder,25,1.10
2024-03-03,east,pen,31,0.80
"""
_BUGGY = '''\
def moving_average(values, window):
    """Return the list of averages of each run of `window` consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    averages = []
    total = sum(values[:window])
    averages.append(total / window)
    for i in range(window, len(values)):
        total += values[i] - values[i - window + 1]
        averages.append(total / window)
    return averages
'''
_JS_SOURCE = '''\
def parse_duration(text):
    """Parse strings such as '1h30m', '45s' or '2h' into a number of seconds."""
    units = {"h": 3600, "m": 60, "s": 1}
    total = 0
    number = ""
    for char in text.strip():
        if char.isdigit():
            number += char
        elif char in units and number:
            total += int(number) * units[char]
            number = ""
        else:
            raise ValueError(f"bad duration: {text!r}")
    if number:
        raise ValueError(f"missing unit in {text!r}")
    return total
'''
_NOTES = (
    "Meeting notes, 14 May. Attendees: Priya, Tom, Aiko, Marcus. Priya reported that the beta signup form went live "
    "on Monday and collected 312 signups by Wednesday, well above the 200 expected. Tom said the email confirmation "
    "step fails for addresses with a plus sign and promised a fix by Friday. Aiko proposed moving the launch from 3 "
    "June to 10 June so that the onboarding videos can be re-recorded with the new interface; Marcus agreed but "
    "asked for the press release to stay on 3 June with the date corrected. The team decided to drop the dark mode "
    "from the first release. Next meeting: 21 May, same time."
)
_OPEN = {
    "binary-search": "Implement binary search in C and explain the loop invariant.",
    "rust-ownership": "Explain Rust's ownership and borrowing rules to a Python programmer.",
    "git-rebase": "When should I use git rebase instead of git merge? Give an example workflow.",
    "regex-email": "Write a regular expression that roughly validates email addresses and explain each part of it.",
    "poem-autumn": "Write a poem of four stanzas about autumn in a big city.",
    "dialogue": "Write a dialogue between a cat and a dog arguing about who is the better pet.",
    "recipe": "Give me a simple recipe for a vegetable curry that serves four people.",
    "trip-plan": "Plan a three-day trip to Lisbon for someone who loves history and food.",
    "interview": "What are good questions to ask at the end of a job interview for a software engineering role?",
    "big-o": "Explain big-O notation with examples of O(1), O(log n), O(n) and O(n^2) code.",
    "docker": "Write a Dockerfile for a small Flask application and explain each line.",
    "unit-tests": "Write pytest unit tests for a function `is_palindrome(s)` that ignores case and punctuation.",
    "async-io": "Explain the difference between threads and asyncio in Python, and when each is the better choice.",
    "email-late": "Write a polite email to a client explaining that their project will be delivered one week late.",
    "photosynthesis": "Explain photosynthesis to a ten-year-old.",
    "linked-list": "Implement a singly linked list in Java with add, remove and reverse methods.",
    "kv-store": "Design a simple key-value store: which data structures and which trade-offs would you choose, and "
    "why?",
    "numbers-game": "Write a Python program for a number-guessing game in the terminal.",
    "history-print": "Summarise the history of the printing press in a few paragraphs.",
    "debug-tips": "My Python program gets slower the longer it runs. How do I find out why?",
    "riddle": "Invent three riddles with their answers.",
    "css-center": "Show three different ways to center a div horizontally and vertically in CSS.",
    "matrix-mult": "Write a function that multiplies two matrices in Go, with error handling for incompatible sizes.",
    "habits": "How can I build a habit of reading every day? Give practical advice.",
}
_GROUNDED = {
    "fix-bug": "This function returns wrong averages. Find the bug, explain it in one sentence, and reply with the "
    "corrected function.\n\n```python\n" + _BUGGY + "```",
    "to-js": "Translate this Python function to JavaScript, keeping the names and the docstring as a comment.\n\n"
    "```python\n" + _JS_SOURCE + "```",
    "type-hints": "Add type hints to this function and reply with the complete function.\n\n```python\n"
    + _JS_SOURCE + "```",
    "csv-json": "Convert this CSV data to a JSON array of objects, one object per row.\n\n" + _CSV,
    "csv-table": "Reformat this CSV data as a Markdown table.\n\n" + _CSV,
    "notes-actions": "List the decisions and the action items from these meeting notes, quoting the notes.\n\n"
    + _NOTES,
    "notes-email": "Rewrite these meeting notes as an email to the team, keeping every fact.\n\n" + _NOTES,
}
_SERVING_NAMES = ("merge-sorted", "hash-table", "lighthouse", "clean-code", "sql-top5", "tcp-udp", "backup-sh",
                  "closures-js")
#: (name, kind, user message): the suite's prompts, the serving benchmark's requests, then the ones above.
AUDIT_PROMPTS: Tuple[Tuple[str, str, str], ...] = (
    tuple((p.name, p.kind, p.user) for p in SUITE_PROMPTS)
    + tuple((name, "open", text) for name, text in zip(_SERVING_NAMES, USER_PROMPTS))
    + tuple((name, "open", text) for name, text in _OPEN.items())
    + tuple((name, "grounded", text) for name, text in _GROUNDED.items())
)


class Jobs:
    """Job j is prompt j mod P (consecutive sequences come from different prompts) with its own seed."""

    def __init__(self, tokenizer, seed: int, setting_index: int) -> None:
        self.prompts = []
        for name, _kind, user in AUDIT_PROMPTS:
            text = tokenizer.chat_prompt([{"role": "user", "content": user}], add_generation_prompt=True)
            if text is None:
                raise RuntimeError("the target has no chat template")
            self.prompts.append((name, text, tuple(tokenizer.tokenize(text, add_special=True, parse_special=True))))
        self.seed = seed + 100_000 * setting_index

    def take(self, start: int, n: int) -> List[Job]:
        return [Job(j, *self.prompts[j % len(self.prompts)], self.seed + j) for j in range(start, start + n)]


# --- engines ---

_AT_ONCE = "{parallel} sequences at once"
ENGINES: Dict[str, Callable[[], Engine]] = {
    "ours-g4": lambda: OursSingle(DRAFT_MAX, id="ours-g4", label=f"ours, SpeculativeDecoder γ={DRAFT_MAX}"),
    "ours-auto": lambda: OursSingle("auto", id="ours-auto", label="ours, SpeculativeDecoder γ=auto"),
    "ours-batched-auto": lambda: OursBatched("auto", id="ours-batched-auto",
                                             label=f"ours, BatchedDecoder, draft model, γ=auto, {_AT_ONCE}"),
    "ours-ngram": lambda: OursBatched("auto", draft=False, ngram=True, id="ours-ngram",
                                      label=f"ours, BatchedDecoder, n-gram lookup (no draft model), {_AT_ONCE}"),
    "ours-plain": lambda: OursBatched(0, draft=False, control=True, id="ours-plain",
                                      label=f"ours, BatchedDecoder, plain (γ=0), {_AT_ONCE}"),
    "llama-speculative": lambda: llama_cli.SpeculativeTool("speculative", DRAFT_MAX),
    "llama-speculative-simple": lambda: llama_cli.SpeculativeTool("speculative-simple", DRAFT_MAX),
    "llama-server-md": lambda: LlamaServer(
        DRAFT_MAX, id="llama-server-md",
        label=f"llama.cpp llama-server -md --spec-type draft-simple (draft-n-max {DRAFT_MAX}, {{parallel}} slots)"),
    "lcp-pld": LcpPromptLookup,
    "llama-server-plain": lambda: LlamaServer(None, id="llama-server-plain", control=True,
                                              label="llama.cpp llama-server, no draft ({parallel} slots)"),
}

#: For --dry-run: tokens/s at 2 threads on the 2-core reference machine and seconds of fixed cost per sequence.
RATES: Dict[str, Tuple[float, float]] = {
    "ours-g4": (25.0, 0.1), "ours-auto": (25.0, 0.1), "ours-batched-auto": (40.0, 0.0),
    "ours-ngram": (35.0, 0.0), "ours-plain": (35.0, 0.0),
    "llama-speculative": (18.0, 4.5), "llama-speculative-simple": (20.0, 4.5),
    "llama-server-md": (35.0, 0.0), "lcp-pld": (15.0, 0.2), "llama-server-plain": (35.0, 0.0),
}
INFORMATIVE: Dict[str, float] = {"t1": 1.0, "t0.7": 0.55}  # share of positions that are not single-token
MEAN_LENGTH = 0.7  # mean new tokens per sequence, as a share of --max-tokens
SCORE_RATE = 60.0  # rows per second the audit scores
ROUND_TOKENS = 4096  # most tokens one round generates (progress is saved after each round)


# --- running ---


def _hms(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _by_prompt(job: int) -> Tuple[int, int]:
    """Scoring order: a prompt's sequences back to back (the audit keeps the prompt's context between them)."""
    return job % len(AUDIT_PROMPTS), job


def retokenization(ctx: Ctx, samples: Sequence[Sample]) -> Dict[str, Any]:
    """How often tokenizing the emitted text again gives other ids than were sampled."""
    out = dict.fromkeys(("sequences", "sequences_changed", "tokens", "tokens_changed"), 0)
    for s in (s for s in samples if s.tokens):
        again = ctx.tokenizer.tokenize(ctx.render(s.tokens).decode("utf-8", "replace"), add_special=False,
                                       parse_special=True)
        out["sequences"] += 1
        out["tokens"] += len(s.tokens)
        if again != s.tokens:
            out["sequences_changed"] += 1
            ops = difflib.SequenceMatcher(a=s.tokens, b=again, autojunk=False).get_opcodes()
            out["tokens_changed"] += sum(i2 - i1 for tag, i1, i2, _, _ in ops if tag != "equal")
    return out


def read_samples(path: Path):
    """The audit's GeneratedSequence objects of a samples file (gzipped JSONL)."""
    from specdec_cpu.audit import parse_lines

    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return parse_lines(fh.readlines(), path.name)


def _progress_path(samples_path: Path) -> Path:
    """What an unfinished run keeps beside its samples for --resume (metadata, next job, time spent)."""
    return samples_path.with_name(samples_path.name.replace(".jsonl.gz", ".progress.json"))


def _load_progress(path: Path, key: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """An earlier, unfinished run of the same key (or None)."""
    progress = _progress_path(path)
    if not (path.is_file() and progress.is_file()):
        return None
    state = json.loads(progress.read_text())
    if state["key"] != json.loads(json.dumps(key)):
        return None
    records = [json.loads(line) for line in gzip.open(path, "rt", encoding="utf-8")]
    if len(records) != len(state["sequence_meta"]):
        return None  # the two files disagree: start over rather than guess
    state["samples"] = [
        Sample(**{**dict(zip(META_FIELDS, m)), "tokens": [int(t) for t in r["tokens"]], "stopped": bool(r["stopped"])},
               text=r["prompt"], passes=p)
        for r, m, p in zip(records, state["sequence_meta"], state["passes"])]
    return state


def _save_progress(path: Path, key: Dict[str, Any], samples: Sequence[Sample], **state: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(s.record(), ensure_ascii=False) + "\n" for s in samples)
    os.replace(tmp, path)
    progress = _progress_path(path)
    tmp = progress.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": key, "sequence_meta": [s.meta() for s in samples],
                               "passes": [s.passes for s in samples], **state}) + "\n")
    os.replace(tmp, progress)


def run_engine_setting(engine: Engine, setting: Setting, ctx: Ctx, model, args) -> Dict[str, Any]:
    """Generate and score rounds of sequences until ``args.tokens`` positions are audited (saved after each round;
    with ``args.resume`` an unfinished run of the same key is continued)."""
    from specdec_cpu.audit import AuditSession, GeneratedSequence

    jobs = Jobs(ctx.tokenizer, args.seed, AUDIT_SETTINGS.index(setting.id))
    session = AuditSession(model, setting.params(), chain=engine.chain)
    path = args.output_dir / "samples" / setting.id / f"{engine.id}.jsonl.gz"
    key = {"tokens_target": args.tokens, "max_tokens": args.max_tokens, "seed": args.seed,
           "setting": asdict(setting)}

    def score(new: Sequence[Sample], first_line: int) -> float:
        t0 = time.monotonic()
        numbered = sorted(((s, first_line + i) for i, s in enumerate(new)), key=lambda x: _by_prompt(x[0].job))
        session.add([GeneratedSequence(prompt=s.text, tokens=s.tokens, stopped=s.stopped, source=f"{path.name}:{n}")
                     for s, n in numbered])
        return time.monotonic() - t0

    samples: List[Sample] = []
    errors: List[str] = []
    rounds, next_job, gen_s, score_s = 0, 0, 0.0, 0.0
    earlier = _load_progress(path, key) if args.resume else None
    if earlier is not None:
        samples, errors, rounds, next_job, gen_s, score_s = (earlier[k] for k in (
            "samples", "failed_sequences", "rounds", "next_job", "generate_seconds", "score_seconds"))
        score_s += score(samples, 1)
        say(f"{engine.id} {setting.id}: continuing an unfinished run ({len(samples)} sequences, {rounds} rounds, "
            f"{session.tokens} / {args.tokens} audited tokens)")
    per_round = max(1, ROUND_TOKENS // max(int(MEAN_LENGTH * args.max_tokens), 1))
    while session.tokens < args.tokens:
        remaining = args.tokens - session.tokens
        if session.tokens > 0 and next_job > 0:
            n = math.ceil(1.05 * remaining / max(session.tokens / next_job, 1.0))
        else:  # first round: ~80% of the estimate, the next rounds use what was measured
            n = math.ceil(0.8 * remaining / (MEAN_LENGTH * args.max_tokens * INFORMATIVE[setting.id]))
        n = min(max(n, 1), per_round)
        if engine.parallel > 1:
            n = engine.parallel * math.ceil(n / engine.parallel)
        batch = jobs.take(next_job, n)
        next_job += n
        rounds += 1
        t0 = time.monotonic()
        new = engine.run(batch, setting)
        dt = time.monotonic() - t0
        gen_s += dt
        failed = [s for s in new if s.error]
        errors += [f"job {s.job}: {s.error}" for s in failed]
        if len(failed) > max(2, len(new) // 10):
            raise RuntimeError(f"{engine.id}: {len(failed)} of {len(new)} sequences failed: {failed[0].error}")
        new = [s for s in new if not s.error]
        samples += new
        n_new = sum(len(s.tokens) for s in new)
        score_s += score(new, len(samples) - len(new) + 1)
        _save_progress(path, key, samples, next_job=next_job, rounds=rounds, failed_sequences=errors,
                       generate_seconds=round(gen_s, 1), score_seconds=round(score_s, 1))
        say(f"{engine.id} {setting.id} round {rounds}: {len(new)} sequences, {n_new} tokens in {dt:.0f} s "
            f"({n_new / dt if dt > 0 else 0:.1f} tok/s); audited {session.tokens} / {args.tokens} "
            f"({session.positions} positions, {session.accumulator.point_mass} single-token)")
    report = session.report()
    _progress_path(path).unlink(missing_ok=True)  # complete: results.json holds it now

    def total(field: str) -> Optional[int]:
        values = [getattr(s, field) for s in samples if getattr(s, field) is not None]
        return sum(values) if values else None

    checks = [s.text_check for s in samples if s.text_check is not None]
    emitted = sum(len(s.tokens) for s in samples)
    return {
        "engine": engine.id, "label": engine.label, "setting": setting.id, "setting_label": setting.label,
        "chain": engine.chain, "ids_from": engine.ids_from, "control": engine.control,
        "command": engine.command(),
        "report": _report_record(report), "verdict": report.verdict,
        "sequences": len(samples), "stopped": sum(s.stopped for s in samples), "emitted": emitted,
        "drafted": total("drafted"), "accepted": total("accepted"), "target_passes": total("passes"),
        "text_checks": len(checks), "text_mismatches": sum(1 for c in checks if not c),
        "failed_sequences": errors,
        "rounds": rounds, "generate_seconds": round(gen_s, 1), "score_seconds": round(score_s, 1),
        "tokens_per_second": emitted / gen_s if gen_s > 0 else None,
        "retokenization": retokenization(ctx, samples),
        "samples_file": str(path.relative_to(args.output_dir)),
        "sequence_fields": META_FIELDS,
        "sequence_meta": [s.meta() for s in samples],
        "tokens_target": args.tokens, "max_tokens": args.max_tokens,
        "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def _report_record(report) -> Dict[str, Any]:
    """An AuditReport as results.json keeps it (the first 20 mismatches of each kind, and their counts)."""
    rep = report.to_dict()
    rep["target"] = Path(rep["target"]).name  # the file, not where this machine keeps it
    for key in ("mismatches", "impossible"):
        rep[key + "_count"] = len(rep[key])
        rep[key] = rep[key][:20]
    return rep


def rescore(args: argparse.Namespace, command: str) -> Dict[str, Any]:
    """Score the saved samples of the named finished runs again with the current audit (nothing generated)."""
    from specdec_cpu.audit import AuditSession, TargetModel
    from specdec_cpu.demo_models import ensure_model

    res_path = args.output_dir / "results.json"
    results = load_results(res_path)
    runs = [r for r in results.get("runs", []) if r["engine"] in args.engines and r["setting"] in args.settings]
    if not runs:
        raise SystemExit(f"no finished run of {', '.join(args.engines)} × {', '.join(args.settings)} in {res_path}")
    model = TargetModel(ensure_model(F32), n_threads=args.threads)
    try:
        for rec in runs:
            t0 = time.monotonic()
            jobs = [m[META_FIELDS.index("job")] for m in rec["sequence_meta"]]
            seqs = read_samples(args.output_dir / rec["samples_file"])
            with AuditSession(model, SETTINGS[rec["setting"]].params(), chain=rec["chain"]) as session:
                session.add([seqs[i] for i in sorted(range(len(seqs)), key=lambda i: _by_prompt(jobs[i]))])
                report = session.report()
            rec["report"], rec["verdict"] = _report_record(report), report.verdict
            rec["rescored"] = {"command": command, "seconds": round(time.monotonic() - t0, 1),
                               "finished": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
            r = rec["report"]
            say(f"{rec['engine']} {rec['setting']}: rescored: {report.verdict} — {r['tokens']} tokens, "
                f"chi-square {_p_eq(r['chi2_p'])}, z = {r['z']:+.2f}, {r['near_ties']} near ties, "
                f"{len(report.real_impossible)} impossible and {len(report.real_mismatches)} point-mass "
                f"mismatches beyond the tie tolerance")
            save_results(results, res_path)
    finally:
        model.close()
    return results


def load_results(path: Path) -> Dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def save_results(results: Dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1, ensure_ascii=False, default=str) + "\n")
    os.replace(tmp, path)


def run(args: argparse.Namespace, command: str) -> Dict[str, Any]:
    from specdec_cpu.audit import TargetModel
    from specdec_cpu.demo_models import ensure_model

    res_path = args.output_dir / "results.json"
    old = load_results(res_path) if args.resume else {}
    done = {(r["engine"], r["setting"]): r for r in old.get("runs", [])
            if r["tokens_target"] == args.tokens and r["max_tokens"] == args.max_tokens}
    # --resume keeps every earlier run of these sizes (a full audit can be run piecewise) and adds its time.
    kept = [r for (eid, sid), r in done.items() if eid not in args.engines or sid not in args.settings]
    target, draft = ensure_model(F32), ensure_model(Q4_0)
    try:
        peers = llama_cli.ensure_peers(log=None)
    except (OSError, llama_cli.PeerBuildError):
        peers = None
    results: Dict[str, Any] = {
        "format": FORMAT, "command": command, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "config": {"tokens": args.tokens, "max_tokens": args.max_tokens, "threads": args.threads,
                   "parallel": args.parallel, "seed": args.seed, "engines": args.engines,
                   "settings": args.settings, "draft_max": DRAFT_MAX, "n_ctx": N_CTX,
                   "target": F32, "draft": Q4_0, "prompts": [p[0] for p in AUDIT_PROMPTS]},
        "settings": {s: asdict(SETTINGS[s]) for s in args.settings},
        "machine": machine_info(args.threads), "versions": versions(peers),
        "runs": kept, "errors": [],
    }
    if done:  # the section names every command whose runs it shows
        results["command"], results["started"] = f"{old['command']}`, then `{command}", old["started"]
    for r in kept:
        results["settings"].setdefault(r["setting"], old["settings"][r["setting"]])
    t_start = time.monotonic() - (old["duration_seconds"] if done else 0)
    model = TargetModel(target, n_threads=args.threads)
    try:
        ctx = Ctx(target, draft, args.threads, args.parallel, args.max_tokens, model.tokenizer)
        for eid in args.engines:
            for s in args.settings:
                if (eid, s) in done:
                    say(f"{eid} {s}: kept from {res_path} (--resume)")
                    results["runs"].append(done[(eid, s)])
            todo = [s for s in args.settings if (eid, s) not in done]
            if not todo:
                continue
            engine = ENGINES[eid]()
            t0 = time.monotonic()
            try:
                engine.start_audit(ctx)
            except Exception as exc:  # noqa: BLE001 - record and go on with the other engines
                say(f"{eid}: could not start: {exc}")
                results["errors"].append(f"{eid}: could not start: {str(exc).splitlines()[0][:300]}")
                continue
            say(f"{eid}: started in {time.monotonic() - t0:.0f} s ({engine.label})")
            try:
                for sid in todo:
                    try:
                        rec = run_engine_setting(engine, SETTINGS[sid], ctx, model, args)
                    except Exception as exc:  # noqa: BLE001
                        say(f"{eid} {sid}: FAILED: {exc}")
                        results["errors"].append(f"{eid} {sid}: {str(exc).splitlines()[0][:300]}")
                        continue
                    results["runs"].append(rec)
                    r = rec["report"]
                    say(f"{eid} {sid}: {rec['verdict']} — {r['tokens']} tokens audited, chi-square "
                        f"{_p_eq(r['chi2_p'])}, z = {r['z']:+.2f}, TV [{r['tv'][0]:.4f}, {r['tv'][1]:.4f}] "
                        f"(generated {rec['generate_seconds']:.0f} s, scored {rec['score_seconds']:.0f} s; "
                        f"elapsed {_hms(time.monotonic() - t_start)})")
                    results["duration_seconds"] = round(time.monotonic() - t_start, 1)
                    save_results(results, res_path)
            finally:
                engine.stop()
    finally:
        model.close()
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    results["duration_seconds"] = round(time.monotonic() - t_start, 1)
    save_results(results, res_path)
    return results


def dry_run(args: argparse.Namespace) -> None:
    """Print the plan and how long it should take on the idle 2-core reference machine."""
    print(f"{len(args.engines)} engines × {len(args.settings)} settings, >= {args.tokens} audited tokens each, "
          f"sequences of <= {args.max_tokens} tokens, {args.threads} threads")
    total = 0.0
    for eid in args.engines:
        rate, fixed = RATES[eid]
        secs = 0.0
        for sid in args.settings:
            emitted = args.tokens / INFORMATIVE[sid] * 1.05
            seqs = emitted / (MEAN_LENGTH * args.max_tokens)
            secs += emitted / rate + seqs * fixed + (emitted + seqs * 150) / SCORE_RATE
        secs += 20.0  # loading
        total += secs
        print(f"  {eid:26s} ≈ {secs / 60:5.1f} min")
    print(f"estimated duration on the idle 2-core reference machine: {_hms(total)}")


# --- report ---


def _p(x: float) -> str:
    return "< 1e-300" if x == 0.0 else f"{x:.2g}" if x < 0.01 else f"{x:.2f}"


def _p_eq(x: float) -> str:
    """``p = 0.52``, or ``p < 1e-300`` where it underflowed."""
    return f"p {_p(x)}" if x == 0.0 else f"p = {_p(x)}"


def _ordered_runs(results) -> List[Dict[str, Any]]:
    """The runs, engine by engine in ENGINES' order."""
    return sorted(results["runs"], key=lambda r: list(ENGINES).index(r["engine"]))


def _setting_text(r) -> str:
    return "T = 1" if r["setting"] == "t1" else "T = 0.7, top-p 0.95"


def _data_dir(out_dir: Path) -> str:
    """The output directory as a user would type it from the checkout's root."""
    try:
        return str(out_dir.resolve().relative_to(BENCH.parent))
    except ValueError:
        return str(out_dir)


def _command_text(results: Dict[str, Any], out_dir: Path) -> str:
    """The command line and its duration; a run made in pieces with --resume records every piece's command."""
    pieces = results["command"].split("`, then `")
    rerender = f"`python -m bench audit --report-only --output-dir {_data_dir(out_dir)}`"
    started = results["started"]
    if len(pieces) == 1:
        hours = results["duration_seconds"] / 3600
        return f"Command: `{pieces[0]}` (started {started}, {hours:.1f} h; re-render with {rerender})."
    base = re.sub(r" --(resume|settings \S+|engines \S+|results-md \S+)(?=\s|$)", "", pieces[0])
    hours = sum(r["generate_seconds"] + r["score_seconds"] for r in results["runs"]) / 3600
    return (f"Command: `{base}`, run in {len(pieces)} pieces with `--resume`, each naming the `--settings` "
            "and `--engines` still to do (results.json's `command` lists them; "
            f"started {started}; {hours:.1f} h of generation and scoring, summed over "
            f"the rows; re-render with {rerender}).")


def render(results: Dict[str, Any], plot_name: Optional[str], out_dir: Path) -> str:
    cfg = results["config"]
    L = [SECTION, ""]
    if cfg["tokens"] < FULL_TOKENS:
        L += [f"**A reduced run: {cfg['tokens']:,} audited tokens per engine and setting, not the "
              f"{FULL_TOKENS:,} of the full audit.** Its power is lower: a pass rules out only a total-variation "
              "gap above the upper end of its interval (the power test in tests/ flags a 0.02 gap within "
              f"{FULL_TOKENS:,} tokens; the interval's width shrinks as one over the square root of the tokens). "
              "`python -m bench audit` runs the full one.", ""]
    L += [_command_text(results, out_dir), "",
          "Every engine's **sampled token ids** scored by `specdec_cpu.audit` against the F32 target's own "
          "distribution at each position (docs/audit.md): rank-bin chi-square with the counts' exact "
          "covariance, surprisal z (negative: the engine picks likely tokens too often), and the 99.9% interval "
          "of the total-variation gap between the engine's and the target's pooled rank-bin laws; the verdict "
          "fails when either p-value is below 1e-3 (the audit's defaults). F32 target, Q4_0 draft "
          f"(Qwen2.5-Coder-0.5B-Instruct); {len(cfg['prompts'])} chat prompts (open requests and "
          "grounded ones whose answer copies the prompt), sequences of at most "
          f"{cfg['max_tokens']} new tokens, each with its own seed, until at least "
          f"{cfg['tokens']:,} informative positions are audited per engine and setting (positions "
          "where the target's distribution is a single token are only checked). *chain*: the sampler order the "
          "audit models — temperature → top-k → top-p → min-p for ours and llama.cpp's tools (run with "
          "`--samplers temperature;top_k;top_p;min_p`), top-k → top-p → min-p → temperature for "
          "llama-cpp-python's `Llama`; at T = 1 untruncated both are the plain softmax.", "",
          "| engine | setting | chain | tokens audited | χ² p | z (p) | TV gap, 99.9% interval | verdict |",
          "|---|---|---|---|---|---|---|---|"]
    runs = _ordered_runs(results)
    for r in runs:
        rep = r["report"]
        outside, ties = rep["impossible_count"] + rep["mismatches_count"], rep["near_ties"]
        extra = "" if not outside else f" ({outside} token{'s' if outside != 1 else ''} outside the support" + (
            (", a near tie" if outside == 1 else ", all near ties") if ties == outside
            else f", {ties} of them near ties") + ")"
        L.append(f"| {r['label']}{' *(control)*' if r['control'] else ''} | {_setting_text(r)} | "
                 f"{r['chain'].replace('temperature-', 'temp-')} | {rep['tokens']:,} | {_p(rep['chi2_p'])} | "
                 f"{rep['z']:+.2f} ({_p(rep['z_p'])}) | [{rep['tv'][0]:.4f}, {rep['tv'][1]:.4f}] | "
                 f"{'pass' if r['verdict'] == 'pass' else '**fail**'}{extra} |")
    L.append("")
    if plot_name:
        L += [f"![surprisal z and TV gap per engine]({plot_name})", ""]
    L += findings(results, out_dir)
    L += ["### How the ids were obtained", "",
          "| engine | setting | ids from | sequences (stopped at EOG) | new tokens | drafted / accepted | "
          "generation tok/s | ids re-render the printed text |",
          "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        da = "–" if not r["drafted"] else f"{r['drafted']:,} / {r['accepted']:,}"
        chk = "–" if not r["text_checks"] else f"{r['text_checks'] - r['text_mismatches']} of {r['text_checks']}"
        tps = "–" if not r["tokens_per_second"] else f"{r['tokens_per_second']:.1f}"
        L.append(f"| {r['label']} | {_setting_text(r)} | {r['ids_from']} | {r['sequences']} ({r['stopped']}) | "
                 f"{r['emitted']:,} | {da} | {tps} | {chk} |")
    L.append("")
    rt = [r["retokenization"] for r in runs if r["engine"].startswith("ours")]
    if rt:
        seqs, ch, toks, cht = (sum(x[k] for x in rt) for k in ("sequences", "sequences_changed", "tokens",
                                                               "tokens_changed"))
        L += [f"Why ids and not text: tokenizing our own engines' emitted text again gives other ids than "
              f"were sampled in {ch} of {seqs} sequences ({cht:,} of {toks:,} ids, "
              f"{100 * cht / max(toks, 1):.2f}%, in the differing stretches); an audit of re-tokenized text "
              "would score those stretches at the wrong ranks.", ""]
    if any(r["drafted"] for r in runs):
        L += ["Drafted / accepted show that speculation really ran (for llama-cpp-python's prompt lookup the "
              "library reports no counts). Generation tok/s is what each engine ran at while audited, with "
              "whatever else the machine did at the time: not a speed comparison (bench/serving.py and "
              "`python -m bench` measure speed side by side).", ""]
    problems = results["errors"] + [
        f"{r['engine']} {r['setting']}: {len(r['failed_sequences'])} sequences failed and were left out "
        f"({r['failed_sequences'][0]})" for r in results["runs"] if r["failed_sequences"]]
    if problems:
        L += ["### Problems", ""] + [f"- {e}" for e in problems] + [""]
    data_dir = _data_dir(out_dir)
    L += ["### Method", "",
          "- Engines: ours — `SpeculativeDecoder` γ = 4 and γ = auto (one sequence at a time), and "
          "`BatchedDecoder` (several sequences share each target pass; exact too) with the draft model at "
          "γ = auto, with prompt lookup and no draft model (`ngram=True`), and plain (γ = 0, control); "
          f"llama.cpp's `llama-speculative` and `llama-speculative-simple` (`--spec-draft-n-max {DRAFT_MAX} "
          "--spec-draft-n-min 0`, one process per sequence), `llama-server -md` (`--spec-type draft-simple`) "
          "and `llama-server` without a draft (control), several slots at once; llama-cpp-python's "
          "`LlamaPromptLookupDecoding`. All from the vendored llama.cpp of the pinned llama-cpp-python, "
          "with their default flash-attention and KV-cache settings; the audit's own pass uses an F16 KV cache "
          "without flash attention (the rounding differences this leaves are far below what 20,000 tokens can "
          "see: docs/audit.md, last section).",
          "- A sequence that drew an end-of-generation token is cut before it and audited with the outcome "
          "'any EOG token' at that position; sequences are cut at the first EOG or at max-tokens, nothing "
          "else, and every sequence started is kept whole.",
          f"- Samples: `{data_dir}/samples/<setting>/<engine>.jsonl.gz`, the audit's input format (`gunzip -k` "
          "it and run `specdec-cpu audit --target F32.gguf --input FILE --temperature … [--top-p 0.95] "
          "[--chain temperature-last]` to re-score one); per-sequence prompt, seed and counts in "
          f"`{data_dir}/results.json`.", ""]
    commands: Dict[str, str] = {}
    for r in results["runs"]:
        if r["command"]:
            commands.setdefault(r["engine"], re.sub(r"(-s) \d+", r"\1 SEED", r["command"]))
    if commands:
        L += ["Engine command lines (one per engine, prompt and seed abbreviated):", ""]
        L += [f"- {e}: `{c}`" for e, c in commands.items()] + [""]
    L += notes_of(out_dir / "results.json")
    return "\n".join(L).rstrip() + "\n"


def _same_sequences(out_dir: Path, by: Dict[Tuple[str, str], Any], a: str, b: str) -> List[str]:
    """Per setting where both engines ran: how many of their sequences (same prompts and seeds) are the same ids."""
    out = []
    for sid in AUDIT_SETTINGS:
        if (a, sid) not in by or (b, sid) not in by:
            continue
        xs, ys = (read_samples(out_dir / by[(e, sid)]["samples_file"]) for e in (a, b))
        same = sum(x.tokens == y.tokens for x, y in zip(xs, ys))
        out.append(f"{same} of {min(len(xs), len(ys))} at {_setting_text(by[(a, sid)])}")
    return out


#: What the source of each llama.cpp-based engine does, biased or exact (the findings' per-engine lines).
_SOURCE = {
    "llama-speculative": (
        "`llama-speculative`", "In examples/speculative/speculative.cpp (`main`, drafting loop) the draft's sampler "
        "draws a token (`common_sampler_sample`) but the token proposed is `cur_p->data[0]`, the draft's *most likely* "
        "token after `common_sampler_get_candidates(…, true)` sorts the candidates — a greedy proposal — while "
        "verification accepts it with probability min(1, p(x)/q(x)), the rule for a *sampled* proposal x ~ q, and "
        "resamples from max(0, p − q). With a greedy proposal x* the emitted law at a drafted position is P(x*) = "
        "min(1, p(x*)/q(x*)) instead of p(x*): whenever the target gives the draft's favourite at least the draft's "
        "probability it is emitted with certainty (and never sampled away), so the output leans to likely tokens "
        "(z < 0). At T < 1 with top-p a second error adds to it: after a rejection both candidate arrays are sorted "
        "by token id and subtracted element by element (`dist_tgt.data[i].p - dist_dft.data[i].p`), which pairs "
        "different tokens as soon as the two nuclei differ. (The stochastic verification came with llama.cpp PR "
        "#5625, whose description already noted that the drafting stayed greedy.)"),
    "llama-speculative-simple": (
        "`llama-speculative-simple`", "Its draft is greedy (common/speculative.cpp, "
        "`common_speculative_impl_draft_simple::draft`: the top candidate), and `common_sampler_sample_and_accept_n` "
        "(common/sampling.cpp) samples the target at every drafted position and keeps a draft token only when the "
        "target's own sample equals it, stopping at the first difference: every emitted token is the target's own "
        "sample given the tokens before it, which is exact whatever the draft proposes (the draft only decides how "
        "many samples one pass yields)."),
    "llama-server-md": (
        "`llama-server -md`", "tools/server/server-context.cpp verifies a slot's draft with the same "
        "`common_sampler_sample_and_accept_n` (draft from common/speculative.cpp's draft-simple), so at T > 0 it is "
        "the match rule of `llama-speculative-simple`: exact, with a lower acceptance than rejection sampling would "
        "give."),
    "lcp-pld": (
        "llama-cpp-python `LlamaPromptLookupDecoding`", "`Llama.generate` (llama_cpp/llama.py) evaluates the "
        "prompt-lookup draft with the target, samples each row with the request's sampler and drops the rest of the "
        "draft at the first sampled token that differs from it: the same match rule, exact, with "
        "llama-cpp-python's temperature-last chain (audited with that chain)."),
}


def findings(results, out_dir: Path) -> List[str]:
    """What the numbers say, engine by engine, with what the source says where it matters."""
    L = ["### Findings", ""]
    by = {(r["engine"], r["setting"]): r for r in results["runs"]}

    def verdicts(eid):
        return [by[(eid, s)] for s in AUDIT_SETTINGS if (eid, s) in by]

    def summary(rs):
        return "; ".join(f"{_setting_text(r)}: χ² {_p_eq(r['report']['chi2_p'])}, z = {r['report']['z']:+.2f}, "
                         f"TV gap [{r['report']['tv'][0]:.3f}, {r['report']['tv'][1]:.3f}] over "
                         f"{r['report']['tokens']:,} tokens" for r in rs)

    for eid, (name, why) in _SOURCE.items():
        rs = verdicts(eid)
        if not rs:
            continue
        ok = all(r["verdict"] == "pass" for r in rs)
        if eid == "llama-speculative":  # biased by its source, whatever one audit finds
            head = f"{name} passed here, although its source is not exact:" if ok else f"**{name} is biased.**"
            L.append(f"- {head} {summary(rs)}. {why}")
            continue
        L.append(f"- {name}: {'no bias detected' if ok else '**biased**'} ({summary(rs)}). {why}")
        same = _same_sequences(out_dir, by, eid, "llama-server-plain") if eid == "llama-server-md" else []
        if same:
            L[-1] += (" It is also why, with the same seeds, its sequences are llama-server's plain ones "
                      f"({'; '.join(same)}; a difference starts where a batched pass rounds a logit "
                      "differently): the match rule emits the plain sampler's own draws, so these two rows are "
                      "one piece of evidence, not two.")
    ours = [r for eid in ENGINES if eid.startswith("ours") for r in verdicts(eid)]
    if ours:
        bad = [r for r in ours if r["verdict"] != "pass"]
        L.append(f"- Ours: {len(ours) - len(bad)} of {len(ours)} engine × setting audits pass"
                 + (" (" + "; ".join(f"{r['engine']} {_setting_text(r)} fails: {', '.join(r['report']['reasons'])}"
                                     for r in bad) + ")" if bad else "")
                 + ". Rejection sampling with sampled drafts and the residual max(0, p − q) over the whole "
                 "vocabulary (docs/math.md), the n-gram drafts as the one-hot case.")
    controls = [r for eid in ("ours-plain", "llama-server-plain") for r in verdicts(eid)]
    if controls:
        bad = [r for r in controls if r["verdict"] != "pass"]
        L.append(f"- Controls (plain decoding, ours and llama.cpp's): {len(controls) - len(bad)} of "
                 f"{len(controls)} pass" + (" — a failing control means the audit itself, not the engine, is "
                                             "off: read the other rows with care" if bad else "")
                 + ". With two tests at 1e-3, an exact engine fails about 2 audits in 1,000.")
    tied = [r for r in results["runs"] if r["report"]["near_ties"]]
    if tied:
        n_ties = sum(r["report"]["near_ties"] for r in tied)
        plain = sum(r["report"]["near_ties"] for r in tied if r["control"])
        tol = tied[0]["report"]["tie_tolerance"]
        L.append(
            f"- Near ties: {n_ties} emitted token{'s' if n_ties != 1 else ''} in {len(tied)} "
            f"row{'s' if len(tied) != 1 else ''} lie just outside the audit's support and enter it once every "
            f"difference between two logits may move by {tol:g}, as another pass's rounding moves them "
            f"(docs/audit.md); they are listed in results.json, not failed."
            + (f" {plain} of them are the plain controls': near ties come with the nucleus's edge and the "
               "engines' own passes, not with speculation." if plain else ""))
    L.append("")
    return L


def plot(results: Dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines = list(dict.fromkeys(r["engine"] for r in _ordered_runs(results)))
    if not engines:
        return
    fig, (ax_z, ax_tv) = plt.subplots(1, 2, figsize=(12, 0.45 * len(engines) + 1.6), sharey=True)
    ys = {e: len(engines) - 1 - i for i, e in enumerate(engines)}
    marks = {"t1": ("o", "C0", -0.12), "t0.7": ("s", "C1", 0.12)}
    ax_z.axvspan(-3.29, 3.29, color="0.9", zorder=0, label="|z| < 3.29 (p > 1e-3)")
    for r in results["runs"]:
        rep = r["report"]
        m, c, dy = marks[r["setting"]]
        y, z = ys[r["engine"]] + dy, rep["z"]
        shown = max(min(z, 12.0), -12.0)
        face = c if r["verdict"] == "pass" else "none"
        ax_z.plot([shown], [y], marker=m, color=c, markerfacecolor=face, markersize=8, linestyle="none")
        if shown != z:
            ax_z.annotate(f"{z:+.0f}", (shown, y), textcoords="offset points", xytext=(0, 6), ha="center",
                          fontsize=7)
        ax_tv.plot(rep["tv"], [y, y], color=c, linewidth=2)
        ax_tv.plot([rep["tv_estimate"]], [y], marker=m, color=c, markerfacecolor=face, markersize=6,
                   linestyle="none")
    for s, (m, c, _) in marks.items():
        ax_z.plot([], [], marker=m, color=c, linestyle="none", label=SETTINGS[s].label)
    ax_z.plot([], [], marker="o", color="0.3", markerfacecolor="none", linestyle="none", label="verdict: fail")
    ax_z.set(yticks=list(ys.values()), yticklabels=list(ys), xlim=(-12.5, 12.5),
             xlabel="surprisal z (< 0: likely tokens too often; clipped at ±12)")
    ax_z.axvline(0, color="0.5", linewidth=0.8)
    ax_z.legend(fontsize=7, loc="lower left")
    ax_tv.set(xlabel="TV gap of the pooled rank-bin laws: 99.9% interval and estimate", xlim=(0, None))
    for ax in (ax_z, ax_tv):
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle("Is it exact? Each engine's sampled ids against the F32 target", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- command line ---


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench audit", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=None,
                    help="informative positions to audit per engine and setting (default 20000; --quick 1000)")
    ap.add_argument("--quick", action="store_true",
                    help="1,000 audited tokens, 128 per sequence, all under bench/results/audit/quick/")
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated (default all: {','.join(ENGINES)})")
    ap.add_argument("--settings", default=",".join(AUDIT_SETTINGS),
                    help=f"comma-separated (default {','.join(AUDIT_SETTINGS)})")
    ap.add_argument("--max-tokens", type=int, default=None, help="new tokens per sequence (default 256)")
    ap.add_argument("--threads", type=int, default=2, help="threads of every engine and of the audit (default 2)")
    ap.add_argument("--parallel", type=int, default=4,
                    help="sequences at once for BatchedDecoder and llama-server slots (default 4)")
    ap.add_argument("--seed", type=int, default=1, help="base seed (sequence j of setting i: seed + 100000 i + j)")
    ap.add_argument("--output-dir", type=Path, default=None,
                    help="samples and results.json (default bench/results/audit, --quick bench/results/audit/quick)")
    ap.add_argument("--results-md", type=Path, default=None,
                    help="the RESULTS.md to write (default bench/RESULTS.md; --quick: in the output directory)")
    ap.add_argument("--resume", action="store_true",
                    help="keep finished results of the same --tokens and --max-tokens, continue unfinished ones")
    ap.add_argument("--report-only", action="store_true", help="re-render the section and plot from results.json")
    ap.add_argument("--rescore", action="store_true",
                    help="score the saved samples of the named engines × settings again (no generation)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and estimated duration")
    args = ap.parse_args(argv)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    args.settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    bad = [e for e in args.engines if e not in ENGINES] + [s for s in args.settings if s not in AUDIT_SETTINGS]
    if bad:
        ap.error(f"unknown engine(s)/setting(s): {', '.join(bad)}")
    args.tokens = args.tokens or (1000 if args.quick else FULL_TOKENS)
    args.max_tokens = args.max_tokens or (128 if args.quick else 256)
    if args.tokens < 1 or args.max_tokens < 1 or args.threads < 1 or args.parallel < 1:
        ap.error("--tokens, --max-tokens, --threads and --parallel must be >= 1")
    if args.max_tokens + 600 > N_CTX:
        ap.error(f"--max-tokens must leave room for the prompts in the {N_CTX}-token context (at most {N_CTX - 600})")
    if args.output_dir is None:
        args.output_dir = results_dir("audit") / ("quick" if args.quick else "")
    if args.results_md is None:
        args.results_md = (args.output_dir / "RESULTS.md") if args.quick else RESULTS_MD
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        dry_run(args)
        return 0
    res_path = args.output_dir / "results.json"
    if args.report_only:
        results = load_results(res_path)
        if not results:
            print(f"no results in {res_path}", file=sys.stderr)
            return 1
    else:
        results = (rescore if args.rescore else run)(args, command_line("python -m bench audit", argv))
    plot_path = args.output_dir / "plot_audit.png"
    name = None
    try:
        plot(results, plot_path)
        name = link(plot_path, args.results_md)
    except ImportError:
        say("matplotlib is missing: no plot")
    write_section(args.results_md, render(results, name, args.output_dir), SECTION)
    say(f"wrote {args.results_md} ({SECTION})" + (f" and {plot_path}" if name else ""))
    return 0 if not results["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
