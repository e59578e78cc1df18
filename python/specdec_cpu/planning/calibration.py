"""Measure a (target, draft) pair's step costs and acceptance on this machine.

``calibrate`` times target passes over k = 1..γ_max+1 rows and single draft
tokens, then runs short speculative generations to measure α at the
requested sampling settings.  Results are cached per (model files, threads,
CPU) so that a second start is instant.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable, Optional, Protocol, Sequence

from .costmodel import CostModel, ModelIdentity, calibration_key, calibration_path, cpu_model
from ..model import CausalLM
from ..params import SamplingParams

__all__ = ["SAMPLE_PROMPTS", "cached_calibration", "calibrate", "measure_alpha", "time_passes"]

# Short prompts of different kinds (prose, code, a list, dialogue): acceptance
# varies with content, and calibration wants a typical value, not a best case.
SAMPLE_PROMPTS: tuple[str, ...] = (
    "The history of the printing press begins with",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Here are five tips for staying focused while studying:\n1.",
    "Q: Why is the sky blue?\nA:",
)

WARM_TOKENS = 32


class _Stats(Protocol):
    mean_alpha: float


class _Generation(Protocol):
    stats: _Stats


class CalibratableDecoder(Protocol):
    """What ``calibrate`` needs from a decoder."""

    target: CausalLM
    draft: Optional[CausalLM]
    target_path: Optional[str]
    draft_path: Optional[str]
    n_threads: Optional[int]

    def generate(self, prompt: str, *, max_tokens: int, params: SamplingParams,
                 gamma: Any = None) -> _Generation:
        """Generate ``max_tokens`` tokens after ``prompt``."""


def calibrate(
    decoder: CalibratableDecoder,
    *,
    params: SamplingParams = SamplingParams(),
    gamma_max: int = 8,
    prompts: Optional[Sequence[str]] = None,
    n_tokens: int = 32,
    repeats: int = 3,
    cache: bool = True,
    recalibrate: bool = False,
    clock: Callable[[], float] = time.perf_counter,
) -> CostModel:
    """Measure T_target(k) for k = 1..gamma_max+1, T_draft(1) and α.

    With ``cache`` a stored calibration for the same model files, thread
    count and CPU is returned without measuring (``recalibrate`` forces a new
    measurement); when only the sampling settings differ, only α is
    re-measured.  The models' caches are left as they were found.

    Args:
        decoder: a loaded decoder (``.target``, ``.draft``, ``.target_path``,
            ``.draft_path``, ``.n_threads``, ``.generate(...)``).
        params: sampling settings α is measured at.
        gamma_max: the largest γ to plan for (T is measured up to γ_max + 1 rows).
        prompts: prompts for measuring α (default: :data:`SAMPLE_PROMPTS`).
        n_tokens: tokens generated per prompt when measuring α.
        repeats: timings per k; the median is kept (robust to a busy machine).
        clock: time source in seconds (replaceable in tests).
    """
    if gamma_max < 1:
        raise ValueError(f"gamma_max must be >= 1, got {gamma_max}")
    if repeats < 1 or n_tokens < 1:
        raise ValueError(f"repeats and n_tokens must be >= 1, got {repeats}, {n_tokens}")
    target_id = _identity(decoder.target_path)
    draft_id = _identity(decoder.draft_path)
    n_threads = int(decoder.n_threads or 0)
    cpu = cpu_model()
    sampling = _sampling_dict(params)
    path = calibration_path(calibration_key(target_id, draft_id, n_threads, cpu))

    cached: Optional[CostModel] = None
    if cache and not recalibrate and path.is_file():
        try:
            cached = CostModel.load(path)
        except (OSError, ValueError):
            cached = None  # unreadable or stale format: measure again
    if cached is not None and cached.k_max >= gamma_max + 1:
        if cached.sampling == sampling and cached.alpha is not None:
            return cached
        model = dataclasses.replace(cached, sampling=sampling,
                                    alpha=measure_alpha(decoder, params, prompts, n_tokens))
    else:
        target_ms = time_passes(decoder.target, range(1, gamma_max + 2), repeats, clock)
        draft_ms = (time_passes(decoder.draft, [1], repeats, clock)[0]
                    if decoder.draft is not None else 0.0)
        model = CostModel(
            target_ms=target_ms,
            draft_ms=draft_ms,
            alpha=measure_alpha(decoder, params, prompts, n_tokens),
            n_threads=n_threads,
            cpu=cpu,
            target=target_id,
            draft=draft_id,
            sampling=sampling,
        )
    if cache:
        model.save(path)
    return model


def cached_calibration(target_path: Optional[str], draft_path: Optional[str],
                       n_threads: Optional[int]) -> Optional[CostModel]:
    """The stored calibration of this pair, thread count and CPU, if any.

    Never measures: a decoder starting without one learns its costs online.
    """
    key = calibration_key(_identity(target_path), _identity(draft_path), int(n_threads or 0), cpu_model())
    path = calibration_path(key)
    if not path.is_file():
        return None
    try:
        return CostModel.load(path)
    except (OSError, ValueError):
        return None


def time_passes(model: CausalLM, ks: Sequence[int], repeats: int = 3,
                clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Median milliseconds of ``model.eval`` over k tokens with all k rows' logits.

    Evaluated after a short warm context (costs depend a little on context
    length); the cache is truncated back after every pass and restored to its
    original length at the end.  The k's are interleaved within each repeat so
    that a change of machine load affects every k alike.
    """
    ks = list(ks)
    start = model.n_past
    n_warm = min(WARM_TOKENS, model.n_ctx - start - max(ks))
    if n_warm < 1:
        raise ValueError(f"the model's context ({model.n_ctx} tokens) is too small to time "
                         f"passes of {max(ks)} rows after {start} cached tokens")
    vocab = model.n_vocab
    # Arbitrary but valid ids: timing does not depend on which tokens they are.
    tokens = [(101 + 7919 * i) % vocab for i in range(n_warm + max(ks))]
    times: dict[int, list[float]] = {k: [] for k in ks}
    try:
        model.eval(tokens[:n_warm], 1)
        base = model.n_past
        model.eval(tokens[n_warm:n_warm + 1], 1)  # untimed: first calls pay one-off setup
        model.truncate(base)
        for _ in range(repeats):
            for k in ks:
                t0 = clock()
                model.eval(tokens[n_warm:n_warm + k], k)
                times[k].append(1000.0 * (clock() - t0))
                model.truncate(base)
    finally:
        model.truncate(start)
    return [statistics.median(times[k]) for k in ks]


def measure_alpha(decoder: CalibratableDecoder, params: SamplingParams,
                  prompts: Optional[Sequence[str]] = None, n_tokens: int = 32) -> Optional[float]:
    """Mean exact acceptance Σ min(p, q) over short generations at γ = 4.

    None when the decoder has no drafter or no row was ever verified.
    """
    if getattr(decoder, "drafter", decoder.draft) is None:
        return None
    values = []
    for prompt in (SAMPLE_PROMPTS if prompts is None else prompts):
        gen = decoder.generate(prompt, max_tokens=n_tokens, params=params, gamma=4)
        a = gen.stats.mean_alpha
        if a is not None and 0.0 <= a <= 1.0 and getattr(gen.stats, "alpha_rows", 1):
            values.append(float(a))
    return statistics.fmean(values) if values else None


def _identity(path: Optional[str]) -> Optional[ModelIdentity]:
    return None if path is None else ModelIdentity.of(path)


def _sampling_dict(params: SamplingParams) -> dict[str, Any]:
    # The seed changes which tokens are drawn, not the acceptance rate.
    return {f.name: getattr(params, f.name) for f in dataclasses.fields(params) if f.name != "seed"}
