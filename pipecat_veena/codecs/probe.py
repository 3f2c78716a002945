"""Pick a codec's CPU dtype by measuring it on the loaded weights.

bfloat16 halves the codec's work on CPUs that compute it natively (AVX512-BF16, AMX) and slows
it down on those that emulate it; which one a machine is cannot be read from the flags alone
(memory bandwidth, the oneDNN kernels torch picks). So at start the engine decodes one second
of random frames with both dtypes and keeps bfloat16 only when it is clearly faster and its
audio stays close to float32's. An explicit ``codec_dtype`` skips the probe.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from loguru import logger

from pipecat_veena.audio import snr_db
from pipecat_veena.codecs.base import AudioCodec, CodecWindow

#: bfloat16 must decode at least this much faster than float32 to be chosen.
MIN_SPEEDUP = 1.25
#: ... and its audio must stay this close to float32's (SNR in dB; random weights give ~26 dB,
#: an emulated or broken bfloat16 path far less).
MIN_SNR_DB = 15.0
#: Audio decoded per probe run, in seconds (a typical streaming window with its context).
PROBE_SECONDS = 1.0
#: Timed runs per dtype after one warm-up run; the fastest counts.
PROBE_RUNS = 2
#: Largest code id used by the probe's random frames (valid for BiCodec and SNAC alike).
_PROBE_CODES = 4096


@dataclass(frozen=True)
class DtypeChoice:
    """What the probe chose and why.

    Attributes:
        dtype: the chosen dtype.
        reason: one line for the log.
        float32_ms: fastest float32 decode of the probe window (None: not measured).
        bfloat16_ms: fastest bfloat16 decode (None: not measured).
        snr_db: bfloat16 audio against float32 audio (None: not measured).
    """

    dtype: torch.dtype
    reason: str
    float32_ms: float | None = None
    bfloat16_ms: float | None = None
    snr_db: float | None = None


def native_bfloat16() -> bool:
    """True when this CPU computes bfloat16 in hardware (AVX512-BF16 or AMX)."""
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)


def probe_window(codec: AudioCodec, seconds: float = PROBE_SECONDS) -> CodecWindow:
    """A deterministic random window of ``seconds`` of audio for ``codec``."""
    rng = np.random.default_rng(0)
    frames = max(1, round(seconds * codec.frame_rate))
    codes = rng.integers(0, _PROBE_CODES, size=(frames, codec.codes_per_frame), dtype=np.int64)
    condition = None
    if codec.condition_size:
        condition = rng.integers(0, _PROBE_CODES, size=codec.condition_size, dtype=np.int64)
    return CodecWindow(codes, condition)


def time_decode(
    codec: AudioCodec, window: CodecWindow, runs: int = PROBE_RUNS
) -> tuple[float, np.ndarray]:
    """Fastest of ``runs`` decodes of ``window`` after one warm-up, in ms, and the audio."""
    audio = codec.decode_windows([window])[0]
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        codec.decode_windows([window])
        best = min(best, (time.perf_counter() - start) * 1000)
    return best, audio


def choose_cpu_dtype(load: Callable[[torch.dtype], AudioCodec]) -> tuple[AudioCodec, DtypeChoice]:
    """Load the codec in float32 and, where bfloat16 may pay, in bfloat16; keep the faster.

    Args:
        load: loads the checkpoint's codec on the CPU with the given dtype (blocking).

    Returns:
        The codec to use and the choice (logged at info level with its figures).
    """
    exact = load(torch.float32)
    if not native_bfloat16():
        choice = DtypeChoice(torch.float32, "this CPU has no native bfloat16 (AVX512-BF16/AMX)")
        logger.info(f"codec dtype float32: {choice.reason}")
        return exact, choice
    fast = load(torch.bfloat16)
    window = probe_window(exact)
    exact_ms, exact_audio = time_decode(exact, window)
    fast_ms, fast_audio = time_decode(fast, window)
    snr = float(snr_db(exact_audio.astype(np.float64), fast_audio.astype(np.float64)))
    speedup = exact_ms / max(fast_ms, 1e-9)
    figures = dict(float32_ms=exact_ms, bfloat16_ms=fast_ms, snr_db=snr)
    if speedup >= MIN_SPEEDUP and snr >= MIN_SNR_DB:
        choice = DtypeChoice(torch.bfloat16, f"{speedup:.2f}x faster than float32", **figures)
        codec = fast
    elif speedup < MIN_SPEEDUP:
        choice = DtypeChoice(
            torch.float32, f"bfloat16 only {speedup:.2f}x faster (< {MIN_SPEEDUP}x)", **figures
        )
        codec = exact
    else:
        choice = DtypeChoice(
            torch.float32, f"bfloat16 audio too far from float32 ({snr:.1f} dB)", **figures
        )
        codec = exact
    logger.info(
        f"codec dtype {str(choice.dtype).removeprefix('torch.')}: {choice.reason} "
        f"(probe: {window.num_frames} frames, float32 {exact_ms:.0f} ms, "
        f"bfloat16 {fast_ms:.0f} ms, bfloat16 vs float32 {snr:.1f} dB; "
        f"set codec_dtype to choose yourself)"
    )
    return codec, choice
