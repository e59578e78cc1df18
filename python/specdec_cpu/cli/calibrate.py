"""``specdec-cpu calibrate``: measure c, v(k) and α for a model pair here."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

from ..params import SamplingParams
from ..planning import theory
from ..planning.costmodel import CostModel, ModelIdentity, calibration_path
from ..settings import DecoderSettings, add_flags, from_flags
from ._common import UsageError, emit, int_in
from ._discovery import add_discovery_args, finish_models
from ._format import draft_lines, plan_lines, verify_lines
from ._session import add_sampling_flags


def register(sub: "argparse._SubParsersAction") -> None:
    """Add the ``calibrate`` subcommand."""
    p = sub.add_parser(
        "calibrate",
        help="measure draft cost c, verify costs v(k) and acceptance α for a model pair",
        description="Time the target over k = 1..γ_max+1 rows and the draft over one token, "
                    "measure the acceptance α on a few sample prompts, cache the result per "
                    "(model files, threads, CPU) and print the resulting plan.",
    )
    p.add_argument("--target", required=True, metavar="T.gguf|NAME",
                   help="target model: a GGUF file or a model's name (see `specdec-cpu models`)")
    p.add_argument("--draft", required=True, metavar="D.gguf|NAME", help="draft model: a GGUF file or a name")
    add_flags(p, DecoderSettings, ("draft_vocab", "n_threads", "n_ctx", "gamma_max", "seed"),
              defaults={"n_ctx": 2048, "gamma_max": 8})
    add_sampling_flags(p.add_argument_group("the sampling settings α is measured at"), 1.0)
    p.add_argument("--batch", type=int_in(1, 256), default=8, metavar="N",
                   help="most requests served at once (BatchedDecoder's max_sequences): the target is "
                        "timed over up to 64 rows and the draft over batches of 1..N rows (default 8; "
                        "1 times one conversation only)")
    p.add_argument("--n-tokens", type=int_in(1, 4096), default=32, metavar="N",
                   help="tokens generated per sample prompt to measure α (default 32)")
    p.add_argument("--recalibrate", action="store_true", help="measure again even if cached")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    p.add_argument("--json", action="store_true", help="print the calibration as JSON "
                   "(usable as `plan --calibration FILE`)")
    add_discovery_args(p, auto_draft=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Calibrate (or load the cached calibration) and print it."""
    try:
        params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                min_p=args.min_p, seed=args.seed)
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    target, draft = finish_models(args, args.target, args.draft, n_ctx=args.n_ctx, auto_draft=False)

    # Heavy imports (llama.cpp, the C++ extension) only now, so `plan` needs neither.
    from ..decoding.single import SpeculativeDecoder
    from ..planning import calibrate
    from ..planning.calibration import cached_calibration

    settings = from_flags(args, DecoderSettings, calibration=None)
    decoder = SpeculativeDecoder.from_gguf(target, draft, settings=settings,
                                           progress=lambda line: emit(line, sys.stderr))
    stored = cached_calibration(decoder.target_path, decoder.draft_path, decoder.n_threads)
    model = calibrate(decoder, params=params, gamma_max=args.gamma_max, batch=args.batch,
                      n_tokens=args.n_tokens, cache=not args.no_cache, recalibrate=args.recalibrate)
    cache_file = None if args.no_cache else calibration_path(model.key)
    reused = _reused(stored, model) if cache_file is not None else None
    if args.json:
        emit(json.dumps(_json(model, args.gamma_max, cache_file, reused), indent=2))
    else:
        emit("\n".join(_text(model, args.gamma_max, cache_file, reused)))
    return 0


def _reused(stored: Optional[CostModel], model: CostModel) -> Optional[str]:
    """What of ``model`` was read from the store, not measured now: "all", "timings" or None."""
    if stored is None or stored.created != model.created or stored.target_ms != model.target_ms:
        return None
    return "all" if stored.alpha == model.alpha and stored.sampling == model.sampling else "timings"


_REUSED = {
    "all": "read from the cache, nothing measured now (--recalibrate measures again)",
    "timings": "timings read from the cache, α measured now (--recalibrate measures the timings again)",
}


def _text(model: CostModel, gamma_max: int, cache_file: Optional[Path], reused: Optional[str]) -> list[str]:
    lines = [
        f"target: {_model_text(model.target)}",
        f"draft:  {_model_text(model.draft)}",
        f"threads: {model.n_threads}   cpu: {model.cpu}   measured: {model.created}",
    ]
    if cache_file is not None:
        lines.append(f"cache: {cache_file}")
    if reused is not None:
        lines.append(_REUSED[reused])
    lines += [
        "",
        f"draft cost c = T_draft(1) / T_target(1) = {model.draft_ms:.2f} ms / "
        f"{model.target_ms[0]:.2f} ms = {model.cost:.3f}",
        "verify cost v(k) = T_target(k) / T_target(1), k = rows in one pass (a batch's requests together):",
    ]
    shown = [k for k in range(1, model.k_max + 1) if k <= gamma_max + 1 or k in _BATCH_ROWS_SHOWN]
    lines += verify_lines(model.target_ms, shown)
    if model.draft_batch_ms is not None and len(model.draft_batch_ms) > 1:
        lines += ["", "draft pass time by batch size b (one draft token for each of b requests):"]
        lines += draft_lines(model.draft_batch_ms)
    sampling = ", ".join(f"{k} {v:g}" for k, v in model.sampling.items() if isinstance(v, (int, float)))
    if model.alpha is None:
        lines += ["", "acceptance α: not measured (no verified rows)"]
        return lines
    lines += ["", f"acceptance α = {model.alpha:.3f} (mean Σ min(p, q) of verified rows; {sampling})", ""]
    star = model.optimal_gamma(gamma_max)
    lines += plan_lines(model.plan(gamma_max), star)
    return lines


def _json(model: CostModel, gamma_max: int, cache_file: Optional[Path], reused: Optional[str]) -> dict:
    data = model.to_dict()
    derived: dict = {
        "cost": model.cost,
        "verify_cost": [model.verify_cost(k) for k in range(1, model.k_max + 1)],
        "cache_path": None if cache_file is None else str(cache_file),
        "from_cache": reused,  # "all", "timings" (α measured now) or None (all measured now)
    }
    if model.alpha is not None:
        star = model.optimal_gamma(gamma_max)
        derived["gamma_star"] = star
        derived["speedup"] = model.speedup(star)
        derived["plan"] = [row._asdict() for row in model.plan(gamma_max)]
        derived["ceiling"] = theory.ceiling(model.alpha)
    data["derived"] = derived  # ignored when read back as a CostModel
    return data


_BATCH_ROWS_SHOWN = (16, 24, 32, 48, 64, 96, 128)


def _model_text(identity: Optional[ModelIdentity]) -> str:
    if identity is None:
        return "-"
    return f"{identity.path} ({identity.size / 1e6:.0f} MB)"
