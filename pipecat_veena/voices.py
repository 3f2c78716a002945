"""The voices a checkpoint offers, by name.

- Spark-TTS-0.5B layout: controllable voices ``female`` and ``male``, with optional pitch and
  speed levels as ``female:high:moderate`` (levels: very_low, low, moderate, high, very_high).
- Veena3 checkpoints with a ``voices.json`` (named speakers, a prompt template, emotion tags,
  optionally fixed globals per voice).
- Veena / Orpheus (SNAC): kavya (default), agastya, maitri, vinaya, or the speakers of a
  ``voices.json`` next to the checkpoint.
Voices registered at run time with 32 global codes (cloned or pinned voices) join the list.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pipecat_veena.errors import CheckpointError, UnknownVoiceError
from pipecat_veena.prompts import GENDERS, LEVELS, Voice

VOICES_FILE = "voices.json"
VEENA_SPEAKERS = ("kavya", "agastya", "maitri", "vinaya")


@dataclass
class VoiceBook:
    """Named voices of one checkpoint.

    Attributes:
        voices: voices by name, in listing order.
        default: the name used when a request names none.
        template: the Veena3 prompt template, if any.
        emotion_tags: inline tags the model understands.
        controllable: True when ``gender[:pitch[:speed]]`` names are accepted (Spark).
        max_part_chars: the longest text part the model handles well, when the checkpoint
            says (``max_part_chars`` in voices.json).
    """

    voices: dict[str, Voice]
    default: str
    template: str | None = None
    emotion_tags: tuple[str, ...] = ()
    controllable: bool = False
    max_part_chars: int | None = None
    _num_globals: int = field(default=32, repr=False)

    @property
    def names(self) -> list[str]:
        """The voice names, default first."""
        return [self.default, *(n for n in self.voices if n != self.default)]

    def resolve(self, name: str | None) -> Voice:
        """The voice called ``name`` (None: the default).

        Raises:
            UnknownVoiceError: naming the valid voices.
        """
        if name is None:
            name = self.default
        key = name.strip().lower()
        if key in self.voices:
            return self.voices[key]
        if self.controllable:
            voice = _parse_controllable(key)
            if voice is not None:
                return voice
        hint = " (or gender:pitch:speed, e.g. female:high:moderate)" if self.controllable else ""
        raise UnknownVoiceError(
            f"unknown voice {name!r}; this checkpoint offers: {', '.join(self.names)}{hint}"
        )

    def register(self, name: str, global_codes: Sequence[int]) -> Voice:
        """Add (or replace) a voice defined by its global codes (a cloned or pinned voice)."""
        codes = tuple(int(c) for c in global_codes)
        if len(codes) != self._num_globals or not all(0 <= c < 4096 for c in codes):
            raise ValueError(
                f"a voice needs {self._num_globals} global codes in [0, 4096), got {len(codes)}"
            )
        key = name.strip().lower()
        if not key:
            raise ValueError("a voice needs a non-empty name")
        self.voices[key] = Voice(name=key, globals=codes)
        return self.voices[key]


def _parse_controllable(key: str) -> Voice | None:
    gender, *rest = key.split(":")
    if gender not in GENDERS or len(rest) > 2 or any(r not in LEVELS for r in rest):
        return None
    pitch, speed = (LEVELS.index(r) for r in [*rest, "moderate", "moderate"][:2])
    return Voice(name=key, gender=GENDERS.index(gender), pitch=pitch, speed=speed)


def _read_voices_file(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot read voices file: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("voices"), dict) or not data["voices"]:
        raise CheckpointError(f"{path}: expected an object with a non-empty 'voices' object")
    return data


def _voices_from_file(data: dict, path: Path) -> dict[str, Voice]:
    voices = {}
    for name, spec in data["voices"].items():
        key = name.strip().lower()
        codes = spec.get("globals")
        speaker = spec.get("speaker")
        if codes is None and speaker is None:
            raise CheckpointError(f"{path}: voice {name!r} needs 'speaker' or 'globals'")
        voices[key] = Voice(
            name=key, speaker=speaker, globals=None if codes is None else tuple(codes)
        )
    return voices


def spark_voices(root: Path, num_globals: int) -> VoiceBook:
    """Voices of a BiCodec checkpoint: voices.json when present, else the controllable set."""
    path = root / VOICES_FILE
    if not path.is_file():
        voices = {g: Voice(name=g, gender=i) for i, g in enumerate(GENDERS)}
        return VoiceBook(voices, "female", controllable=True, _num_globals=num_globals)
    data = _read_voices_file(path)
    voices = _voices_from_file(data, path)
    default = str(data.get("default_voice", next(iter(voices)))).lower()
    if default not in voices:
        raise CheckpointError(f"{path}: default_voice {default!r} is not among its voices")
    return VoiceBook(
        voices,
        default,
        template=data.get("template"),
        emotion_tags=tuple(data.get("emotion_tags", ())),
        controllable=True,
        max_part_chars=data.get("max_part_chars"),
        _num_globals=num_globals,
    )


def veena_voices(root: Path) -> VoiceBook:
    """Voices of a SNAC (Veena) checkpoint: voices.json speakers, else Veena's four."""
    path = root / VOICES_FILE
    if path.is_file():
        data = _read_voices_file(path)
        voices = {
            n.lower(): Voice(name=n.lower(), speaker=s.get("speaker", n))
            for n, s in data["voices"].items()
        }
        default = str(data.get("default_voice", next(iter(voices)))).lower()
        tags = tuple(data.get("emotion_tags", ()))
        max_part_chars = data.get("max_part_chars")
    else:
        voices = {n: Voice(name=n, speaker=n) for n in VEENA_SPEAKERS}
        default, tags, max_part_chars = VEENA_SPEAKERS[0], (), None
    return VoiceBook(voices, default, emotion_tags=tags, max_part_chars=max_part_chars)
