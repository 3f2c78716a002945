"""Speak text through a real Pipecat pipeline into a WAV file (no network transport).

Used by ``pipecat-veena say`` and ``examples/wav_bot.py``: ``TTSSpeakFrame`` -> VeenaTTSService
-> WavSink, run by a ``PipelineWorker``, with the shared engine started beforehand.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from loguru import logger
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    ErrorFrame,
    Frame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner

from pipecat_veena.audio import BYTES_PER_SAMPLE, write_wav
from pipecat_veena.interface import SpeechEngine
from pipecat_veena.service import VeenaTTSService


class WavSink(FrameProcessor):
    """Collects the audio frames that reach it and writes them as one WAV file at the end.

    Args:
        path: the WAV file to write (on EndFrame or CancelFrame).
        sample_rate: the rate every audio frame must have.
    """

    def __init__(self, path: str | Path, sample_rate: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.path = Path(path)
        self.sample_rate = sample_rate
        self.pcm = bytearray()
        self.first_audio_at: float | None = None
        self.last_audio_at: float | None = None
        self._written = False

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Keep audio; write the file when the pipeline ends; pass every frame on."""
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            if frame.sample_rate != self.sample_rate:
                raise ValueError(
                    f"audio frame at {frame.sample_rate} Hz reached a {self.sample_rate} Hz sink"
                )
            now = time.perf_counter()
            self.first_audio_at = self.first_audio_at or now
            self.last_audio_at = now
            self.pcm.extend(frame.audio)
        elif isinstance(frame, EndFrame | CancelFrame) and not self._written:
            write_wav(self.path, bytes(self.pcm), self.sample_rate)
            self._written = True
        await self.push_frame(frame, direction)


class ErrorCollector(FrameProcessor):
    """Records the ErrorFrames that travel upstream to the head of the pipeline."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.errors: list[str] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Remember errors; pass every frame on."""
        await super().process_frame(frame, direction)
        if isinstance(frame, ErrorFrame):
            self.errors.append(frame.error)
        await self.push_frame(frame, direction)


@dataclass
class SayResult:
    """What ``say_to_wav`` produced and how fast.

    Attributes:
        path: the WAV file.
        sample_rate: its rate.
        audio_seconds: seconds of audio written.
        time_to_first_audio: seconds from queuing the text to the first audio frame at the sink.
        generation_seconds: seconds from queuing the text to the last audio frame.
        errors: error messages the pipeline reported.
    """

    path: Path
    sample_rate: int
    audio_seconds: float
    time_to_first_audio: float | None
    generation_seconds: float | None
    errors: list[str] = field(default_factory=list)

    @property
    def real_time_factor(self) -> float | None:
        """Generation time over audio time (below 1 is faster than real time)."""
        if not self.audio_seconds or self.generation_seconds is None:
            return None
        return self.generation_seconds / self.audio_seconds

    def summary(self) -> str:
        """One line for people: length, time to first audio and real-time factor (or why not)."""
        if not self.audio_seconds:
            why = f": {self.errors[0]}" if self.errors else ""
            return f"{self.path}: no audio was produced{why}"
        return (
            f"{self.path}: {self.audio_seconds:.2f} s at {self.sample_rate} Hz, first audio after "
            f"{self.time_to_first_audio * 1000:.0f} ms, real-time factor "
            f"{self.real_time_factor:.2f} (below 1 is faster than real time)"
        )


async def say_to_wav(
    engine: SpeechEngine,
    text: str,
    path: str | Path,
    *,
    voice: str | None = None,
    sample_rate: int | None = None,
    seed: int | None = None,
    language: str | None = None,
    normalize: bool | None = None,
    speed: float | None = None,
) -> SayResult:
    """Speak ``text`` with a started engine through a real Pipecat pipeline into a WAV file.

    Args:
        engine: a started engine (in-process or remote).
        text: what to say.
        path: the WAV file to write.
        voice: a voice of the engine (None: its default).
        sample_rate: WAV rate (None: the codec's rate); audio is resampled to it.
        seed: sampling seed for reproducible output.
        language: "hi" or "en" to speak numbers and dates in that language (None: per
            sentence, from its script).
        normalize: speak numbers, dates and codes as words (None: the engine's setting).
        speed: playback speed from 0.5 to 2.0 (None: the model's own pace).

    Returns:
        The file, its length and the timings.
    """
    rate = sample_rate or engine.sample_rate
    collector = ErrorCollector()
    tts = VeenaTTSService(
        engine, voice=voice, seed=seed, language=language, normalize=normalize, speed=speed
    )
    sink = WavSink(path, rate)
    worker = PipelineWorker(
        Pipeline([collector, tts, sink]),
        params=PipelineParams(
            audio_out_sample_rate=rate, enable_metrics=True, enable_usage_metrics=True
        ),
        idle_timeout_secs=None,
    )
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    started = time.perf_counter()
    await worker.queue_frames([TTSSpeakFrame(text), EndFrame()])
    await runner.run()
    audio_seconds = len(sink.pcm) / BYTES_PER_SAMPLE / rate
    result = SayResult(
        path=sink.path,
        sample_rate=rate,
        audio_seconds=audio_seconds,
        time_to_first_audio=None if sink.first_audio_at is None else sink.first_audio_at - started,
        generation_seconds=None if sink.last_audio_at is None else sink.last_audio_at - started,
        errors=collector.errors,
    )
    logger.debug(f"say_to_wav: {result}")
    return result
