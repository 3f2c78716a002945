"""The spans of one test, though OpenTelemetry's global tracer provider can be set once a process.

Pipecat (``trace.get_tracer("pipecat")``), LiveKit Agents and this package all trace through the
global provider, so tests must use it; it cannot be unset. The first ``collect()`` installs one
SDK provider whose sampler records only while some test collects: between collections every
span is OpenTelemetry's non-recording no-op, as if no provider were set, so nothing leaks into
other tests (their code sees ``span.is_recording()`` false, as without a provider). Should
something else have set an SDK provider first, its spans are collected through an added
processor instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult

_collectors: list[InMemorySpanExporter] = []
_installed = False


class _WhileCollecting(Sampler):
    """Record and sample every span while a test collects; drop them all otherwise."""

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None,
                      links=None, trace_state=None) -> SamplingResult:  # fmt: skip
        if not _collectors:
            return SamplingResult(Decision.DROP)
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)

    def get_description(self) -> str:
        return "WhileCollecting"


class _ToCollectors(SpanProcessor):
    """Hand each ended span to the collecting tests' exporters."""

    def on_end(self, span: ReadableSpan) -> None:
        for exporter in list(_collectors):
            exporter.export([span])


def _install() -> None:
    global _installed
    if _installed:
        return
    provider = TracerProvider(sampler=_WhileCollecting())
    provider.add_span_processor(_ToCollectors())
    trace.set_tracer_provider(provider)  # a warning, and no effect, when one is set already
    current = trace.get_tracer_provider()
    if current is not provider:
        if not isinstance(current, TracerProvider):
            raise RuntimeError(f"a non-SDK tracer provider is set globally: {current!r}")
        current.add_span_processor(_ToCollectors())
    _installed = True


@contextmanager
def collect() -> Iterator[InMemorySpanExporter]:
    """Record every span ended inside the block; ``.get_finished_spans()`` lists them."""
    _install()
    exporter = InMemorySpanExporter()
    _collectors.append(exporter)
    try:
        yield exporter
    finally:
        _collectors.remove(exporter)


def by_name(spans, name: str) -> list[ReadableSpan]:
    """The spans called ``name``."""
    return [s for s in spans if s.name == name]


def parent_of(spans, span: ReadableSpan) -> ReadableSpan | None:
    """``span``'s parent among ``spans`` (None: a root, or a parent not collected)."""
    if span.parent is None:
        return None
    return next((s for s in spans if s.context.span_id == span.parent.span_id), None)


def events(span: ReadableSpan) -> list[str]:
    """The names of ``span``'s events, in order."""
    return [e.name for e in span.events]


async def pipeline_says(engine, text: str) -> int:
    """Speak ``text`` through a Pipecat pipeline with tracing on (``PipelineTask(enable_tracing=
    True)``) and a ``VeenaTTSService`` over ``engine``; returns the audio frames that came out."""
    from pipecat.frames.frames import EndFrame, TTSAudioRawFrame, TTSSpeakFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.runner import PipelineRunner
    from pipecat.pipeline.task import PipelineTask
    from pipecat.pipeline.worker import PipelineParams
    from pipecat.processors.frame_processor import FrameProcessor

    from pipecat_veena.service import VeenaTTSService

    class Sink(FrameProcessor):
        frames = 0

        async def process_frame(self, frame, direction) -> None:
            await super().process_frame(frame, direction)
            self.frames += isinstance(frame, TTSAudioRawFrame)
            await self.push_frame(frame, direction)

    sink = Sink()
    task = PipelineTask(
        Pipeline([VeenaTTSService(engine, seed=3), sink]),
        params=PipelineParams(audio_out_sample_rate=16000),
        enable_tracing=True,
        conversation_id="call-1",
    )
    await task.queue_frames([TTSSpeakFrame(text), EndFrame()])
    runner = PipelineRunner(handle_sigint=False)
    await runner.add_workers(task)
    await runner.run()
    return sink.frames
