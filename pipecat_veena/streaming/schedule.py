"""The window scheduler of sliding-window streaming: plain integer logic, no arrays.

The one owner of the schedule's numbers (``StreamConfig`` and the measured defaults per codec).
Which frames to decode next and which to keep, from frame counts alone; and when to hurry a
chunk so that a listener never runs out of audio. ``decoder.StreamDecoder`` runs it on codes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipecat_veena.codecs.base import AudioCodec


# Measured defaults per codec class (benchmarks/streaming.py, BENCHMARKS.md "streaming"), keyed by
# class name so that this module never imports torch. BiCodec (real config, random weights):
# 4 + 16 = 20 semantic tokens to first audio, seams at 88-94 dB with the reference init, 52 dB
# with the more strongly coupled weights of write_random_checkpoint (R=24: 95 dB): retune R on
# trained weights. SNAC: 1 + 2 frames = 21 tokens to first audio, 98 dB (94 dB with noise).
# Growth x2 pays L + R rarely (BiCodec work 1.19 on 60 s) but needs an LLM at >= 2x real time
# for gapless playback (the needed speed equals the growth). L defaults to the receptive field.
_DEFAULTS = {
    "BiCodecCodec": dict(first_frames=4, lookahead_frames=16, growth=2.0, max_chunk_frames=1024),
    "SnacCodec": dict(first_frames=1, lookahead_frames=2, growth=2.0, max_chunk_frames=128),
}


@dataclass(frozen=True)
class StreamConfig:
    """How a stream is cut into decode windows.

    Parameters:
        first_frames: frames emitted by the first chunk (F); first audio needs F + R frames.
        lookahead_frames: right context R decoded past each chunk and thrown away.
        growth: each later chunk targets ``growth`` times the previous target (>= 1).
        max_chunk_frames: cap on the frames emitted by one chunk.
        left_context_frames: left context L; None takes the codec's ``context_frames``.
        crossfade_samples: linear crossfade at each seam, taken from the lookahead of the
            previous chunk, whose own right context it shortens (0 when the seam is exact, the
            default).
    """

    first_frames: int = 4
    lookahead_frames: int = 16
    growth: float = 2.0
    max_chunk_frames: int = 1024
    left_context_frames: int | None = None
    crossfade_samples: int = 0

    def __post_init__(self) -> None:
        if self.first_frames < 1 or self.max_chunk_frames < self.first_frames:
            raise ValueError(
                f"need 1 <= first_frames <= max_chunk_frames, got first_frames="
                f"{self.first_frames}, max_chunk_frames={self.max_chunk_frames}"
            )
        if self.lookahead_frames < 0 or (self.left_context_frames or 0) < 0:
            raise ValueError("lookahead_frames and left_context_frames must be >= 0")
        if self.growth < 1.0:
            raise ValueError(f"growth must be >= 1 (1 keeps chunks constant), got {self.growth}")
        if self.crossfade_samples < 0:
            raise ValueError(f"crossfade_samples must be >= 0, got {self.crossfade_samples}")

    @classmethod
    def for_codec(cls, codec: AudioCodec) -> StreamConfig:
        """The measured default config for ``codec`` (generic defaults for other codecs)."""
        for klass in type(codec).__mro__:
            if klass.__name__ in _DEFAULTS:
                return cls(**_DEFAULTS[klass.__name__])
        return cls(first_frames=1, lookahead_frames=codec.context_frames)

    def left_context(self, codec: AudioCodec) -> int:
        """The left context L in frames for ``codec``."""
        if self.left_context_frames is None:
            return codec.context_frames
        return self.left_context_frames


@dataclass(frozen=True)
class Window:
    """One decode: frames [context_start, context_end), audio kept from [emit_start, emit_end).

    All four are absolute frame indices within the stream.
    """

    context_start: int
    emit_start: int
    emit_end: int
    context_end: int

    @property
    def decode_frames(self) -> int:
        """Frames the codec computes for this window."""
        return self.context_end - self.context_start


def should_hurry(
    buffered_s: float,
    frames_until_due: int,
    frames_per_s: float,
    margin_s: float,
    real_time_fps: float = 0.0,
) -> bool:
    """Whether to emit a chunk now rather than wait for the next grown one.

    Args:
        buffered_s: audio already emitted but not yet played, in seconds.
        frames_until_due: frames still to arrive before the next regular chunk is due.
        frames_per_s: the stream's generation rate, in frames per second.
        margin_s: the buffer to keep for the decode and delivery of a chunk.
        real_time_fps: frames per second of audio. A stream generated slower than that runs
            dry whatever the chunks; hurrying would only add decode work (smaller chunks), so
            it never hurries.

    Returns:
        True when waiting would let the buffer fall below ``margin_s``.
    """
    if frames_until_due <= 0 or frames_per_s < real_time_fps:
        return False
    return buffered_s - frames_until_due / max(frames_per_s, 1e-9) < margin_s


class StreamScheduler:
    """Plans the windows of one stream from frame counts alone (integers only, no arrays).

    Every frame is emitted exactly once and in order; a window's left context is
    ``min(L, emit_start)``, its lookahead R (less only where the stream has ended). Without
    ``urgent`` chunks the windows depend on the frame count only, not on how the frames were
    grouped when they arrived.
    """

    def __init__(
        self,
        *,
        first_frames: int,
        lookahead_frames: int,
        left_context_frames: int,
        growth: float = 2.0,
        max_chunk_frames: int = 1024,
    ) -> None:
        self._left = left_context_frames
        self._lookahead = lookahead_frames
        self._growth = growth
        self._max = max_chunk_frames
        self._target = first_frames
        self._previous = first_frames  # the target of the last chunk planned
        self._available = 0
        self._final = False
        #: Frames emitted so far (planned windows included).
        self.emitted = 0
        #: Windows planned so far.
        self.chunks = 0

    @property
    def final(self) -> bool:
        """True once the stream has been marked as ended."""
        return self._final

    @classmethod
    def from_config(cls, config: StreamConfig, left_context_frames: int) -> StreamScheduler:
        """A scheduler following ``config`` with the left context already resolved."""
        return cls(
            first_frames=config.first_frames,
            lookahead_frames=config.lookahead_frames,
            left_context_frames=left_context_frames,
            growth=config.growth,
            max_chunk_frames=config.max_chunk_frames,
        )

    def next_window(
        self, available: int, final: bool = False, urgent: bool = False
    ) -> Window | None:
        """The next window to decode once ``available`` frames exist, or None to wait.

        Args:
            available: frames received so far (never decreases).
            final: True once the stream has ended (flush without lookahead).
            urgent: the listener is about to run out of audio: emit a chunk as soon as the
                previous chunk's size is ready instead of waiting for the grown target, and do
                not grow. Growth alone needs the LLM at ``growth`` times real time; with urgent
                chunks any LLM faster than real time plays without gaps.

        Returns:
            The window (this call advances the scheduler past it), or None.
        """
        if available < self._available or (self._final and available != self._available):
            raise ValueError(
                f"frames available went from {self._available} to {available}"
                f"{' after the end of the stream' if self._final else ''}: pass the running total"
            )
        self._available, self._final = available, self._final or final
        ready = available if self._final else available - self._lookahead
        pending = ready - self.emitted
        needed = self._previous if urgent else self._target
        if pending <= 0 or (not self._final and pending < needed):
            return None
        start = self.emitted
        # A chunk is at most its target, however many frames arrived at once: chunk boundaries
        # (and so the seams) are then a function of the frame stream alone, not of how the
        # LLM's output was grouped into deltas. An urgent chunk takes what is there up to the
        # target: taking all of an LLM running far ahead would make the starving listener wait
        # for the longest decode of all. A final flush goes on in targets too, and its last
        # chunk takes the rest.
        end = start + min(pending, self._target)
        self.emitted = end
        self.chunks += 1
        if pending >= self._target:
            self._previous = self._target
            self._target = min(self._max, max(self._target, int(self._target * self._growth)))
        return Window(
            context_start=max(0, start - self._left),
            emit_start=start,
            emit_end=end,
            context_end=min(available, end + self._lookahead),
        )

    def frames_until_due(self, available: int) -> int:
        """Frames still to arrive before the next regular (grown) chunk is due; 0 if it is."""
        if self._final:
            return 0
        return max(0, self.emitted + self._target + self._lookahead - available)

    def windows(self, available: int, final: bool = False, urgent: bool = False) -> list[Window]:
        """All windows that can be decoded now, in order."""
        out = []
        while (window := self.next_window(available, final, urgent)) is not None:
            out.append(window)
        return out
