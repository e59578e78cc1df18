"""``/metrics``: a BatchedDecoder's counters in Prometheus' text format.

A collector reads one :class:`~specdec_cpu.decoding.metrics.MetricsSnapshot`
per scrape, so the numbers are consistent with each other and nothing is
counted twice.  Counters are totals since the decoder started; rates
(tokens/s) are what Prometheus' ``rate()`` makes of them, and
``specdec_tokens_per_second`` is the decoder's own recent average.
"""

from __future__ import annotations

from typing import Iterator, Optional

from fastapi.responses import Response
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ..decoding.batched import BatchedDecoder
from ..decoding.metrics import OUTCOMES, TTFT_BUCKETS

__all__ = ["DecoderCollector", "metrics_response"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class DecoderCollector(Collector):
    """The metrics of one decoder (none while it is loading)."""

    def __init__(self, decoder: Optional[BatchedDecoder], labels: Optional[dict] = None) -> None:
        self.decoder = decoder
        self.names = list(labels or {})
        self.values = [str(v) for v in (labels or {}).values()]

    def collect(self) -> Iterator[Metric]:
        names, values = self.names, self.values
        ready = GaugeMetricFamily("specdec_ready", "1 when the model is loaded and serving", labels=names)
        ready.add_metric(values, 0.0 if self.decoder is None or not self.decoder.healthy else 1.0)
        yield ready
        if self.decoder is None:
            return
        m = self.decoder.metrics()
        embedded = self.decoder.embedding_counts()
        requests = CounterMetricFamily("specdec_requests", "Requests ended, by outcome",
                                       labels=["outcome", *names])
        for outcome in OUTCOMES:
            requests.add_metric([outcome, *values], m.requests.get(outcome, 0))
        yield requests
        ttft = HistogramMetricFamily(
            "specdec_time_to_first_token_seconds",
            "Seconds from a request's submission to the decoder to its first token (queue and prompt included)",
            labels=names)
        bounds = [*(str(b) for b in TTFT_BUCKETS), "+Inf"]
        ttft.add_metric(values, list(zip(bounds, m.ttft_buckets)), m.ttft_seconds)
        yield ttft
        for name, doc, value in (
            ("specdec_tokens_generated", "Tokens emitted to clients", m.tokens_generated),
            ("specdec_prompt_tokens", "Prompt tokens of admitted requests", m.prompt_tokens),
            ("specdec_prompt_tokens_cached", "Prompt tokens reused from cached prefixes", m.prompt_tokens_cached),
            ("specdec_prefix_cache_hits", "Requests that reused a cached prompt prefix", m.prefix_cache_hits),
            ("specdec_drafted_tokens", "Draft tokens verified", m.drafted),
            ("specdec_accepted_tokens", "Draft tokens accepted", m.accepted),
            ("specdec_forced_tokens", "Tokens a grammar forced, emitted without a draft pass", m.forced),
            ("specdec_steps", "Scheduler steps", m.steps),
            ("specdec_target_passes", "Target model passes (llama_decode calls)", m.target_passes),
            ("specdec_target_rows", "Rows in all target passes", m.target_rows),
            ("specdec_draft_passes", "Draft model passes", m.draft_passes),
            ("specdec_target_seconds", "Seconds in target passes", m.target_seconds),
            ("specdec_draft_seconds", "Seconds in draft passes", m.draft_seconds),
            ("specdec_sampling_seconds", "Seconds in the sampling and verify kernels", m.sampling_seconds),
            ("specdec_scheduler_seconds", "Step seconds outside passes and kernels", m.scheduler_seconds),
            ("specdec_embedding_inputs", "Texts and token-id lists embedded (/v1/embeddings)", embedded.inputs),
            ("specdec_embedding_tokens", "Tokens of the inputs embedded", embedded.tokens),
            ("specdec_embedding_seconds", "Seconds in embedding passes", embedded.seconds),
        ):
            c = CounterMetricFamily(name, doc, labels=names)
            c.add_metric(values, value)
            yield c
        for name, doc, value in (
            ("specdec_mean_alpha", "Mean exact acceptance Σ min(p, q) of every verified draft row", m.mean_alpha),
            ("specdec_tokens_per_target_pass", "Tokens emitted per target pass (all requests)",
             m.tokens_per_target_pass),
            ("specdec_tokens_per_second", "Recent tokens/s of the whole decoder", m.recent_tokens_per_second),
            ("specdec_queue_depth", "Requests waiting for a free sequence", m.queue_depth),
            ("specdec_active_sequences", "Requests holding a sequence", m.active_sequences),
            ("specdec_max_sequences", "Sequences decoded at once", m.max_sequences),
        ):
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(values, value)
            yield g


def metrics_response(decoder: Optional[BatchedDecoder], labels: Optional[dict] = None) -> Response:
    """The scrape's body (a registry of its own: several apps may share a process)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DecoderCollector(decoder, labels))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE)
