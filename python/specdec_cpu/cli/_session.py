"""What ``generate`` and ``chat`` share: model and sampling flags, loading the
decoder (the user's files or the default demo pair) and the statistics they
print.  Ctrl-C handling lives in ``_interrupts``."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any, Optional, Sequence, TextIO, Union

from ..core.stats import GenerationStats
from ..errors import SpecDecError
from ..params import SamplingParams
from ._common import UsageError, emit, int_in, nonneg_float
from ._discovery import add_discovery_args, finish_models, label
from ._interrupts import interruptible  # noqa: F401  (generate and chat use it from here)

GammaSetting = Union[int, str]

#: Sampling defaults of the interactive commands (SamplingParams' own default is T = 1).
DEFAULT_TEMPERATURE = 0.7

#: Keys of the sampling/generation settings, as ``/params`` and ``--json`` name them.
PARAM_KEYS = ("temperature", "top_k", "top_p", "min_p", "seed", "max_tokens", "gamma")
#: The decoder settings generate and chat take as flags (settings.py declares each).
MODEL_SETTINGS = ("ngram", "draft_vocab", "gamma", "gamma_max", "calibration", "n_threads", "n_ctx", "n_batch",
                  "chat_template")
#: The most tokens one reply may ask for (--max-tokens, chat's /params max_tokens).
MAX_TOKENS_LIMIT = 1 << 24


# ---------------------------------------------------------------------------
# flags
# ---------------------------------------------------------------------------


def gamma_value(text: str) -> GammaSetting:
    """argparse type for a γ outside the settings' flags (audit, chat's ``/params``)."""
    from ..settings import parse_gamma

    try:
        return parse_gamma(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def top_p_value(text: str) -> float:
    """argparse type for ``--top-p``: a number in (0, 1]."""
    value = _finite(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1] (1 = off), got {text}")
    return value


def min_p_value(text: str) -> float:
    """argparse type for ``--min-p``: a number in [0, 1)."""
    value = _finite(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1) (0 = off), got {text}")
    return value


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite, got {text}")
    return value


def add_model_args(p: argparse.ArgumentParser) -> None:
    """--target/--draft and the decoder settings' flags (settings.py)."""
    from ..settings import DecoderSettings, add_flags

    g = p.add_argument_group("models")
    g.add_argument("--target", metavar="T.gguf|NAME",
                   help="target model: a GGUF file or a model's name (qwen2.5-coder:7b, "
                        "org/repo:file.gguf; see `specdec-cpu models`). Default: the bundled "
                        "demo pair")
    g.add_argument("--draft", metavar="D.gguf|NAME",
                   help="draft model sharing the target's vocabulary. With --target but no "
                        "--draft: the smallest such model found on this machine, else n-gram "
                        "drafting (see --no-auto-draft)")
    add_flags(g, DecoderSettings, MODEL_SETTINGS)
    add_discovery_args(g)


def add_sampling_flags(g: "argparse._ActionsContainer", temperature: float) -> None:
    """--temperature/--top-k/--top-p/--min-p (every command that samples)."""
    g.add_argument("--temperature", type=nonneg_float, default=temperature, metavar="T",
                   help=f"sampling temperature, 0 = greedy (default {temperature:g})")
    g.add_argument("--top-k", type=int_in(0, 1 << 30), default=0, metavar="K",
                   help="keep the K most likely tokens, 0 = off (default)")
    g.add_argument("--top-p", type=top_p_value, default=1.0, metavar="P",
                   help="nucleus sampling in (0, 1], 1 = off (default)")
    g.add_argument("--min-p", type=min_p_value, default=0.0, metavar="P",
                   help="drop tokens below P × the top probability, in [0, 1), 0 = off (default)")


def add_sampling_args(p: argparse.ArgumentParser, max_tokens: int) -> None:
    """The sampling flags, --seed, --max-tokens, --ignore-eos and --system."""
    from ..settings import DecoderSettings, add_flags

    g = p.add_argument_group("sampling (applied as temperature → top-k → top-p → min-p)")
    add_sampling_flags(g, DEFAULT_TEMPERATURE)
    add_flags(g, DecoderSettings, ("seed",))
    g.add_argument("--max-tokens", type=int_in(1, MAX_TOKENS_LIMIT), default=max_tokens, metavar="N",
                   help=f"most tokens to generate per reply (default {max_tokens})")
    g.add_argument("--ignore-eos", action="store_true",
                   help="never end at an end-of-generation token (probability 0): generate --max-tokens "
                        "tokens unless a stop string or the context ends the reply first")
    g.add_argument("--system", metavar="TEXT", default=None,
                   help="system prompt (used with the chat template)")


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    """The SamplingParams the flags describe (a bad combination is a usage error)."""
    try:
        return SamplingParams(temperature=args.temperature, top_k=args.top_k,
                              top_p=args.top_p, min_p=args.min_p, ignore_eos=args.ignore_eos)
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None


# ---------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------


def check_args(args: argparse.Namespace) -> None:
    """Flag combinations that cannot work, caught before any model is loaded."""
    if args.draft is not None and args.target is None:
        raise UsageError("--draft needs --target (without either, the default pair is used)")
    if args.draft_vocab is not None and args.target is not None and args.draft is None:
        raise UsageError("--draft-vocab cuts the draft model: add --draft D.gguf")
    no_drafter = (args.target is not None and args.draft is None and not args.ngram
                  and getattr(args, "no_auto_draft", True))
    if no_drafter and isinstance(args.gamma, int) and args.gamma > 0:
        raise UsageError(f"--gamma {args.gamma} needs a drafter: add --draft D.gguf or --ngram")
    settings(args)


def settings(args: argparse.Namespace):
    """The ``DecoderSettings`` of the flags (a bad value is a usage error)."""
    from ..settings import DecoderSettings, from_flags

    try:
        return from_flags(args, DecoderSettings)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def model_paths(args: argparse.Namespace) -> "tuple[str, Optional[str]]":
    """(target, draft) from the flags, or the default pair prepared on first use."""
    if args.target is None:
        from ..demo_models import ensure_default_pair

        target, draft = ensure_default_pair(progress=True)
        return finish_models(args, str(target), str(draft), n_ctx=args.n_ctx, named=False)
    return finish_models(args, args.target, args.draft, n_ctx=args.n_ctx)


def load_decoder(args: argparse.Namespace, announce: Optional[TextIO] = None):
    """A SpeculativeDecoder for the flags.

    ``announce``: a stream to say "loading ..." on once the files are found.
    """
    from ..decoding.single import SpeculativeDecoder

    check_args(args)
    target, draft = model_paths(args)  # may pick a draft, or fall back on prompt lookup
    s = settings(args)
    if announce is not None:
        names = ", ".join(label(p) for p in (target, draft) if p)
        emit(f"loading {names} ...", announce)
    try:
        return SpeculativeDecoder.from_gguf(target, draft, settings=s, progress=lambda line: emit(line, sys.stderr))
    except ValueError as exc:  # e.g. a γ the drafter cannot serve
        if isinstance(exc, SpecDecError):
            raise
        raise UsageError(str(exc)) from None


def has_drafter(decoder) -> bool:
    return bool(getattr(decoder, "has_drafter", False))


def describe_models(decoder) -> str:
    """One line naming the files and the drafting mode."""
    target = label(decoder.target_path)
    ngram = bool(getattr(decoder, "ngram", False))
    if decoder.draft_path:
        draft = f"draft {label(decoder.draft_path)}" + (" + n-gram lookup" if ngram else "")
    elif ngram:
        draft = "n-gram drafting"
    else:
        draft = "no draft: plain decoding"
    return f"target {target}, {draft}, γ {decoder.gamma}"


# ---------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------


def run_result(stream) -> Any:
    """The finished Generation of a (closed or exhausted) decoder stream."""
    return getattr(stream, "result", None)


# ---------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------


def estimated_speedup(decoder, stats: GenerationStats, gamma: GammaSetting) -> Optional[float]:
    """Speed-up over plain decoding the cost model predicts for this run.

    For the γ each step used, the model's expected tokens E[tokens](α, γ) and
    cost γ·c + v(γ+1) (in units of one plain target pass) are summed over the
    steps: Σ E / Σ cost (with one γ throughout, this is speedup(α, γ)).  α
    is the run's measured mean; v(k) and the draft's cost per token are the
    planner's current estimates (learnt from this decoder's passes, else its
    calibration, else priors); a lookup's drafts cost nothing, so c is the
    model's cost scaled by its share of the drafted tokens.  None when there
    is no drafter.
    """
    if not has_drafter(decoder) or not stats.steps or not stats.gammas:
        return None
    if max(stats.gammas) == 0:
        return 1.0
    try:
        est = decoder.policy.estimates()
        t = est["target_ms"]
        model_share = (stats.by_drafter.get("model", [0, 0])[0] / stats.drafted) if stats.drafted else 0.0
        cost = (est["cost"] if est["cost"] is not None else 0.2) * model_share
        alpha = stats.mean_alpha if stats.alpha_rows else stats.acceptance
        alpha = min(max(alpha, 0.0), 1.0)
        return _aggregate(alpha, cost, lambda k: t[min(k, len(t)) - 1] / t[0], stats.gammas)
    except Exception:  # an estimate must never break a reply
        return None


def _aggregate(alpha: float, cost: float, verify, gammas: Sequence[int]) -> float:
    """Σ E[tokens](α, γ_i) / Σ (γ_i·c + v(γ_i + 1)) over the steps' γ_i (v ≥ 1)."""
    from ..planning import theory

    tokens = spent = 0.0
    counts: dict[int, int] = {}
    for g in gammas:
        counts[g] = counts.get(g, 0) + 1
    for g, n in counts.items():
        if g == 0:
            tokens += n
            spent += n
        else:
            # A pass over k > 1 rows never costs less than over one: timings
            # taken under different loads must not make the estimate run away.
            tokens += n * float(theory.expected_tokens(alpha, g))
            v = float(verify(g + 1))
            spent += n * (g * max(cost, 0.0) + (max(v, 1.0) if math.isfinite(v) else 1.0))
    result = tokens / spent if spent > 0 else 1.0
    if not math.isfinite(result):
        raise ValueError("no finite estimate")
    return result


def status_line(stats: GenerationStats, speedup: Optional[float], drafting: bool) -> str:
    """The one-line summary printed after a reply."""
    parts = [f"{stats.tokens} tokens", f"{stats.tokens_per_second:.1f} tok/s"]
    if drafting:
        parts += [f"acceptance {stats.acceptance:.2f}", f"mean α {stats.mean_alpha:.2f}",
                  f"γ {stats.mean_gamma:.1f}"]
        if speedup is not None:
            parts.append(f"est. {speedup:.2f}× over plain")
    else:  # no drafter, γ = 0, or γ auto found that speculation does not pay
        parts.append("plain decoding")
    if stats.finish_reason not in (None, "stop"):
        parts.append(_finish_text(stats.finish_reason))
    return "[" + " · ".join(parts) + "]"


def _finish_text(reason: Optional[str]) -> str:
    return {"length": "max tokens reached", "context": "context full",
            "cancelled": "stopped", "timeout": "timed out"}.get(reason or "", reason or "")


def stats_lines(stats: GenerationStats, speedup: Optional[float], drafting: bool) -> list[str]:
    """Every statistic of one generation, one per line."""
    lines = [
        f"tokens:            {stats.tokens} ({stats.finish_reason or '-'})",
        f"prompt:            {stats.prompt_tokens} tokens, {stats.prompt_cached} reused from "
        f"the cache, {stats.prompt_seconds * 1000:.0f} ms",
        f"decode:            {stats.decode_seconds:.2f} s, {stats.tokens_per_second:.1f} tok/s",
        f"target passes:     {stats.steps} ({stats.tokens_per_step:.2f} tokens per pass)",
    ]
    if drafting:
        lines += [
            f"drafted/accepted:  {stats.drafted}/{stats.accepted} "
            f"(acceptance {stats.acceptance:.3f})",
            f"mean α:            {stats.mean_alpha:.3f} over {stats.alpha_rows} verified rows",
            f"γ:                 mean {stats.mean_gamma:.2f}; over time {_runs_text(stats)}",
        ]
        if len(stats.by_drafter) > 1:
            for name, (drafted, accepted) in sorted(stats.by_drafter.items()):
                rate = accepted / drafted if drafted else 0.0
                lines.append(f"  {name + ':':16s} {drafted} drafted, {accepted} accepted ({rate:.2f})")
        if speedup is not None:
            lines.append(f"est. speed-up:     {speedup:.2f}× over plain decoding (cost model)")
    else:
        lines.append("drafting:          none (plain decoding)")
    if stats.forced:
        lines.append(f"forced tokens:     {stats.forced} (the grammar's only continuation, verified "
                     "without a draft pass)")
    lines.append(
        f"time split:        draft {stats.draft_seconds:.2f} s, target {stats.target_seconds:.2f} s, "
        f"sampling {stats.sampling_seconds:.2f} s, other {stats.overhead_seconds:.2f} s")
    return lines


def _runs_text(stats: GenerationStats, limit: int = 8) -> str:
    runs = stats.gamma_runs()
    text = ", ".join(f"{g}×{n}" for g, n in runs[:limit])
    if len(runs) > limit:
        text += f", … ({len(runs) - limit} more runs)"
    return text or "-"


def combine(all_stats: Sequence[GenerationStats]) -> GenerationStats:
    """Totals over several generations (rates recomputed from the sums)."""
    total = GenerationStats()
    for s in all_stats:
        for name in ("prompt_tokens", "prompt_cached", "tokens", "steps", "drafted", "accepted", "forced",
                     "alpha_sum", "alpha_rows", "prompt_seconds", "draft_seconds",
                     "target_seconds", "sampling_seconds", "total_seconds"):
            setattr(total, name, getattr(total, name) + getattr(s, name))
        total.gammas.extend(s.gammas)
        for name, (drafted, accepted) in s.by_drafter.items():
            total.record_drafter(name, drafted, accepted)
    return total


def setup_stdout() -> None:
    """Never fail on a character the terminal's encoding lacks."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="replace")
            except (ValueError, OSError):  # pragma: no cover - a detached stream
                pass
