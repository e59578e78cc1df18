"""Prompt-lookup drafting replayed on recorded outputs: our γ policy against
llama-cpp-python's rule and against an oracle, without timing noise.

    python -m bench.ngram_replay [--tokens N] [--no-write]

Timed runs of prompt lookup vary by ±10–20% from run to run on a 2-core
machine, more than the differences between drafting policies.  This script
separates the two: it records what the F32 target generates for each bench
prompt (greedy, and two sampled runs at T = 1), measures the target's pass
cost v(k) = T(k) / T(1) once, and then replays drafting policies over the
recorded tokens.  A drafted token counts as accepted when it equals the
recorded token (exact for greedy decoding; for sampling, the accept test of
a one-hot draft passes with probability p(x), the chance that the sample is
x, so the replay has the right acceptance on average).  A step costs
v(γ + 1) passes; the score is tokens per pass, i.e. the speed-up over plain
decoding that the policy would reach with free drafting and no overhead.

Policies:
  ours      NgramDrafter + the decoders' DraftPolicy, as `--ngram` runs them
            (looking up the prompt's wrapped lines joined, too)
  ours, sequence only
            the same without them (unwrap_lines=False)
  theirs    llama-cpp-python's LlamaPromptLookupDecoding as documented
            (max_ngram_size=2, num_pred_tokens=10): the first occurrence of
            the longest suffix n-gram in the text, its next 10 tokens
  oracle    our drafter, told in advance how many of its tokens will be
            accepted (drafts exactly those): a ceiling for any γ policy on
            top of this drafter

Writes a "## N-gram replay" section into bench/RESULTS.md (other sections
are kept).  A measurement script, not a test.
"""

from __future__ import annotations

import argparse
import math
import statistics
from typing import Callable, List, Sequence

import numpy as np

from specdec_cpu import SamplingParams, SpeculativeDecoder
from specdec_cpu.demo_models import ensure_model
from specdec_cpu.drafters import NgramDrafter
from specdec_cpu.drafters.unwrap import unwrapped_reference
from specdec_cpu.planning import CostModel
from specdec_cpu.planning.calibration import time_passes
from specdec_cpu.planning.policy import Candidate, DraftPolicy

from .common import RESULTS_MD
from .prompts import PROMPTS
from .suite import F32

GREEDY = SamplingParams(temperature=0.0)
KS = (1, 2, 3, 5, 7, 9, 11, 13, 17, 21, 25)
GAMMA_MAX = 24


def accepted(draft: Sequence[int], out: Sequence[int], pos: int) -> int:
    """Leading draft tokens equal to the recorded ones (never the last token:
    every step emits at least one token of its own)."""
    n = 0
    while n < len(draft) and pos + n < len(out) - 1 and draft[n] == out[pos + n]:
        n += 1
    return n


def theirs(seq: Sequence[int], max_ngram: int = 2, num_pred: int = 10) -> List[int]:
    """llama-cpp-python's documented prompt lookup: the first occurrence of
    the longest suffix n-gram whose continuation starts before the suffix."""
    size = len(seq)
    for n in range(max_ngram, 0, -1):
        suffix = list(seq[size - n:])
        for start in range(0, size - n):
            if list(seq[start:start + n]) == suffix and start + n < size - n:
                return list(seq[start + n:start + n + num_pred])
    return []


def replay(prompt: Sequence[int], out: Sequence[int], v: Sequence[float],
           choose: Callable[[NgramDrafter, List[int], int], List[int]],
           learn: Callable[[int, int, int], None] = lambda gamma, n_acc, first: None,
           reference: Sequence[Sequence[int]] = ()) -> float:
    """Tokens per target pass of one policy over one recorded output."""
    seq = list(prompt)
    drafter = NgramDrafter(max_draft=GAMMA_MAX)
    drafter.set_reference(reference)
    drafter.begin(seq)
    pos, passes = 0, 0.0
    while pos < len(out):
        draft = choose(drafter, seq, pos)
        n_acc = accepted(draft, out, pos)
        learn(len(draft), n_acc, out[pos])
        passes += v[len(draft) + 1]
        seq += out[pos:pos + n_acc + 1]
        drafter.rollback(len(seq))
        pos += n_acc + 1
    return len(out) / passes


def ours_policy(v: Sequence[float], t1_ms: float):
    """The decoders' own draft policy for one sequence with lookup drafting only."""
    costs = CostModel(target_ms=[t1_ms * x for x in v[1:GAMMA_MAX + 2]], draft_ms=0.0)
    policy = DraftPolicy(costs, max_rows=GAMMA_MAX + 1, max_draft_rows=1, has_draft=False, gamma_max=GAMMA_MAX)
    plan = policy.admit()
    step: dict = {}

    def choose(drafter, seq, pos):
        m = drafter.match(seq)
        c = Candidate(plan=plan, gamma="auto", room=GAMMA_MAX, remaining=GAMMA_MAX + 1, match=m,
                      lookup_max=GAMMA_MAX)
        d = policy.plan([c])[0]
        step.update(c=c, d=d)
        g = d.gamma if d.route is not None else 0
        return drafter.propose(seq, g, GREEDY, None).tokens.tolist() if g else []

    def learn(gamma, n_acc, first):
        rows = [1.0] * n_acc + ([0.0] if n_acc < gamma else [])
        policy.learn(step["c"], step["d"], step["d"].route if gamma else None, rows, first)
        policy.observe_target(gamma + 1, t1_ms * v[gamma + 1] / 1000)

    return choose, learn


def oracle_policy(out):
    def choose(drafter, seq, pos):
        if drafter.match(seq) is None:
            return []
        full = drafter.propose(seq, GAMMA_MAX, GREEDY, None).tokens.tolist()
        return full[:accepted(full, out, pos)]
    return choose


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = ap.parse_args(argv)

    dec = SpeculativeDecoder.from_gguf(ensure_model(F32), gamma=0, n_ctx=2048,
                                       n_threads=args.threads, calibration=None)
    t = time_passes(dec.target, KS, repeats=5)
    v = [math.nan] + list(np.interp(np.arange(1, GAMMA_MAX + 2), KS, [x / t[0] for x in t]))
    print("v(k):", ", ".join(f"{k}: {x / t[0]:.2f}" for k, x in zip(KS, t)), flush=True)

    runs = [("T=0", GREEDY)] + [(f"T=1 seed {s}", SamplingParams(temperature=1.0, seed=s)) for s in (1, 2)]
    rows = []
    for prompt in PROMPTS:
        text = dec.chat_prompt(prompt.messages())
        ids = dec.tokenizer.tokenize(text, add_special=True, parse_special=True)
        unwrapped = unwrapped_reference(ids, dec.tokenizer)
        for label, params in runs:
            out = dec.generate(text, max_tokens=args.tokens, params=params).tokens
            score = {
                "ours": replay(ids, out, v, *ours_policy(v, t[0]), unwrapped),
                "seq": replay(ids, out, v, *ours_policy(v, t[0])),
                "theirs": replay(ids, out, v, lambda d, s, p: theirs(s)),
                "oracle": replay(ids, out, v, oracle_policy(out), reference=unwrapped),
            }
            rows.append((prompt.name, prompt.kind, label, len(out), score))
            print(prompt.name, label, {k: round(float(x), 2) for k, x in score.items()}, flush=True)

    lines = [
        "## N-gram replay",
        "",
        f"Command: `python -m bench.ngram_replay --tokens {args.tokens}`",
        "",
        "Drafting policies replayed over what the F32 target generated for each prompt (see the "
        "script's docstring): tokens per target pass, i.e. the speed-up over plain decoding with "
        "free drafting and no overhead, from the target's v(k) measured in the same run "
        f"({', '.join(f'v({k}) = {x / t[0]:.2f}' for k, x in zip(KS[1:], t[1:]))}). "
        "*theirs* is llama-cpp-python's prompt lookup rule (10 tokens from the first occurrence of "
        "the last 2 tokens); *oracle* is our drafter told how many of its tokens will be accepted; "
        "*sequence only* is ours without looking up the prompt's wrapped lines joined.",
        "",
        "| prompt | kind | run | tokens | ours | ours, sequence only | theirs | oracle | ours / theirs "
        "| ours / oracle |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, kind, label, n, s in rows:
        lines.append(f"| {name} | {kind} | {label} | {n} | {s['ours']:.2f}× | {s['seq']:.2f}× | "
                     f"{s['theirs']:.2f}× | {s['oracle']:.2f}× | {s['ours'] / s['theirs']:.2f} | "
                     f"{s['ours'] / s['oracle']:.2f} |")
    for kinds, what in ((("grounded",), "grounded"), (("grounded", "summary"), "grounded and summary"),
                        (("open",), "open")):
        sel = [s for _, kind, _, _, s in rows if kind in kinds]
        def geo(policy):
            return math.exp(statistics.fmean(math.log(s[policy] / s["theirs"]) for s in sel))
        lines.append("")
        lines.append(f"- {what} prompts: ours / theirs {geo('ours'):.2f} (geometric mean over runs; "
                     f"sequence only {geo('seq'):.2f}); the oracle's {geo('oracle'):.2f}.")
    section = "\n".join(lines)
    print(section)
    if not args.no_write:
        path = RESULTS_MD
        text = path.read_text() if path.exists() else ""
        head, sep, rest = text.partition("\n## N-gram replay")
        tail = ""
        if sep:
            nxt = rest.find("\n## ")
            tail = rest[nxt:] if nxt >= 0 else ""
        path.write_text(head.rstrip() + "\n\n" + section + "\n" + tail)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
