"""Prometheus metrics of one speech server (its own registry, so several apps can share a process).

Streams, outcomes, errors and per-utterance timings are recorded as requests happen; the engine's
own counters (unfinished LLM requests, streams waiting for their first token, decode batch sizes)
are read from ``engine.stats()`` at each scrape. Names carry their units (``_seconds``,
``_total``); labels are bounded sets (API, outcome, error code): never a request id.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from pipecat_veena.interface import SpeechEngine
from pipecat_veena.remote.protocol import ErrorCode

#: Media type of ``render()``.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: The two APIs (the ``api`` label): the streaming WebSocket and the OpenAI HTTP route.
APIS = ("ws", "http")
#: Where requests end: completed, cancelled (by the client or a drain), failed (an engine or
#: input error after acceptance), rejected (refused before any work), disconnected (the client
#: left or was too slow).
OUTCOMES = ("completed", "cancelled", "failed", "rejected", "disconnected")
#: Who cancelled an utterance (``veena_cancels_total{by}``): the client, or a server drain.
CANCELLERS = ("client", "drain")
#: Every error code a client can be sent (the ``code`` label of ``veena_errors_total``).
ERROR_CODES = tuple(v for k, v in vars(ErrorCode).items() if k.isupper())
_TTFA_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)
_QUEUE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# audio ahead of playback: below 0 the listener heard a gap
_MARGIN_BUCKETS = (
    -10.0, -5.0, -2.0, -1.0, -0.5, -0.25, -0.1, 0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip
_TOKENS_PER_S_BUCKETS = (2.5, 5, 10, 25, 50, 75, 100, 150, 200, 300, 500, 1000, 2000)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class _EngineCollector(Collector):
    """Reads the engine's live counters when Prometheus scrapes."""

    def __init__(self, engine: SpeechEngine) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        try:
            stats: dict[str, Any] = self._engine.stats() if self._engine.is_running else {}
        except Exception:  # a scrape never fails because the engine is stopping
            stats = {}
        yield GaugeMetricFamily(
            "veena_engine_unfinished_requests",
            "LLM requests the engine's vLLM still holds (running or queued)",
            value=float(stats.get("unfinished_requests", 0)),
        )
        yield GaugeMetricFamily(
            "veena_engine_active_streams",
            "Utterances the engine is generating",
            value=float(stats.get("active_streams", 0)),
        )
        yield GaugeMetricFamily(
            "veena_waiting_streams",
            "Utterances the engine took that have no LLM token yet (queued for a vLLM slot or "
            "in prefill)",
            value=float(stats.get("waiting_streams", 0)),
        )
        sizes: dict[int, int] = stats.get("decode_batch_sizes", {})
        buckets = [
            (str(float(le)), float(sum(n for size, n in sizes.items() if size <= le)))
            for le in _BATCH_BUCKETS
        ]
        yield HistogramMetricFamily(
            "veena_decode_batch_size",
            "Codec windows decoded per batch (across streams)",
            buckets=[*buckets, ("+Inf", float(sum(sizes.values())))],
            sum_value=float(sum(size * n for size, n in sizes.items())),
        )


class ServerMetrics:
    """The server's metrics, in a registry of its own.

    Args:
        engine: the served engine (its counters are read at scrape time).
        max_streams: the server's cap on concurrent streams (``veena_stream_capacity``).
    """

    def __init__(self, engine: SpeechEngine, max_streams: int = 0) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.active_streams = Gauge(
            "veena_active_streams", "Utterances in flight", ["api"], registry=r
        )
        self.requests = Counter(
            "veena_requests", "Utterances by API and outcome", ["api", "outcome"], registry=r
        )
        self.time_to_first_audio = Histogram(
            "veena_time_to_first_audio_seconds",
            "From accepting an utterance to its first audio being queued for the client",
            ["api"],
            buckets=_TTFA_BUCKETS,
            registry=r,
        )
        self.real_time_factor = Histogram(
            "veena_real_time_factor",
            "Generation time over audio duration of completed utterances (below 1: faster "
            "than real time)",
            ["api"],
            buckets=_RTF_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "veena_queue_wait_seconds",
            "From the engine taking an utterance to its first LLM token (waiting for a vLLM "
            "slot, plus prefill)",
            ["api"],
            buckets=_QUEUE_BUCKETS,
            registry=r,
        )
        self.real_time_margin = Histogram(
            "veena_real_time_margin_seconds",
            "At each audio chunk of an utterance given whole: audio produced minus wall time "
            "since its first chunk (audio ahead of playback; below 0 the listener heard a gap)",
            ["api"],
            buckets=_MARGIN_BUCKETS,
            registry=r,
        )
        self.tokens_per_second = Histogram(
            "veena_llm_tokens_per_second",
            "LLM tokens per second of completed utterances given whole, from their first token "
            "to their last audio",
            ["api"],
            buckets=_TOKENS_PER_S_BUCKETS,
            registry=r,
        )
        self.tokens = Counter("veena_llm_tokens", "LLM tokens generated", ["api"], registry=r)
        self.errors = Counter(
            "veena_errors", "Errors sent to clients, by code", ["api", "code"], registry=r
        )
        self.cancels = Counter(
            "veena_cancels", "Utterances cancelled, by who cancelled", ["api", "by"], registry=r
        )
        self.capacity = Gauge(
            "veena_stream_capacity", "The server's cap on concurrent streams", registry=r
        )
        self.capacity.set(max_streams)
        self.connections = Gauge(
            "veena_websocket_connections", "Open WebSocket connections", registry=r
        )
        self.ready = Gauge("veena_ready", "1 while the server takes new streams", registry=r)
        for api in APIS:  # every series exists from the start: rate() and alerts see zeros
            for metric in (self.active_streams, self.tokens):
                metric.labels(api)
            for outcome in OUTCOMES:
                self.requests.labels(api, outcome)
            for code in ERROR_CODES:
                self.errors.labels(api, code)
            for by in CANCELLERS:
                self.cancels.labels(api, by)
        r.register(_EngineCollector(engine))

    def error(self, api: str, code: str) -> None:
        """Count an error sent to a client of ``api``."""
        self.errors.labels(api, code).inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
