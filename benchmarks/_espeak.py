"""espeak-ng through its C API: speech with the sample where each word starts (ground truth).

espeak-ng reports a WORD event with the text position and output sample of each word as it
synthesises (``espeak_SetSynthCallback``). The library is the Debian package ``espeak-ng``
(``libespeak-ng.so.1``); everything here runs in this process through ctypes, one synthesis
at a time (the library keeps global state).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from dataclasses import dataclass

import numpy as np

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_CHARS_UTF8 = 1
_EVENT_WORD = 1
_PARAM_RATE = 1
_PARAM_PITCH = 3
_PARAM_RANGE = 4
_LOCK = threading.Lock()


class _Event(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", ctypes.c_char * 8),
    ]


_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_Event)
)


@dataclass
class Synthesis:
    """One synthesised text.

    Attributes:
        audio: float32 mono samples in [-1, 1].
        sample_rate: their rate (22050 Hz for espeak-ng's own voices).
        words: (text position in characters from 0, sample where the word starts) per word
            event, in order.
    """

    audio: np.ndarray
    sample_rate: int
    words: list[tuple[int, int]]


class Espeak:
    """The espeak-ng library, loaded once."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("espeak-ng") or "libespeak-ng.so.1"
        try:
            self._lib = ctypes.CDLL(name)
        except OSError as e:
            raise RuntimeError(
                "espeak-ng is not installed: apt-get install espeak-ng (libespeak-ng.so.1)"
            ) from e
        self._lib.espeak_Initialize.restype = ctypes.c_int
        rate = self._lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, None, 0)
        if rate <= 0:
            raise RuntimeError(f"espeak_Initialize failed ({rate})")
        self.sample_rate = rate
        self._pcm: list[np.ndarray] = []
        self._words: list[tuple[int, int]] = []
        self._callback = _CALLBACK(self._on_synth)  # kept alive as long as self
        self._lib.espeak_SetSynthCallback(self._callback)

    def _on_synth(self, wav, count, events) -> int:  # noqa: ANN001 (ctypes pointers)
        if count > 0:
            self._pcm.append(np.ctypeslib.as_array(wav, shape=(count,)).copy())
        i = 0
        while events[i].type != 0:
            if events[i].type == _EVENT_WORD:
                self._words.append((events[i].text_position - 1, events[i].sample))
            i += 1
        return 0

    def synth(
        self, text: str, voice: str, *, rate: int = 175, pitch: int = 50, pitch_range: int = 50
    ) -> Synthesis:
        """Speak ``text`` with ``voice`` at ``rate`` words a minute.

        Args:
            text: what to say.
            voice: an espeak-ng voice, optionally with a variant: "en", "hi", "en-gb-scotland",
                "hi+f3" (``espeak-ng --voices``; variants: ``espeak-ng --voices=variant``).
            rate: speaking rate in words a minute (espeak-ng's own scale, 80-450).
            pitch: base pitch, 0-100 (50: the voice's own).
            pitch_range: pitch variation, 0-100 (0: monotone, 50: the voice's own).
        """
        data = text.encode()
        with _LOCK:
            self._pcm, self._words = [], []
            if self._lib.espeak_SetVoiceByName(voice.encode()) != 0:
                raise ValueError(f"espeak-ng has no voice {voice!r}")
            self._lib.espeak_SetParameter(_PARAM_RATE, rate, 0)
            self._lib.espeak_SetParameter(_PARAM_PITCH, pitch, 0)
            self._lib.espeak_SetParameter(_PARAM_RANGE, pitch_range, 0)
            self._lib.espeak_Synth(data, len(data) + 1, 0, 0, 0, _CHARS_UTF8, None, None)
            self._lib.espeak_Synchronize()
            pcm = np.concatenate(self._pcm) if self._pcm else np.zeros(0, np.int16)
            return Synthesis(pcm.astype(np.float32) / 32768.0, self.sample_rate, self._words)
