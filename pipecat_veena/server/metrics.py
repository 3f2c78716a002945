"""Prometheus metrics of one speech server (its own registry, so several apps can share a process).

Streams and outcomes are counted as requests happen; the engine's own counters (unfinished
LLM requests, decode batch size) are read from ``engine.stats()`` at each scrape.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pipecat_veena.interface import SpeechEngine

#: Media type of ``render()``.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Where requests end: completed, cancelled (by the client or a drain), failed (an engine or
#: input error after acceptance), rejected (refused before any work), disconnected (the client
#: left or was too slow).
OUTCOMES = ("completed", "cancelled", "failed", "rejected", "disconnected")
_TTFA_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)


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
            "veena_decode_batch_size",
            "Mean number of codec windows decoded per batch since start",
            value=float(stats.get("decode_batch_mean", 0.0)),
        )


class ServerMetrics:
    """The server's metrics, in a registry of its own.

    Args:
        engine: the served engine (its counters are read at scrape time).
    """

    def __init__(self, engine: SpeechEngine) -> None:
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
        self.connections = Gauge(
            "veena_websocket_connections", "Open WebSocket connections", registry=r
        )
        self.ready = Gauge("veena_ready", "1 while the server takes new streams", registry=r)
        for api in ("ws", "http"):
            self.active_streams.labels(api)
            for outcome in OUTCOMES:
                self.requests.labels(api, outcome)
        r.register(_EngineCollector(engine))

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
