"""Seam calibration: how much lookahead the LOADED codec weights need for exact-sounding seams.

The right context R of each decode window is the latency knob (first audio waits for F + R
frames). How large it must be depends on the weights: random weights of the reference
initialisation reach 88 dB at R = 16 BiCodec tokens, more strongly coupled random weights only
52 dB (BENCHMARKS.md, "streaming"), and trained weights are unknown until measured. This module
measures the streamed-vs-offline SNR for candidate lookaheads on the weights actually loaded and
picks the smallest that meets a target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from loguru import logger

from pipecat_veena.audio import snr_db
from pipecat_veena.codecs.base import AudioCodec, CodecWindow
from pipecat_veena.streaming import StreamConfig, StreamDecoder

#: Codes drawn for the probe stay below this, valid for every codec here (SNAC slots and BiCodec
#: globals hold 4096 codes, BiCodec semantics 8192).
_PROBE_CODES = 4096


def seam_snr(codec: AudioCodec, config: StreamConfig, *, frames: int = 200, seed: int = 0) -> float:
    """SNR in dB of a streamed decode of random codes against one offline decode of them.

    Codes are pushed one frame at a time, as an LLM emits them. Blocking torch work: call it
    from a worker thread in async code.
    """
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, _PROBE_CODES, (frames, codec.codes_per_frame), dtype=np.int64)
    condition = (
        rng.integers(0, _PROBE_CODES, codec.condition_size, dtype=np.int64)
        if codec.condition_size
        else None
    )
    offline = codec.decode_windows([CodecWindow(frames=codes, condition=condition)])[0]
    decoder = StreamDecoder(codec, config, condition=condition)
    chunks = [chunk for frame in codes for chunk in decoder.push(frame.tolist())]
    streamed = np.concatenate([*chunks, *decoder.finish()])
    return snr_db(offline, streamed)


def lookahead_curve(
    codec: AudioCodec, lookaheads: Sequence[int], base: StreamConfig | None = None, **probe
) -> list[tuple[int, float]]:
    """(R, seam SNR dB) for each candidate lookahead, other settings from ``base``."""
    base = base or StreamConfig.for_codec(codec)
    return [(r, seam_snr(codec, replace(base, lookahead_frames=r), **probe)) for r in lookaheads]


def calibrate_lookahead(
    codec: AudioCodec,
    target_db: float = 80.0,
    base: StreamConfig | None = None,
    candidates: Sequence[int] | None = None,
    **probe,
) -> StreamConfig:
    """The stream config with the smallest lookahead whose seams reach ``target_db``.

    Args:
        codec: the loaded codec (its weights are what is measured).
        target_db: the seam SNR to reach against an offline decode.
        base: the config to adjust (default: the codec's measured defaults).
        candidates: lookaheads to try, ascending (default: from the base's R up to the
            receptive field, growing by half each step).
        **probe: ``frames`` and ``seed`` of the random probe.

    Returns:
        ``base`` with the chosen ``lookahead_frames`` (the largest candidate if none reaches
        the target, with a warning).
    """
    base = base or StreamConfig.for_codec(codec)
    if candidates is None:
        r, candidates = max(1, base.lookahead_frames), []
        while r < codec.context_frames:
            candidates.append(r)
            r = max(r + 1, round(r * 1.5))
        candidates.append(codec.context_frames)
    curve = []
    for r in candidates:  # measured one at a time: stop at the first that is good enough
        curve += lookahead_curve(codec, [r], base, **probe)
        logger.debug(f"seam calibration: R={r} -> {curve[-1][1]:.1f} dB")
        if curve[-1][1] >= target_db:
            break
    return replace(base, lookahead_frames=pick_lookahead(curve, target_db))


def pick_lookahead(curve: Sequence[tuple[int, float]], target_db: float) -> int:
    """The smallest lookahead of ``curve`` reaching ``target_db`` (else its largest, warned)."""
    for r, snr in sorted(curve):
        if snr >= target_db:
            return r
    largest = max(r for r, _ in curve)
    logger.warning(
        f"seam calibration: no lookahead up to {largest} frames reaches {target_db} dB; "
        f"using {largest}"
    )
    return largest
