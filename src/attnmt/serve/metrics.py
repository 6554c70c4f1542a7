"""The server's Prometheus metrics: requests, sentences, batches, queue time and latency.

Each app has its own registry, so several apps (e.g. in tests) do not share counters.
Exposed at ``GET /metrics`` in the Prometheus text format.

Library: prometheus-client.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from attnmt.serve.batcher import Job

# Upper bounds of the histogram buckets: seconds for times, sentences for batch sizes.
SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SENTENCES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ServeMetrics:
    """Counters and histograms of one server (names prefixed ``attnmt_``)."""

    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("attnmt_requests", "HTTP requests to /v1/translate by status code",
                                ["code"], registry=r)
        self.sentences = Counter("attnmt_sentences", "sentences translated (empty ones included)", registry=r)
        self.batches = Counter("attnmt_batches", "search batches run by the dynamic batcher", registry=r)
        self.batch_sentences = Histogram("attnmt_batch_sentences", "sentences per search batch",
                                         buckets=SENTENCES, registry=r)
        self.queue_seconds = Histogram("attnmt_queue_seconds", "time a sentence waited before its batch began",
                                       buckets=SECONDS, registry=r)
        self.batch_seconds = Histogram("attnmt_batch_seconds", "time to search one batch", buckets=SECONDS, registry=r)
        self.request_seconds = Histogram("attnmt_request_seconds", "latency of /v1/translate requests",
                                         buckets=SECONDS, registry=r)
        self.queued = Gauge("attnmt_queued_sentences", "sentences waiting for the batcher", registry=r)
        self.streams_open = Gauge("attnmt_streams_open", "streamed translations in progress", registry=r)
        self.streams_stopped = Counter("attnmt_streams_stopped", "streamed sentences whose search stopped because "
                                       "their client went away", registry=r)

    def observe_batch(self, jobs: list[Job], started: float, seconds: float) -> None:
        """Record one batch (the :class:`DynamicBatcher` ``on_batch`` callback)."""
        self.batches.inc()
        self.batch_sentences.observe(len(jobs))
        self.batch_seconds.observe(seconds)
        for job in jobs:
            self.queue_seconds.observe(max(0.0, started - job.queued_at))

    def observe_request(self, code: int, started: float) -> None:
        """Record one /v1/translate request that began at ``started`` (``time.perf_counter()``)."""
        self.requests.labels(code=str(code)).inc()
        self.request_seconds.observe(time.perf_counter() - started)

    def render(self) -> bytes:
        """All metrics in the Prometheus text format."""
        return generate_latest(self.registry)
