"""BiCodecCodec: the :class:`~pipecat_veena.codecs.base.AudioCodec` contract over BiCodecDecoder.

One call decodes windows of several streams (different lengths, different global tokens): they
are right-padded to the longest, and the decoder masks the padding so that each result equals
the window decoded alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from pipecat_veena.codecs.base import AudioCodec, CodecWindow
from pipecat_veena.codecs.bicodec.model import BiCodecDecoder
from pipecat_veena.codecs.threads import intra_op_threads

#: Semantic id written into padded steps (any valid id: padding never reaches real samples).
_PAD_ID = 0


class BiCodecCodec(AudioCodec):
    """BiCodec as a frame codec: a frame is one semantic token, the condition the 32 globals.

    ``decode_windows`` blocks on torch work: call it from a worker thread. The numbers
    (``sample_rate``, ``samples_per_frame``, ``context_frames``) come from the checkpoint config.
    """

    codes_per_frame = 1
    #: On a CPU, calls that return at most this many frames in all run on one torch thread
    #: (a stream's first windows; measured in ``pipecat_veena.codecs.threads``). 0: never.
    single_thread_frames = 8

    def __init__(self, decoder: BiCodecDecoder) -> None:
        self.decoder = decoder
        self.sample_rate = decoder.sample_rate
        self.samples_per_frame = decoder.hop_length
        self.condition_size = decoder.config.speaker.token_num
        self.context_frames = decoder.receptive_field
        self.dtype = next(decoder.parameters()).dtype
        self._on_cpu = decoder.device.type == "cpu"

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
    ) -> BiCodecCodec:
        """Load a BiCodec checkpoint (``BiCodec/`` dir or its root).

        Args:
            path: the checkpoint directory.
            device: where to run ("cpu", "cuda", ...).
            dtype: weight and compute dtype; None picks float32 on CPU (exact path) and
                bfloat16 elsewhere.
        """
        if dtype is None:
            dtype = torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16
        return cls(BiCodecDecoder.from_pretrained(path, device=device, dtype=dtype))

    def decode_windows(self, windows: Sequence[CodecWindow]) -> list[np.ndarray]:
        """Decode windows of semantic tokens, batched, each as if decoded alone.

        With ``keep`` set the wave generator runs over the kept frames plus its own receptive
        field only (``BiCodecDecoder.forward``): the same samples at a fraction of the work.
        Small calls on a CPU run on one thread (``single_thread_frames``).

        Args:
            windows: each ``frames`` (T_i, 1) int64 semantic ids in [0, 8192), ``condition``
                (32,) int64 global ids in [0, 4096).

        Returns:
            One float32 array per window, shape (kept_frames_i * samples_per_frame,), in
            [-1, 1] at ``sample_rate`` Hz.
        """
        if not windows:
            return []
        lengths = [self._check(i, w) for i, w in enumerate(windows)]
        steps = max(lengths)
        if steps == 0:
            return [np.zeros(0, dtype=np.float32) for _ in windows]
        semantic = np.full((len(windows), steps), _PAD_ID, dtype=np.int64)
        for row, (window, length) in enumerate(zip(windows, lengths, strict=True)):
            semantic[row, :length] = window.frames[:, 0]
        globals_ = np.stack([np.asarray(w.condition, dtype=np.int64) for w in windows])
        keep = torch.tensor([w.kept for w in windows], dtype=torch.int64)
        whole = all(w.kept == (0, steps) for w in windows)
        small = self._on_cpu and sum(w.kept_frames for w in windows) <= self.single_thread_frames
        with intra_op_threads(1 if small else None):
            wav = self.decoder.decode(
                torch.from_numpy(semantic),
                torch.from_numpy(globals_),
                torch.tensor(lengths, dtype=torch.int64),
                None if whole else keep,
            ).cpu()
        hop = self.samples_per_frame
        if whole:
            return [wav[row].numpy() for row in range(len(windows))]
        return [wav[row, : w.kept_frames * hop].numpy() for row, w in enumerate(windows)]

    def _check(self, index: int, window: CodecWindow) -> int:
        """Return the window's length, or raise ValueError naming what is wrong with it."""
        frames = np.asarray(window.frames)
        if (
            frames.ndim != 2
            or frames.shape[1] != self.codes_per_frame
            or frames.dtype.kind not in "iu"
        ):
            raise ValueError(
                f"window {index}: frames must be an integer array of shape "
                f"(T, {self.codes_per_frame}) (one semantic id per frame), got {frames.shape} "
                f"{frames.dtype}"
            )
        if window.condition is None or np.shape(window.condition) != (self.condition_size,):
            found = None if window.condition is None else np.shape(window.condition)
            raise ValueError(
                f"window {index}: condition must hold the {self.condition_size} global ids of "
                f"the stream, got {found}"
            )
        return int(frames.shape[0])
