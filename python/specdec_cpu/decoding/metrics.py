"""Counters of a batched decoder, for logs, ``/metrics`` and benchmarks.

The scheduler thread updates them once per step; any thread may take a
:meth:`ServingMetrics.snapshot` at any time (a consistent copy, under a lock).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict

__all__ = ["MetricsSnapshot", "ServingMetrics", "OUTCOMES", "TTFT_BUCKETS"]

#: How a request can end (``error``: its own bad logits, or a failed pass;
#: ``rejected``: refused at submission because the queue was full).
OUTCOMES = ("stop", "length", "context", "cancelled", "timeout", "error", "rejected")
#: Upper bounds (seconds) of the time-to-first-token histogram's buckets: a
#: cached prompt's one pass (tens of ms) up to a long prompt behind a queue.
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class MetricsSnapshot:
    """The decoder's counters at one moment (totals since it started)."""

    requests: Dict[str, int]
    tokens_generated: int
    prompt_tokens: int
    prompt_tokens_cached: int
    prefix_cache_hits: int
    drafted: int
    accepted: int
    forced: int  # tokens a grammar forced, verified without a draft pass (not in drafted)
    alpha_sum: float
    alpha_rows: int
    steps: int
    target_passes: int
    target_rows: int
    draft_passes: int
    draft_rows: int
    target_seconds: float
    draft_seconds: float
    sampling_seconds: float
    step_seconds: float
    queue_depth: int
    active_sequences: int
    max_sequences: int
    uptime_seconds: float
    recent_tokens_per_second: float
    #: requests whose first token came within each of TTFT_BUCKETS' bounds (cumulative), then all of them
    ttft_buckets: tuple[int, ...]
    #: the sum of those requests' times to first token (submission to first token), seconds
    ttft_seconds: float

    @property
    def mean_alpha(self) -> float:
        """Mean exact acceptance Σ min(p, q) of every verified draft row."""
        return self.alpha_sum / self.alpha_rows if self.alpha_rows else 0.0

    @property
    def acceptance(self) -> float:
        """Accepted / drafted tokens."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_target_pass(self) -> float:
        """Emitted tokens per target ``llama_decode`` (all requests together)."""
        return self.tokens_generated / self.target_passes if self.target_passes else 0.0

    @property
    def scheduler_seconds(self) -> float:
        """Step time spent outside the model passes and the sampling kernels."""
        return max(self.step_seconds - self.target_seconds - self.draft_seconds - self.sampling_seconds, 0.0)


@dataclass
class ServingMetrics:
    """Mutable counters behind :class:`MetricsSnapshot` (see there)."""

    max_sequences: int = 0
    requests: Counter = field(default_factory=Counter)
    tokens_generated: int = 0
    prompt_tokens: int = 0
    prompt_tokens_cached: int = 0
    prefix_cache_hits: int = 0
    drafted: int = 0
    accepted: int = 0
    forced: int = 0
    alpha_sum: float = 0.0
    alpha_rows: int = 0
    steps: int = 0
    target_passes: int = 0
    target_rows: int = 0
    draft_passes: int = 0
    draft_rows: int = 0
    target_seconds: float = 0.0
    draft_seconds: float = 0.0
    sampling_seconds: float = 0.0
    step_seconds: float = 0.0
    queue_depth: int = 0
    active_sequences: int = 0
    started: float = field(default_factory=time.monotonic)
    ttft_counts: list[int] = field(default_factory=lambda: [0] * (len(TTFT_BUCKETS) + 1))  # per bucket, +Inf last
    ttft_seconds: float = 0.0
    _rate: float = 0.0  # tokens/s, moving average over steps
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def lock(self) -> threading.Lock:
        """Hold it while updating several counters together."""
        return self._lock

    def count_request(self, outcome: str) -> None:
        with self._lock:
            self.requests[outcome] += 1

    def record_first_token(self, seconds: float) -> None:
        """One request's time to first token (from submission), into the histogram."""
        i = next((j for j, bound in enumerate(TTFT_BUCKETS) if seconds <= bound), len(TTFT_BUCKETS))
        with self._lock:
            self.ttft_counts[i] += 1
            self.ttft_seconds += seconds

    def record_rate(self, tokens: int, seconds: float, weight: float = 0.05) -> None:
        """Fold one step's tokens/s into the recent rate (call with the lock held)."""
        if seconds > 0:
            self._rate += weight * (tokens / seconds - self._rate)

    def snapshot(self) -> MetricsSnapshot:
        with self._lock:
            return MetricsSnapshot(
                requests={k: int(self.requests.get(k, 0)) for k in OUTCOMES},
                tokens_generated=self.tokens_generated,
                prompt_tokens=self.prompt_tokens,
                prompt_tokens_cached=self.prompt_tokens_cached,
                prefix_cache_hits=self.prefix_cache_hits,
                drafted=self.drafted,
                accepted=self.accepted,
                forced=self.forced,
                alpha_sum=self.alpha_sum,
                alpha_rows=self.alpha_rows,
                steps=self.steps,
                target_passes=self.target_passes,
                target_rows=self.target_rows,
                draft_passes=self.draft_passes,
                draft_rows=self.draft_rows,
                target_seconds=self.target_seconds,
                draft_seconds=self.draft_seconds,
                sampling_seconds=self.sampling_seconds,
                step_seconds=self.step_seconds,
                queue_depth=self.queue_depth,
                active_sequences=self.active_sequences,
                max_sequences=self.max_sequences,
                uptime_seconds=time.monotonic() - self.started,
                recent_tokens_per_second=self._rate,
                ttft_buckets=tuple(itertools.accumulate(self.ttft_counts)),
                ttft_seconds=self.ttft_seconds,
            )
