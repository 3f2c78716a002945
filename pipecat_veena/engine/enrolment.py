"""Voice enrolment: the checks a voice clip and a voice name pass before a voice is made.

A BiCodec voice is 32 global codes; the speaker encoder
(:class:`~pipecat_veena.codecs.bicodec.encoder.BiCodecSpeakerEncoder`) computes them from a clip.
This module owns what a usable clip is (3 to 30 s, with at least 3 s of speech, not silent, not
clipped), what a voice name may be, and turns any mono clip into float32 at the encoder's rate.
Every refusal is an :class:`~pipecat_veena.errors.EnrolmentError` that names the problem and the
fix.
"""

from __future__ import annotations

import re

import numpy as np

from pipecat_veena.audio import int16_to_float, to_pcm_bytes
from pipecat_veena.errors import EnrolmentError
from pipecat_veena.resample import resample_bytes

#: Speech a clip must hold, and the longest clip taken, in seconds.
MIN_SPEECH_SECONDS = 3.0
MAX_CLIP_SECONDS = 30.0
#: Frames for the speech measure, in seconds (20 ms).
FRAME_SECONDS = 0.02
#: A frame is speech when its RMS is above this level (dB full scale) and at most
#: ``SPEECH_RANGE_DB`` below the loudest frame.
SPEECH_FLOOR_DBFS = -50.0
SPEECH_RANGE_DB = 40.0
#: Samples at or above this magnitude count as clipped; more than ``MAX_CLIPPED_FRACTION`` of
#: them (or long flat runs at full scale) reject the clip.
CLIP_LEVEL = 0.999
MAX_CLIPPED_FRACTION = 0.01
#: Rates a clip may have, in Hz.
MIN_RATE, MAX_RATE = 8000, 192000
#: Longest transcript of a clip (transcript mode): 30 s of fast speech is about 600 characters.
MAX_TRANSCRIPT_CHARS = 1000
#: Voice names: lower-case letters, digits, ``_``, ``-`` and ``.``; a letter or digit first.
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")


def check_voice_name(name: object) -> str:
    """The canonical (stripped, lower-case) voice name; EnrolmentError when it is not usable."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name.strip().lower()):
        raise EnrolmentError(
            f"voice name {name!r} is not usable: use 1-64 letters, digits, '_', '-' or '.', "
            "starting with a letter or digit (e.g. 'asha' or 'support-agent-2')",
            code=EnrolmentError.BAD_NAME,
        )
    return name.strip().lower()


def wav2vec2_missing(model: str, root: object, directory: str) -> EnrolmentError:
    """The refusal of a transcript on a checkpoint without the wav2vec2 model, with the fix."""
    return EnrolmentError(
        f"transcript mode needs the wav2vec2 model: {model} has no {directory}/ directory "
        f"(Spark-TTS-0.5B ships it). Copy it into {root}, or enrol without a transcript "
        "(global-only)."
    )


def check_transcript(transcript: object) -> str | None:
    """The stripped transcript of a clip, or None; EnrolmentError when it is not usable."""
    if transcript is None:
        return None
    if not isinstance(transcript, str):
        raise EnrolmentError(
            f"the transcript must be text (the words spoken in the clip), got "
            f"{type(transcript).__name__}"
        )
    text = " ".join(transcript.split())
    if not text:
        raise EnrolmentError(
            "the transcript is empty: pass the words spoken in the clip, or no transcript "
            "(global-only enrolment)"
        )
    if len(text) > MAX_TRANSCRIPT_CHARS:
        raise EnrolmentError(
            f"the transcript has {len(text)} characters (at most {MAX_TRANSCRIPT_CHARS}): "
            "pass only the words spoken in the clip"
        )
    return text


def _as_mono_float(audio: object) -> np.ndarray:
    """A 1-D float32 array in [-1, 1] from float or int16 samples (a (N, 1) column is fine)."""
    wav = np.asarray(audio)
    if wav.ndim == 2 and 1 in wav.shape:
        wav = wav.reshape(-1)
    if wav.ndim != 1 or wav.size == 0:
        raise EnrolmentError(
            f"the voice clip must be mono samples (a 1-D array), got shape {wav.shape}: mix "
            "the channels down to one first"
        )
    if wav.dtype == np.int16:
        return int16_to_float(wav)
    if wav.dtype.kind != "f":
        raise EnrolmentError(
            f"the voice clip must hold float samples in [-1, 1] or int16, got {wav.dtype}"
        )
    wav = wav.astype(np.float32)
    if not np.isfinite(wav).all():
        raise EnrolmentError("the voice clip holds NaN or infinite samples")
    if float(np.abs(wav).max()) > 1.0 + 1e-3:
        raise EnrolmentError(
            "the voice clip's float samples exceed [-1, 1]: pass float audio scaled to "
            "[-1, 1] (or int16 samples)"
        )
    return np.clip(wav, -1.0, 1.0)


def speech_seconds(wav: np.ndarray, sample_rate: int) -> float:
    """Seconds of 20 ms frames loud enough to be speech (see ``SPEECH_FLOOR_DBFS``)."""
    frame = max(1, int(sample_rate * FRAME_SECONDS))
    count = len(wav) // frame
    if count == 0:
        return 0.0
    frames = wav[: count * frame].astype(np.float64).reshape(count, frame)
    level = 10 * np.log10(np.mean(frames**2, axis=1) + 1e-20)
    speech = (level > SPEECH_FLOOR_DBFS) & (level > level.max() - SPEECH_RANGE_DB)
    return float(speech.sum()) * frame / sample_rate


def prepare_clip(audio: object, sample_rate: int, target_rate: int) -> np.ndarray:
    """Check a voice clip and return it as float32 mono at ``target_rate``.

    Args:
        audio: mono samples, float in [-1, 1] or int16.
        sample_rate: their rate in Hz.
        target_rate: the speaker encoder's rate.

    Raises:
        EnrolmentError: a bad rate or array, a clip longer than 30 s, silence, less than 3 s of
            speech, or clipping; the message says what to record instead.
    """
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int | np.integer):
        raise EnrolmentError(f"sample_rate must be an integer in Hz, got {sample_rate!r}")
    if not MIN_RATE <= sample_rate <= MAX_RATE:
        raise EnrolmentError(
            f"sample_rate {sample_rate} Hz is outside [{MIN_RATE}, {MAX_RATE}]: pass the "
            "clip's real rate"
        )
    wav = _as_mono_float(audio)
    seconds = len(wav) / sample_rate
    if seconds > MAX_CLIP_SECONDS:
        raise EnrolmentError(
            f"the voice clip is {seconds:.1f} s long; enrol with {MIN_SPEECH_SECONDS:g}-"
            f"{MAX_CLIP_SECONDS:g} s of one speaker (10 s is plenty): trim it"
        )
    speech = speech_seconds(wav, sample_rate)
    if speech == 0.0 or float(np.abs(wav).max()) < 10 ** (SPEECH_FLOOR_DBFS / 20):
        raise EnrolmentError(
            "the voice clip is silent: record the speaker talking (check the microphone)"
        )
    if speech < MIN_SPEECH_SECONDS:
        raise EnrolmentError(
            f"the voice clip holds {speech:.1f} s of speech ({seconds:.1f} s in all); enrol "
            f"with at least {MIN_SPEECH_SECONDS:g} s of speech (about 10 s works best)"
        )
    clipped = float(np.mean(np.abs(wav) >= CLIP_LEVEL))
    if clipped > MAX_CLIPPED_FRACTION:
        raise EnrolmentError(
            f"the voice clip is clipped ({100 * clipped:.1f}% of samples at full scale): "
            "record again at a lower input level"
        )
    if sample_rate != target_rate:
        pcm = resample_bytes(to_pcm_bytes(wav), int(sample_rate), target_rate)
        wav = int16_to_float(pcm)
    return wav
