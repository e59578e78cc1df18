"""``specdec-cpu audit``: are an engine's samples distributed as the target's?"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List, Optional

from ..params import SamplingParams
from ..settings import N_CTX_LIMIT
from ._common import UsageError, emit, int_in, nonneg_float
from ._constraint import add_constraint_args, constraint_from_args
from ._session import add_sampling_flags, gamma_value

ENGINES = ("ours", "ours-plain")
DEFAULT_TOKENS = 128
DEFAULT_SAMPLES = 4


def register(sub: "argparse._SubParsersAction") -> None:
    """Add the ``audit`` subcommand."""
    p = sub.add_parser(
        "audit",
        help="test whether generated tokens follow the target's sampling distribution",
        description="Recompute the target's sampling distribution at every emitted position "
                    "(one batched pass per sequence) and test, pooled over positions, whether "
                    "the emitted tokens are draws from it: a chi-square over probability-rank "
                    "bins, a surprisal z-score, and an interval for the total-variation gap. "
                    "Audit any engine's output (--input) or samples this package generates "
                    "itself (--engine). The exit code is 0 whatever the verdict.",
    )
    p.add_argument("--target", required=True, metavar="T.gguf", help="the target model (GGUF)")
    s = p.add_argument_group("the sampling settings the samples were drawn with")
    add_sampling_flags(s, 1.0)
    s.add_argument("--chain", choices=("temperature-first", "temperature-last"), default="temperature-first",
                   help="order of the samplers: temperature-first = temperature → top-k → top-p → min-p "
                        "(specdec-cpu, HF, vLLM, llama.cpp with --samplers "
                        "'temperature;top_k;top_p;min_p'); temperature-last = top-k → top-p → min-p → "
                        "temperature (llama-cpp-python's Llama). Default temperature-first")

    src = p.add_argument_group("the samples: a file, or generated here")
    what = src.add_mutually_exclusive_group(required=True)
    what.add_argument("--input", metavar="FILE.jsonl",
                      help='one JSON object per line: {"prompt": str, "tokens": [ids]} or '
                           '{"prompt": str, "text": str}, optionally "stopped": true (ended at an '
                           "end-of-generation token)")
    what.add_argument("--engine", choices=ENGINES,
                      help="generate the samples with specdec-cpu: ours = speculative (--draft "
                           "and/or --ngram), ours-plain = plain decoding (γ = 0)")
    src.add_argument("--draft", metavar="D.gguf", help="draft model for --engine ours")
    src.add_argument("--ngram", action="store_true", help="prompt-lookup drafting for --engine ours")
    src.add_argument("--gamma", type=gamma_value, default=None, metavar="auto|N",
                     help="γ for --engine ours (default auto)")
    src.add_argument("--prompts", metavar="FILE",
                     help="prompts for --engine, one per line (a line starting with a double quote "
                          "is read as a JSON string, for prompts with newlines)")
    src.add_argument("--chat", action="store_true",
                     help="wrap each --prompts line in the target's chat template")
    src.add_argument("--tokens", type=int_in(1, 1 << 20), default=None, metavar="N",
                     help=f"most tokens per sample for --engine (default {DEFAULT_TOKENS})")
    src.add_argument("--samples", type=int_in(1, 1 << 20), default=None, metavar="N",
                     help=f"samples per prompt for --engine (default {DEFAULT_SAMPLES})")
    src.add_argument("--seed", type=int_in(0, 2**62), default=None, metavar="N",
                     help="seed of the first sample for --engine; sample k uses seed + k (default 0)")
    src.add_argument("--save", metavar="FILE.jsonl",
                     help="write the --engine samples in the --input format")

    add_constraint_args(p)  # the samples were generated under it: the target's rows are masked by it
    o = p.add_argument_group("audit and output")
    o.add_argument("--threshold", type=_threshold, default=1e-3, metavar="P",
                   help="the verdict fails when either test's p-value is below P; the TV interval's "
                        "confidence level is 1 - P (default 0.001)")
    o.add_argument("--tie-tolerance", type=nonneg_float, default=0.05, metavar="L",
                   help="a token outside the support that enters it once logit differences move by L "
                        "(a near tie with the argmax, or at the top-p/top-k/min-p edge) is a near tie that "
                        "rounding in another pass can explain, reported but not failed (default 0.05)")
    o.add_argument("--threads", type=int_in(1, 1024), default=None, metavar="N",
                   help="CPU threads per model (default: all cores)")
    o.add_argument("--flash-attn", action="store_true",
                   help="compute the audit's logits with flash attention (default off, as the decoder)")
    o.add_argument("--kv-type", choices=("f16", "f32"), default="f16",
                   help="KV-cache precision of the audit's context (default f16, as the decoder)")
    o.add_argument("--batch-noise", type=int_in(1, 1 << 20), default=None, metavar="N",
                   help="also measure, over the first N emitted positions, how far the audit's batched "
                        "logits are from one-token-per-pass logits")
    o.add_argument("--json", action="store_true", help="print one JSON object instead of the text report")
    o.add_argument("--plot", metavar="OUT.png",
                   help="draw observed and expected counts per rank bin (needs matplotlib)")
    p.set_defaults(func=run)


def _threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {text}")
    return value


def run(args: argparse.Namespace) -> int:
    """Read or generate the samples, audit them, print the report."""
    from ..audit import AuditInputError

    params = _params(args)
    _check_flags(args)
    grammar = constraint_from_args(args)
    for flag in ("target", "draft", "input", "prompts"):
        path = getattr(args, flag)
        if path is not None and not Path(path).is_file():
            raise FileNotFoundError(f"--{flag} {path}: no such file")

    from ..audit import read_jsonl
    from ..audit.run import audit_sequences
    from ..audit.target import TargetModel

    try:
        sequences = read_jsonl(args.input) if args.input else None
        prompts = _read_prompts(args.prompts) if args.engine else None
    except AuditInputError as exc:
        raise UsageError(str(exc)) from None

    summary = None
    with TargetModel(args.target, n_threads=args.threads, flash_attn=args.flash_attn,
                     kv_type=args.kv_type) as target:
        if args.engine:
            assert prompts is not None  # read above for --engine
            sequences, summary = _generate(args, target, prompts, params, grammar)
        assert sequences is not None  # --input or --engine (argparse requires one)
        try:
            report = audit_sequences(target, sequences, params, chain=args.chain,
                                     threshold=args.threshold, tie_tolerance=args.tie_tolerance, grammar=grammar)
        except AuditInputError as exc:
            raise UsageError(str(exc)) from None
        noise = None
        if args.batch_noise and report.positions:
            from ..audit.batching import measure_batch_noise

            noise = measure_batch_noise(target, [target.prompt_ids(s) for s in sequences],
                                        [target.emitted_ids(s) for s in sequences], params, args.chain,
                                        limit=args.batch_noise)

    if report.positions == 0:
        raise ValueError("nothing to audit: every sequence is empty (no emitted tokens, none stopped)")
    if args.engine == "ours" and summary is not None and summary.drafted == 0:
        report.warnings.append("--engine ours drafted no token: this audit tested plain decoding only"
                               + (" (γ=auto found no step where drafting pays); give --gamma N to test speculation"
                                  if args.gamma is None else ""))
    _print(args, report, summary, noise, grammar)  # a broken pipe (`| head`): see main()
    if args.plot:
        from ..audit.plot import plot_bins

        if report.statistics is None:
            emit("warning: --plot skipped: no informative positions to draw", sys.stderr)
        else:
            plot_bins(Path(args.plot), report)
            if not args.json:
                emit(f"plot written to {args.plot}")
    return 0


def _print(args: argparse.Namespace, report, summary, noise, grammar) -> None:
    """The report as text or one JSON object on stdout."""
    if args.json:
        data = report.to_dict()
        data["constraint"] = grammar.what if grammar is not None else None
        if summary is not None:
            data["generation"] = {"engine": args.engine, **summary.__dict__, "acceptance": summary.acceptance}
        if noise is not None:
            data["batch_noise"] = noise.to_dict()
        emit(json.dumps(data))
    else:
        lines = report.lines()
        if summary is not None:
            lines.insert(0, f"engine {args.engine}: {summary.line()}")
        if noise is not None:
            lines.insert(-1, noise.line())
        if grammar is not None:
            lines.insert(0, f"constrained by a {grammar.what}: every position is audited against the target's "
                            "distribution masked by it")
        emit("\n".join(lines))
    sys.stdout.flush()


def _params(args: argparse.Namespace) -> SamplingParams:
    try:
        return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                              min_p=args.min_p)
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def _check_flags(args: argparse.Namespace) -> None:
    """Flag combinations that cannot work, caught before any model is loaded."""
    engine_only = [f"--{name.replace('_', '-')}" for name in ("draft", "gamma", "prompts", "tokens", "samples",
                                                               "seed", "save")
                   if getattr(args, name) is not None]
    engine_only += [flag for flag, on in (("--ngram", args.ngram), ("--chat", args.chat)) if on]
    if args.input is not None:
        if engine_only:
            raise UsageError(f"{', '.join(engine_only)} only apply with --engine (not with --input)")
        return
    if args.prompts is None:
        raise UsageError(f"--engine {args.engine} needs --prompts FILE")
    if args.chain != "temperature-first":
        raise UsageError(f"--engine {args.engine} samples with the temperature-first chain; "
                         f"--chain {args.chain} would audit it against another distribution")
    if args.engine == "ours-plain":
        extra = [f for f, on in (("--draft", args.draft), ("--ngram", args.ngram),
                                 ("--gamma", args.gamma is not None)) if on]
        if extra:
            raise UsageError(f"--engine ours-plain is plain decoding: {', '.join(extra)} do(es) not apply")
    elif args.draft is None and not args.ngram:
        raise UsageError("--engine ours needs a drafter: --draft D.gguf and/or --ngram "
                         "(--engine ours-plain is plain decoding)")
    elif args.gamma == 0:
        raise UsageError("--engine ours with --gamma 0 is plain decoding: use --engine ours-plain")
    if args.save is not None:  # found now, not after the generation
        if Path(args.save).is_dir():
            raise UsageError(f"--save {args.save} is a directory: give the file to write (FILE.jsonl)")
        if not Path(args.save).parent.is_dir():
            raise UsageError(f"--save {args.save}: {Path(args.save).parent} is not a directory")


def _read_prompts(path: str) -> List[str]:
    """Prompts, one per non-empty line; a line starting with '"' is a JSON string."""
    from ..audit import AuditInputError

    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise AuditInputError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    prompts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if line.lstrip().startswith('"'):
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise AuditInputError(f"{path}:{number}: a line starting with '\"' must be one JSON "
                                      f"string ({exc.msg} at column {exc.colno})") from None
            if not isinstance(value, str) or not value:
                raise AuditInputError(f"{path}:{number}: expected a non-empty JSON string")
            line = value
        prompts.append(line)
    if not prompts:
        raise AuditInputError(f"{path}: no prompts (expected one per line)")
    return prompts


def _generate(args: argparse.Namespace, target, prompts: List[str], params: SamplingParams, grammar):
    """Samples from specdec-cpu's decoder over the audit's own target weights."""
    from .. import engine
    from ..audit import GeneratedSequence
    from ..audit.generate import generate_samples
    from ..decoding.single import SpeculativeDecoder
    from ..settings import DecoderSettings

    texts = []
    for i, prompt in enumerate(prompts):
        if args.chat:
            text = target.tokenizer.chat_prompt([{"role": "user", "content": prompt}])
            if text is None:
                raise UsageError(f"--chat: {args.target} has no chat template llama.cpp can apply")
            prompt = text
        texts.append(prompt)
    ids = [target.prompt_ids(GeneratedSequence(prompt=t, tokens=[])) for t in texts]
    max_tokens = args.tokens or DEFAULT_TOKENS
    n_ctx = max(len(p) for p in ids) + max_tokens + 8
    if n_ctx > N_CTX_LIMIT:
        raise UsageError(f"--tokens {max_tokens} and the longest prompt ({max(len(p) for p in ids)} tokens) need a "
                         f"context of {n_ctx} tokens; a decoder holds at most {N_CTX_LIMIT}")

    draft_w: Optional[engine.LlamaWeights] = None
    if args.engine == "ours" and args.draft:
        draft_w = engine.LlamaWeights(args.draft)
        engine.check_vocab_compatible(target.weights, draft_w)
    try:
        gamma = 0 if args.engine == "ours-plain" else (args.gamma if args.gamma is not None else "auto")
        settings = DecoderSettings(gamma=gamma, n_ctx=n_ctx, n_threads=args.threads, ngram=args.ngram)
        decoder = SpeculativeDecoder._over_pair(engine.ModelPair(target.weights, draft_w), settings, None)
        samples, summary = generate_samples(decoder, ids, samples=args.samples or DEFAULT_SAMPLES,
                                            max_tokens=max_tokens, params=params,
                                            seed=args.seed if args.seed is not None else 0, grammar=grammar)
    finally:
        if draft_w is not None:
            draft_w.close()
    if args.save:  # the prompts as text (they tokenize back to the ids generated from)
        per_prompt = args.samples or DEFAULT_SAMPLES
        _save(args.save, [(texts[i // per_prompt], s) for i, s in enumerate(samples)])
    return samples, summary


def _save(path: str, pairs) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for text, s in pairs:
            fh.write(json.dumps({"prompt": text, "tokens": list(s.tokens), "stopped": s.stopped}) + "\n")
