"""OpenTelemetry traces, when the ``otel`` extra is installed: the one owner of span names.

Every layer calls the few functions here; none imports OpenTelemetry itself. Without the
``opentelemetry-api`` package nothing is imported and every function is a cheap no-op (it
returns None). With it, spans go to the global tracer provider the application configures
(``opentelemetry.trace.set_tracer_provider``, or Pipecat's ``setup_tracing``); with none
configured, OpenTelemetry's own no-op spans cost about a microsecond per utterance.

Spans:

- ``veena.utterance`` (the engine, one per ``VeenaEngine.stream``): events ``prompt`` (each
  part), ``first_token`` (the queue wait), ``first_audio``, ``part`` (each part done),
  ``abort`` and the exception of a failure; attributes ``veena.*`` (``UtteranceTrace``).
- ``veena.speech`` (the speech server, kind SERVER, one per ``speak`` or ``POST
  /v1/audio/speech``), continuing the caller's W3C trace context (``traceparent``).

Front doors need no span of their own: Pipecat's ``@traced_tts`` opens ``tts`` and LiveKit
Agents ``tts_request``/``tts_request_run``; the engine's spans nest under them.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from pipecat_veena.logs import degrade_once

#: The instrumentation scope of every span of this package.
SCOPE = "pipecat_veena"
UTTERANCE_SPAN = "veena.utterance"
SERVER_SPAN = "veena.speech"

_otel: Any = None  # the loaded API (a namespace), False once found missing


def _api() -> Any:
    """The OpenTelemetry API, imported on first use; None when it is not installed."""
    global _otel
    if _otel is None:
        try:
            from opentelemetry import context, trace
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError:
            _otel = False
        else:

            class _Api:
                pass

            api = _Api()
            api.context, api.trace = context, trace
            api.w3c = TraceContextTextMapPropagator()
            _otel = api
    return _otel or None


def available() -> bool:
    """True when the OpenTelemetry API is installed (the ``otel`` extra)."""
    return _api() is not None


def _tracer(api: Any) -> Any:
    return api.trace.get_tracer(SCOPE)


class UtteranceTrace:
    """The span of one engine utterance; the engine calls these at its milestones.

    Times are seconds from the span's start (``perf_counter``). At the end the span carries
    ``veena.tokens``, ``veena.prompt_tokens``, ``veena.audio_seconds``, ``veena.ttfa_seconds``,
    ``veena.queue_seconds``, ``veena.real_time_margin_seconds`` (the least audio ahead of
    real-time playback from the first audio on, at each chunk: below 0 a listener heard a
    gap), ``veena.cancelled`` and ``veena.cut``.
    """

    __slots__ = ("span", "started", "first_audio_at", "margin", "queue_s")

    def __init__(self, span: Any) -> None:
        self.span = span
        self.started = time.perf_counter()
        self.first_audio_at: float | None = None
        self.margin: float | None = None
        self.queue_s: float | None = None

    def prompt(self, index: int, prompt_tokens: int, characters: int) -> None:
        """Part ``index`` goes to the LLM."""
        self.span.add_event(
            "prompt",
            {"veena.part": index, "veena.prompt_tokens": prompt_tokens,
             "veena.characters": characters},
        )  # fmt: skip

    def first_token(self) -> None:
        """The first LLM token arrived: the wait before it is the queue wait."""
        self.queue_s = time.perf_counter() - self.started
        self.span.add_event("first_token", {"veena.queue_seconds": self.queue_s})

    def chunk(self, audio_s: float) -> None:
        """A chunk is out, after ``audio_s`` seconds of audio before it."""
        now = time.perf_counter()
        if self.first_audio_at is None:
            self.first_audio_at = now
            ttfa = now - self.started
            self.span.add_event("first_audio", {"veena.ttfa_seconds": ttfa})
            return
        margin = audio_s - (now - self.first_audio_at)
        if self.margin is None or margin < self.margin:
            self.margin = margin

    def part(self, index: int, tokens: int, audio_s: float) -> None:
        """Part ``index`` finished generating (``tokens`` so far, ``audio_s`` decoded so far)."""
        self.span.add_event(
            "part", {"veena.part": index, "veena.tokens": tokens, "veena.audio_seconds": audio_s}
        )

    def end(
        self,
        *,
        tokens: int,
        prompt_tokens: int,
        audio_s: float,
        cut: str | None,
        cancelled: bool,
        error: BaseException | None = None,
    ) -> None:
        """Close the span with the utterance's figures; ``error`` marks it failed."""
        span = self.span
        attributes: dict[str, Any] = {
            "veena.tokens": tokens,
            "veena.prompt_tokens": prompt_tokens,
            "veena.audio_seconds": audio_s,
            "veena.cancelled": cancelled,
        }
        if self.first_audio_at is not None:
            attributes["veena.ttfa_seconds"] = self.first_audio_at - self.started
        if self.queue_s is not None:
            attributes["veena.queue_seconds"] = self.queue_s
        if self.margin is not None:
            attributes["veena.real_time_margin_seconds"] = self.margin
        if cut is not None:
            attributes["veena.cut"] = cut
        span.set_attributes(attributes)
        if cancelled:
            span.add_event("abort")
        if error is not None:
            api = _api()
            span.record_exception(error)
            span.set_status(api.trace.Status(api.trace.StatusCode.ERROR, type(error).__name__))
        span.end()


def utterance(
    request_id: str, voice: str, model: str, characters: int, parts: int
) -> UtteranceTrace | None:
    """Open the span of one engine utterance under the current span; None when not traced."""
    api = _api()
    if api is None:
        return None
    span = _tracer(api).start_span(
        UTTERANCE_SPAN,
        attributes={
            "veena.request_id": request_id,
            "veena.voice": voice,
            "veena.model": model,
            "veena.characters": characters,
            "veena.parts": parts,
        },
    )
    if not span.is_recording():
        return None
    return UtteranceTrace(span)


def server_span(traceparent: str | None, attributes: dict[str, Any]) -> Any:
    """Open the server's span of one utterance, continuing ``traceparent`` (W3C) if given.

    Without a (valid) ``traceparent`` the span continues the current context (none on a
    server: a new trace). Returns None when not traced.
    """
    api = _api()
    if api is None:
        return None
    parent = api.w3c.extract({"traceparent": traceparent}) if traceparent else None
    span = _tracer(api).start_span(
        SERVER_SPAN, context=parent, kind=api.trace.SpanKind.SERVER, attributes=attributes
    )
    return span if span.is_recording() else None


def end_span(span: Any, attributes: dict[str, Any]) -> None:
    """Set ``attributes`` (None values left out) on a span from here and end it."""
    if span is None:
        return
    span.set_attributes({k: v for k, v in attributes.items() if v is not None})
    span.end()


def pipecat_tts_span(service: Any, context_id: str) -> Any:
    """The ``tts`` span Pipecat's ``@traced_tts`` opened for ``context_id``, or None.

    Pipecat (1.14) keeps those spans in the service's private ``_tts_spans``,
    ``{context_id: {"span": span, ...}}``; call this only while Pipecat traces the service.
    Read behind a guard: missing or of another shape, it returns None (the engine's span then
    starts its own trace instead of nesting under Pipecat's) and warns once.
    """
    spans = getattr(service, "_tts_spans", None)
    if isinstance(spans, dict):
        entry = spans.get(context_id)
        if entry is None:  # no span for this context (Pipecat did not open one)
            return None
        span = entry.get("span") if isinstance(entry, dict) else None
        if callable(getattr(span, "get_span_context", None)):
            return span
    degrade_once(
        "pipecat._tts_spans",
        "this Pipecat no longer keeps its tts spans in TTSService._tts_spans "
        "({context_id: {'span': span}}): the engine's spans will not nest under Pipecat's "
        "tts span (tested with Pipecat 1.14)",
    )
    return None


def traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span, to send with a request; None: no trace."""
    api = _api()
    if api is None or not api.trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    api.w3c.inject(carrier)
    return carrier.get("traceparent")


async def within(span: Any, chunks: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """Iterate ``chunks`` with ``span`` current (spans its steps open are its children).

    The context is set only while ``chunks`` runs, never across this iterator's own yields,
    so the caller's context is left as it was. Pass the result to ``contextlib.aclosing``.
    """
    api = _api()
    ctx = api.trace.set_span_in_context(span)
    try:
        while True:
            token = api.context.attach(ctx)
            try:
                item = await anext(chunks)
            except StopAsyncIteration:
                return
            finally:
                api.context.detach(token)
            yield item
    finally:
        await chunks.aclose()


def traced(span: Any, chunks: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """``chunks`` run with ``span`` current when there is a span, else ``chunks`` as they are."""
    return chunks if span is None else within(span, chunks)
