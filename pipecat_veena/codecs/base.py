"""The codec contract shared by BiCodec (16 kHz) and SNAC (24 kHz).

A *frame* is the codec's unit of time: one BiCodec semantic token (320 samples at 16 kHz) or one
7-token SNAC frame (2048 samples at 24 kHz). Letters used in shapes: B batch, T frames,
K codes per frame, N samples (``T * samples_per_frame``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CodecWindow:
    """A run of consecutive frames of one stream, decoded in one call.

    Attributes:
        frames: int64 array of shape (T, K): T frames of K codes each (BiCodec K=1, the semantic
            id in [0, 8192); SNAC K=7, the codes of the 7 slots in slot order, each in [0, 4096)).
        condition: int64 array of shape (C,) (BiCodec: the 32 global ids in [0, 4096)), or None
            for a codec without a condition.
        start: absolute index of ``frames[0]`` within its stream, in frames. Codecs whose decode
            depends on position (SNAC's noise) use it so that overlapping windows agree.
        keep: frames ``[a, b)`` of the window (indices into ``frames``) whose audio the caller
            wants, or None for all. The rest is context: a codec returns only the kept audio
            and may skip computing what only the context frames need (BiCodec does).
    """

    frames: np.ndarray
    condition: np.ndarray | None = None
    start: int = 0
    keep: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.keep is not None:
            a, b = self.keep
            if not 0 <= a < b <= self.num_frames:
                raise ValueError(
                    f"keep={self.keep} must be frames [a, b) with 0 <= a < b <= {self.num_frames} "
                    f"(the window's length)"
                )

    @property
    def num_frames(self) -> int:
        """Number of frames T in the window."""
        return int(np.shape(self.frames)[0])

    @property
    def kept(self) -> tuple[int, int]:
        """The frame range whose audio a decode returns (``keep``, or the whole window)."""
        return self.keep if self.keep is not None else (0, self.num_frames)

    @property
    def kept_frames(self) -> int:
        """Frames of audio a decode of this window returns."""
        a, b = self.kept
        return b - a


class AudioCodec(ABC):
    """Decodes windows of codec frames into mono float32 audio.

    Implementations own their numbers (sample rate, hop, receptive field) and decode a batch of
    windows from different streams in one call, each result equal to decoding it alone.
    ``decode_windows`` blocks (torch work): call it from a worker thread, never on the event loop.
    """

    #: Output sample rate in Hz.
    sample_rate: int
    #: Samples produced per frame (BiCodec 320, SNAC 2048).
    samples_per_frame: int
    #: Codes per frame K (BiCodec 1, SNAC 7).
    codes_per_frame: int
    #: Length C of the condition vector (BiCodec 32 globals, SNAC 0).
    condition_size: int
    #: Frames of context needed on each side for a window decode to equal the full decode.
    context_frames: int
    #: The compute dtype (a ``torch.dtype``: float32, or bfloat16 where it was chosen).
    dtype: object

    @property
    def frame_rate(self) -> float:
        """Frames per second of audio."""
        return self.sample_rate / self.samples_per_frame

    def kept_audio(self, window: CodecWindow, audio: np.ndarray) -> np.ndarray:
        """The samples of ``window.kept`` out of ``audio``, the decode of the whole window.

        For codecs that decode whole windows (``keep`` is a promise about what is returned, not
        about what is computed).
        """
        a, b = window.kept
        return audio[a * self.samples_per_frame : b * self.samples_per_frame]

    @abstractmethod
    def decode_windows(self, windows: Sequence[CodecWindow]) -> list[np.ndarray]:
        """Decode several windows (possibly of different streams and lengths) in one batch.

        Args:
            windows: the windows to decode; each ``frames`` is (T_i, K) int64.

        Returns:
            One float32 array per window, shape (kept_frames_i * samples_per_frame,) (the whole
            window unless ``keep`` is set), values in [-1, 1], equal (to float rounding) to
            the same samples of decoding that window alone.
        """
