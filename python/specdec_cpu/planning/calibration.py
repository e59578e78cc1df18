"""Measure a (target, draft) pair's step costs and acceptance on this machine.

``calibrate`` times target passes over k = 1..γ_max+1 rows and single draft
tokens, then runs short speculative generations to measure α at the
requested sampling settings.  Results are cached per (model files, threads,
CPU) so that a second start is instant.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from typing import Any, Callable, Optional, Protocol, Sequence

import numpy as np

from ..core.protocols import CausalLM
from ..params import SamplingParams
from .costmodel import CostModel, ModelIdentity, calibration_key, calibration_path, cpu_model

__all__ = ["SAMPLE_PROMPTS", "cached_calibration", "calibrate", "ensure_timings", "initial_costs", "measure_alpha",
           "starting_costs", "time_passes"]

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
    @property
    def mean_alpha(self) -> float: ...


class _Generation(Protocol):
    @property
    def stats(self) -> _Stats: ...


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
    batch: int = 1,
    prompts: Optional[Sequence[str]] = None,
    n_tokens: int = 32,
    repeats: int = 3,
    cache: bool = True,
    recalibrate: bool = False,
    clock: Callable[[], float] = time.perf_counter,
    target: Optional[CausalLM] = None,
    draft: Optional[CausalLM] = None,
) -> CostModel:
    """Measure T_target(k) for k = 1..gamma_max+1, T_draft(1) and α; with
    ``batch`` > 1 also the curves a batched decoder of ``batch`` requests
    plans with: T_target over up to 64 rows (all requests' rows in one pass)
    and T_draft(b) for b = 1..batch (one draft pass for b requests).

    With ``cache`` a stored calibration for the same model files, thread
    count and CPU is returned without measuring (``recalibrate`` forces a new
    measurement); when only the sampling settings differ, only α is
    re-measured.

    What it leaves behind, when it measures α: the decoder's KV caches end
    empty, as after ``decoder.reset()``.  α is measured by generating from
    the sample prompts, which replaces whatever conversation the caches held;
    putting it back would cost a full pass over it and, computed in other
    batches, would not even be bit-identical (see docs/math.md §9), so the
    next request simply decodes its prompt in full, as on a fresh decoder.
    The decoder's random streams and γ controllers are not touched (α is
    measured with a seed of its own, or ``params.seed``, and at a fixed γ).
    When the stored calibration already answers (same files, threads, CPU
    and sampling settings), nothing runs and the decoder is left as it was.
    With ``cache`` the result is written to the calibration store.

    Args:
        decoder: a loaded decoder (``.target``, ``.draft``, ``.target_path``,
            ``.draft_path``, ``.n_threads``, ``.generate(...)``).
        params: sampling settings α is measured at.
        gamma_max: the largest γ to plan for (T is measured up to γ_max + 1 rows).
        batch: the most requests drafted for at once (1: one conversation).
        prompts: prompts for measuring α (default: :data:`SAMPLE_PROMPTS`).
        n_tokens: tokens generated per prompt when measuring α.
        repeats: timings per k; the median is kept (robust to a busy machine).
        clock: time source in seconds (replaceable in tests).
        target, draft: the models to time, when they are not the decoder's
            ``target`` and ``draft`` (one sequence of a batched decoder's).
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
    rows_max = gamma_max + 1 if batch <= 1 else max(gamma_max + 1, BATCH_ROWS)
    covered = cached is not None and cached.k_max >= rows_max and (
        batch <= 1 or decoder.draft is None or len(cached.draft_batch_ms or ()) >= batch)
    if cached is not None and covered:
        if cached.sampling == sampling and cached.alpha is not None:
            return cached
        model = dataclasses.replace(cached, sampling=sampling,
                                    alpha=_alpha_then_reset(decoder, params, prompts, n_tokens))
    else:
        ks = sorted(set(range(1, gamma_max + 2)) | {k for k in QUICK_TARGET_ROWS if k <= rows_max} | {rows_max})
        target_ms = _dense(ks, time_passes(decoder.target if target is None else target, ks, repeats, clock))
        draft_ms, draft_batch = 0.0, None
        if decoder.draft is not None:
            bs = sorted({b for b in QUICK_DRAFT_ROWS if b <= batch} | {max(batch, 1)})
            timed = decoder.draft if draft is None else draft
            draft_batch = _dense(bs, time_passes(timed, bs, repeats, clock, all_logits_up_to=DRAFT_LOGIT_ROWS))
            draft_ms = draft_batch[0]
        model = CostModel(
            target_ms=target_ms,
            draft_ms=draft_ms,
            draft_batch_ms=draft_batch if batch > 1 else None,
            alpha=_alpha_then_reset(decoder, params, prompts, n_tokens),
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
                clock: Callable[[], float] = time.perf_counter,
                all_logits_up_to: Optional[int] = None) -> list[float]:
    """Median milliseconds of ``model.eval`` over k tokens with all k rows'
    logits (for k above ``all_logits_up_to``: the last row's only).

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
                n_logits = k if all_logits_up_to is None or k <= all_logits_up_to else 1
                model.eval(tokens[n_warm:n_warm + k], n_logits)
                times[k].append(1000.0 * (clock() - t0))
                model.truncate(base)
    finally:
        model.truncate(start)
    return [statistics.median(times[k]) for k in ks]


#: Seed of the α measurement when ``params`` has none: the generations then
#: draw from streams of their own, not from the decoder's.
ALPHA_SEED = 0x5EED_A1FA


def measure_alpha(decoder: CalibratableDecoder, params: SamplingParams,
                  prompts: Optional[Sequence[str]] = None, n_tokens: int = 32) -> Optional[float]:
    """Mean exact acceptance Σ min(p, q) over short generations at γ = 4.

    None when the decoder has no drafter or no row was ever verified.  The
    generations use ``params.seed``, or :data:`ALPHA_SEED` when it is None,
    so the decoder's own random streams do not move; they do replace what
    the decoder's caches held (see :func:`calibrate`).
    """
    if not getattr(decoder, "has_drafter", decoder.draft is not None):
        return None
    if params.seed is None:
        params = dataclasses.replace(params, seed=ALPHA_SEED)
    values = []
    for prompt in (SAMPLE_PROMPTS if prompts is None else prompts):
        gen = decoder.generate(prompt, max_tokens=n_tokens, params=params, gamma=4)
        a = gen.stats.mean_alpha
        rows = getattr(gen.stats, "alpha_rows", 1)  # a stand-in decoder's stats may not count rows
        if a is not None and 0.0 <= a <= 1.0 and rows:
            values.append(float(a))
    return statistics.fmean(values) if values else None


def _alpha_then_reset(decoder: CalibratableDecoder, params: SamplingParams,
                      prompts: Optional[Sequence[str]], n_tokens: int) -> Optional[float]:
    """measure_alpha, then empty the decoder's caches (also after an error),
    so that calibration leaves a state as plain as a fresh decoder's."""
    try:
        return measure_alpha(decoder, params, prompts, n_tokens)
    finally:
        reset = getattr(decoder, "reset", None)
        if reset is not None:
            reset()


def _identity(path: Optional[str]) -> Optional[ModelIdentity]:
    return None if path is None else ModelIdentity.of(path)


def _sampling_dict(params: SamplingParams) -> dict[str, Any]:
    # The seed changes which tokens are drawn, not the acceptance rate; so does
    # ignore_eos but for the end tokens' few rows.  Penalties and biases appear
    # only when set (a cache written before they existed stays valid), as JSON
    # values (lists), which is what the store reads back.
    out: dict[str, Any] = {}
    for f in dataclasses.fields(params):
        value = getattr(params, f.name)
        if f.name in ("seed", "ignore_eos") or (f.name not in PIPELINE and value == f.default):
            continue
        out[f.name] = json.loads(json.dumps(value))
    return out


#: The sampling pipeline's own settings, always part of a stored calibration's key.
PIPELINE = ("temperature", "top_k", "top_p", "min_p")


# ---------------------------------------------------------------- first use
#: Rows a batched decoder's target pass is timed up to (8 requests × 8 rows);
#: the planner continues the curve linearly beyond.
BATCH_ROWS = 64

#: Row counts timed by the quick calibration (those up to the needed maximum);
#: the curve between them is interpolated.  Dense where γ is chosen, sparse
#: where only a batch's total rows reach.
QUICK_TARGET_ROWS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 13, 16, 24, 32, 48, 64)
QUICK_DRAFT_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128)
#: A draft pass needs one row's logits per request drafting at that depth
#: (DRAFT_LOGIT_ROWS or fewer requests in practice); its larger passes are a
#: draft's cache catching up (a prompt, a plain stretch), which needs the
#: last row's at most.  So the draft is timed with every row's logits up to
#: this count and with the last row's beyond.  The logits cost: on the
#: default draft (Q4_0, 2 threads) 32/64/128 rows took 177/325/672 ms with
#: every row's logits and 117/221/426 ms with the last row's, and catch-ups
#: in serving ran at the second (53 rows: 182–198 ms), so with the first the
#: planner priced every catch-up ~1.6× too high.
DRAFT_LOGIT_ROWS = 16


def ensure_timings(target: CausalLM, draft: Optional[CausalLM], *, target_path: Optional[str],
                   draft_path: Optional[str], n_threads: Optional[int], k_max: int, b_max: int = 1,
                   repeats: int = 2, progress: Optional[Callable[[str], None]] = None) -> CostModel:
    """The pair's pass times on this machine: the cached calibration when it
    covers T_target(k) up to ``k_max`` rows (and T_draft(b) up to ``b_max``),
    else a quick timing-only measurement (a few seconds for a memory-bound
    0.5B target), stored for next time with any α measured before.

    ``progress`` receives one line before measuring and one after, so a
    command line can say why its first start takes a few seconds.
    """
    key = calibration_key(_identity(target_path), _identity(draft_path), int(n_threads or 0), cpu_model())
    path = calibration_path(key)
    cached: Optional[CostModel] = None
    if path.is_file():
        try:
            cached = CostModel.load(path)
        except (OSError, ValueError):
            cached = None
    need_draft = draft is not None and b_max > 1
    if cached is not None and cached.k_max >= k_max and (
            not need_draft or (cached.draft_batch_ms is not None and len(cached.draft_batch_ms) >= b_max)):
        return cached
    if progress is not None:
        progress("measuring the models' pass times on this machine (first use; cached for next time) ...")
    t0 = time.perf_counter()
    ks = sorted({k for k in QUICK_TARGET_ROWS if k <= k_max} | {k_max})
    target_ms = _dense(ks, time_passes(target, ks, repeats))
    draft_ms, draft_batch = 0.0, None
    if draft is not None:
        bs = sorted({b for b in QUICK_DRAFT_ROWS if b <= b_max} | {max(b_max, 1)})
        draft_batch = _dense(bs, time_passes(draft, bs, repeats, all_logits_up_to=DRAFT_LOGIT_ROWS))
        draft_ms = draft_batch[0]
    model = CostModel(
        target_ms=target_ms, draft_ms=draft_ms, draft_batch_ms=draft_batch if b_max > 1 else None,
        alpha=cached.alpha if cached is not None else None, n_threads=int(n_threads or 0), cpu=cpu_model(),
        target=_identity(target_path), draft=_identity(draft_path),
        sampling=dict(cached.sampling) if cached is not None else {})
    try:
        model.save(path)
    except OSError:  # a read-only cache costs the next start a few seconds, nothing more
        pass
    if progress is not None:
        progress(f"measured in {time.perf_counter() - t0:.1f} s")
    return model


def _dense(ks: Sequence[int], ms: Sequence[float]) -> list[float]:
    """T(k) for k = 1..max(ks), interpolated between the measured counts
    (never decreasing: a pass over more rows does not take less time)."""
    dense = np.interp(np.arange(1, max(ks) + 1), np.asarray(ks, float), np.asarray(ms, float))
    return [float(x) for x in np.maximum.accumulate(dense)]


def starting_costs(calibration: object, *, target: CausalLM, draft: Optional[CausalLM],
                   target_path: Optional[str], draft_path: Optional[str], n_threads: Optional[int],
                   k_max: int, b_max: int = 1, measure_missing: bool = True,
                   progress: Optional[Callable[[str], None]] = None) -> Optional[CostModel]:
    """The cost model a decoder starts from, by its ``calibration`` argument:
    ``"auto"`` (the cached calibration; where there is none, with
    ``measure_missing`` the pass times are measured first,
    :func:`ensure_timings`, else None: the planner learns them from the
    decoder's first passes), ``"cached"`` (the cached one or None, never
    measuring), a ``CostModel`` as given, or None (priors)."""
    if calibration == "auto" and measure_missing:
        return ensure_timings(target, draft, target_path=target_path, draft_path=draft_path,
                              n_threads=n_threads, k_max=k_max, b_max=b_max, progress=progress)
    if calibration in ("auto", "cached"):
        return cached_calibration(target_path, draft_path, n_threads)
    if calibration is None or isinstance(calibration, CostModel):
        return calibration
    raise ValueError(f"calibration must be 'auto', 'cached', a CostModel or None, got {calibration!r}")


def initial_costs(decoder: CalibratableDecoder, calibration: object, *, k_max: int, b_max: int = 1,
                  target: Optional[CausalLM] = None, draft: Optional[CausalLM] = None,
                  measure_missing: bool = True,
                  progress: Optional[Callable[[str], None]] = None) -> Optional[CostModel]:
    """The cost model a loaded decoder starts from, by its ``calibration``
    setting: ``"measure"`` runs :func:`calibrate` on it now (``b_max``
    requests at once), anything else as :func:`starting_costs`.  ``target``
    and ``draft`` are the models to time (default: the decoder's own)."""
    if calibration == "measure":
        if decoder.draft is None:
            return None
        return calibrate(decoder, gamma_max=max(1, k_max - 1), batch=b_max, target=target, draft=draft)
    return starting_costs(calibration, target=decoder.target if target is None else target,
                          draft=decoder.draft if draft is None else draft, target_path=decoder.target_path,
                          draft_path=decoder.draft_path, n_threads=decoder.n_threads, k_max=k_max, b_max=b_max,
                          measure_missing=measure_missing, progress=progress)
