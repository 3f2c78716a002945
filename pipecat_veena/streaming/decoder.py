"""Sliding-window streaming decode: a pure window scheduler and the stream decoder built on it.

Frames are the codec's unit of time (codecs/base.py). Each decode covers the frames
``[context_start, context_end)`` and keeps the audio of ``[emit_start, emit_end)``: the left
context (at least the codec's receptive field) makes the left seam exact, the lookahead R is the
latency knob for the right seam. The first chunk is small (fast first audio), later chunks grow by
``growth`` up to ``max_chunk_frames``, so the left context and the lookahead are paid rarely and
the total decode work stays linear in the utterance. At the end the rest is flushed with no
lookahead. The scheduler and its numbers (schedule.py, ``StreamConfig``) are plain integer
logic; ``StreamDecoder`` adds codes, audio and counters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from loguru import logger

from pipecat_veena.codecs.base import AudioCodec, CodecWindow
from pipecat_veena.streaming.schedule import StreamConfig, StreamScheduler, Window

__all__ = ["DecodeJob", "StreamDecoder"]


@dataclass(frozen=True)
class DecodeJob:
    """A planned decode of one stream: what the codec gets and what the stream keeps.

    Attributes:
        window: the codec input (frames of the context span, condition, absolute start).
        span: the frame ranges of this decode.
        index: sequence number within the stream; jobs are accepted in this order.
    """

    window: CodecWindow
    span: Window
    index: int


class StreamDecoder:
    """Turns a stream of codec codes into audio chunks with the sliding-window schedule.

    ``push`` / ``finish`` decode synchronously through ``codec.decode_windows`` (a blocking torch
    call: use a worker thread). The engine uses the split form instead: ``plan`` / ``plan_finish``
    give jobs, a batcher decodes their windows, and ``accept`` stitches each result in order;
    ``push`` is exactly plan + decode + accept. Output chunks are float32 mono at
    ``codec.sample_rate``; concatenated they equal one offline decode of all the codes (exactly
    when L and R reach the codec's receptive field, else to the SNR measured in BENCHMARKS.md).
    """

    def __init__(
        self,
        codec: AudioCodec,
        config: StreamConfig | None = None,
        *,
        condition: Sequence[int] | np.ndarray | None = None,
    ) -> None:
        self.codec = codec
        self.config = config or StreamConfig.for_codec(codec)
        self._condition = _check_condition(codec, condition)
        max_crossfade = codec.samples_per_frame * min(
            self.config.lookahead_frames, self.config.first_frames
        )
        if self.config.crossfade_samples > max_crossfade:
            raise ValueError(
                f"crossfade_samples={self.config.crossfade_samples} exceeds what the lookahead "
                f"and the first chunk cover ({max_crossfade}): lower it or raise lookahead_frames"
            )
        self._left = self.config.left_context(codec)
        self.scheduler = StreamScheduler.from_config(self.config, self._left)
        self._k = codec.codes_per_frame
        self._codes: list[int] = []  # flat codes from frame self._base on
        self._base = 0
        self._planned = 0
        self._accepted = 0
        self._tail: np.ndarray | None = None
        #: Frames of the windows of accepted jobs (context included; BiCodec runs its wave
        #: generator over the emitted frames and its receptive field only).
        self.frames_decoded = 0
        #: Frames whose audio has been returned.
        self.frames_emitted = 0
        #: Samples returned so far.
        self.samples_emitted = 0

    @property
    def frames_received(self) -> int:
        """Complete frames received so far."""
        return self._base + len(self._codes) // self._k

    @property
    def frames_until_due(self) -> int:
        """Frames still to arrive before the next regular chunk is due (0: one is due)."""
        return self.scheduler.frames_until_due(self.frames_received)

    def plan(self, codes: Sequence[int], *, urgent: bool = False) -> list[DecodeJob]:
        """Add codes (flat ints, K per frame; a partial frame waits) and plan what is ready.

        With ``urgent`` (the listener's buffer is running low) every ready frame is planned now.
        """
        if self.scheduler.final:
            raise ValueError("codes pushed after finish(): start a new StreamDecoder")
        self._codes.extend(codes)
        return self._jobs(final=False, urgent=urgent)

    def plan_finish(self) -> list[DecodeJob]:
        """End the stream: plan the flush of every remaining frame (no lookahead)."""
        partial = len(self._codes) % self._k
        if partial:
            # The LLM stopped inside a frame (e.g. at max_tokens): decode every complete frame.
            logger.warning(f"stream ended inside a frame: dropped {partial} of {self._k} codes")
            del self._codes[-partial:]
        return self._jobs(final=True)

    def accept(self, job: DecodeJob, audio: np.ndarray) -> np.ndarray:
        """Stitch the decoded audio of ``job`` and return the samples it emits.

        Args:
            job: the next job returned by ``plan`` / ``plan_finish`` (in order).
            audio: float32 (kept_frames * samples_per_frame,): the codec's output for
                ``job.window`` (its emitted frames, and the crossfade's past them).

        Returns:
            float32 (emit_frames * samples_per_frame,) in [-1, 1] at the codec rate.
        """
        if job.index != self._accepted:
            raise ValueError(f"job {job.index} accepted before job {self._accepted}: keep order")
        spf, span = self.codec.samples_per_frame, job.span
        if audio.shape != (job.window.kept_frames * spf,):
            raise ValueError(
                f"job {job.index}: audio of shape {audio.shape}, expected "
                f"({job.window.kept_frames * spf},)"
            )
        end = (span.emit_end - span.emit_start) * spf
        out = np.array(audio[:end], dtype=np.float32)
        if self._tail is not None:
            n = min(len(self._tail), len(out))
            # Both sides estimate the same samples: a linear fade keeps the level (an
            # equal-power fade would lift correlated signals by up to 3 dB).
            ramp = (np.arange(n, dtype=np.float32) + 0.5) / n
            out[:n] = self._tail[:n] * (1.0 - ramp) + out[:n] * ramp
        fade = min(self.config.crossfade_samples, len(audio) - end)
        self._tail = np.array(audio[end : end + fade], dtype=np.float32) if fade else None
        self._accepted += 1
        self.frames_decoded += span.decode_frames
        self.frames_emitted += span.emit_end - span.emit_start
        self.samples_emitted += len(out)
        return out

    def push(self, codes: Sequence[int]) -> list[np.ndarray]:
        """Add codes and decode what is ready (blocking); returns the new audio chunks."""
        return self._run(self.plan(codes))

    def finish(self) -> list[np.ndarray]:
        """End the stream and decode the rest (blocking); returns the last audio chunks."""
        return self._run(self.plan_finish())

    def _run(self, jobs: list[DecodeJob]) -> list[np.ndarray]:
        if not jobs:
            return []
        audios = self.codec.decode_windows([job.window for job in jobs])
        return [self.accept(job, audio) for job, audio in zip(jobs, audios, strict=True)]

    def _jobs(self, final: bool, urgent: bool = False) -> list[DecodeJob]:
        jobs = []
        for span in self.scheduler.windows(self.frames_received, final, urgent):
            lo, hi = (
                (span.context_start - self._base) * self._k,
                (span.context_end - self._base) * self._k,
            )
            frames = np.array(self._codes[lo:hi], dtype=np.int64).reshape(-1, self._k)
            # The codec returns the emitted frames' audio (plus the crossfade's), not the
            # context's: BiCodec then runs its wave generator over little more than those.
            fade = -(-self.config.crossfade_samples // self.codec.samples_per_frame)
            keep = (
                span.emit_start - span.context_start,
                min(span.emit_end + fade, span.context_end) - span.context_start,
            )
            window = CodecWindow(
                frames=frames, condition=self._condition, start=span.context_start, keep=keep
            )
            jobs.append(DecodeJob(window=window, span=span, index=self._planned))
            self._planned += 1
        # Frames before the next window's left context are never needed again.
        drop = self.scheduler.emitted - self._left - self._base
        if drop >= 1024:
            del self._codes[: drop * self._k]
            self._base += drop
        return jobs


def _check_condition(
    codec: AudioCodec, condition: Sequence[int] | np.ndarray | None
) -> np.ndarray | None:
    if codec.condition_size == 0:
        if condition is not None:
            raise ValueError(f"{type(codec).__name__} takes no condition: pass condition=None")
        return None
    if condition is None or len(condition) != codec.condition_size:
        got = "none" if condition is None else f"{len(condition)} values"
        raise ValueError(
            f"{type(codec).__name__} needs a condition of {codec.condition_size} ids (BiCodec: "
            f"the 32 global tokens), got {got}: pass condition=<the stream's global ids>"
        )
    return np.asarray(condition, dtype=np.int64).copy()
