"""Voices: the one owner of names, parsing, pitch/speed levels, pinned voice prints and their files.

- Spark-TTS-0.5B layout: controllable voices ``female`` and ``male``, with optional pitch and
  speed levels as ``female:high:moderate`` (levels: very_low, low, moderate, high, very_high).
- Veena3 checkpoints with a ``voices.json`` (named speakers, a prompt template, emotion tags,
  optionally fixed globals per voice).
- Veena / Orpheus (SNAC): kavya (default), agastya, maitri, vinaya, or the speakers of a
  ``voices.json`` next to the checkpoint.

A voice of a ``voices.json`` may name a LoRA adapter (``"lora": "adapters/asha"``, a PEFT
directory; relative paths are read from the checkpoint directory): the engine then serves that
voice's requests with the adapter on the base model (a fine-tuned voice; how SNAC models get
new voices). Voices naming the same directory share one adapter.

A generated BiCodec voice (controllable or named speaker) is sampled anew by each request unless
it is *pinned*: the voice print (the generated prefix with its 32 global codes) of the first
request of that voice that completed cleanly is reused by every later request, so sentences
and calls never drift. Pinned prints can be exported to a file and loaded by another process,
so every replica of a service speaks with the same voice.

Enrolled voices have owners: ``owner`` is a fingerprint of the API key that enrolled the voice
(``""``: the operator, i.e. the CLI, an in-process caller or an open server, whose voices every
caller may use). A voice is usable by its owner, and by everyone when the operator marked it
``shared`` or the operator owns it. Reserved names (the speech server's OpenAI and voice-map
names) cannot be enrolled.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loguru import logger

from pipecat_veena.engine.enrolment import check_voice_name
from pipecat_veena.errors import CheckpointError, EnrolmentError, UnknownVoiceError
from pipecat_veena.generation.lora import LoraAdapter, load_adapter

VOICES_FILE = "voices.json"
VEENA_SPEAKERS = ("kavya", "agastya", "maitri", "vinaya")
LEVELS = ("very_low", "low", "moderate", "high", "very_high")
GENDERS = ("female", "male")
#: Size of a BiCodec global codebook: a global code is in [0, GLOBAL_CODES).
GLOBAL_CODES = 4096
#: Size of the BiCodec semantic codebook: a semantic code is in [0, SEMANTIC_CODES).
SEMANTIC_CODES = 8192
#: ``format`` of an exported voice-print file.
PRINTS_FORMAT = "pipecat-veena-voice-prints"
#: The owner of voices enrolled by the operator (CLI, in-process engine, a server without keys).
OPERATOR = ""


@dataclass(frozen=True)
class Voice:
    """A voice the engine can speak with.

    Attributes:
        name: the name callers use.
        speaker: speaker tag for template formats (Veena3 ``<|speaker_x|>``, Veena ``x``).
        gender, pitch, speed: Spark controllable labels (indexes into GENDERS / LEVELS).
        globals: fixed 32 BiCodec global codes (a cloned voice), or None.
        semantic: the reference clip's BiCodec semantic codes (transcript-mode enrolment), or
            None; set together with ``transcript``.
        transcript: the words of the reference clip (transcript-mode enrolment), or None.
        adapter: the LoRA adapter this voice's requests generate with (a fine-tuned voice),
            or None (the base model).
    """

    name: str
    speaker: str | None = None
    gender: int | None = None
    pitch: int = 2
    speed: int = 2
    globals: tuple[int, ...] | None = None
    semantic: tuple[int, ...] | None = None
    transcript: str | None = None
    adapter: LoraAdapter | None = None

    @property
    def generated(self) -> bool:
        """True when the model generates this voice's globals (so it can be pinned)."""
        return self.globals is None and (self.speaker is not None or self.gender is not None)


@dataclass(frozen=True)
class VoicePrint:
    """What pins a BiCodec voice: the generated prefix token ids and the global codes in them."""

    prefix: tuple[int, ...]
    globals: tuple[int, ...]


def check_level(name: str, value: Any) -> None:
    """Raise ValueError unless ``value`` is None or a pitch/speed level name."""
    if value is not None and value not in LEVELS:
        raise ValueError(f"{name} must be one of {', '.join(LEVELS)}, got {value!r}")


def voice_with_levels(voice: str | None, pitch: str | None, speed: str | None) -> str | None:
    """The voice name with pitch/speed levels: ``female`` + high -> ``female:high:moderate``.

    Raises:
        ValueError: a level that is not a level, or levels on a voice without those controls
            (only the controllable ``female`` / ``male`` voices take them).
    """
    check_level("pitch", pitch)
    check_level("speed", speed)
    if pitch is None and speed is None:
        return voice
    if voice not in GENDERS:
        raise ValueError(
            f"pitch and speed apply to the controllable voices {' and '.join(GENDERS)} only; "
            f"voice {voice!r} has no such control: unset pitch/speed or pick female/male"
        )
    return f"{voice}:{pitch or 'moderate'}:{speed or 'moderate'}"


def _codes_ok(codes: Sequence[Any], size: int) -> bool:
    return all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < size for c in codes)


def check_semantic(codes: Any, transcript: Any, where: str) -> tuple[tuple[int, ...], str]:
    """A transcript-mode reference: semantic codes in [0, 8192) and a non-empty transcript.

    Raises:
        ValueError: naming what is wrong.
    """
    if not isinstance(codes, list | tuple) or not codes or not _codes_ok(codes, SEMANTIC_CODES):
        raise ValueError(
            f"{where}: 'semantic' must be a non-empty list of integers in [0, {SEMANTIC_CODES})"
        )
    if not isinstance(transcript, str) or not transcript.strip():
        raise ValueError(f"{where}: 'transcript' must be the reference clip's words")
    return tuple(codes), transcript.strip()


def check_globals(codes: Sequence[Any], count: int, where: str) -> tuple[int, ...]:
    """``count`` integer global codes in [0, 4096), as a tuple; else a clear ValueError."""
    if len(codes) != count or not _codes_ok(codes, GLOBAL_CODES):
        raise ValueError(
            f"{where}: a voice needs {count} global codes (integers in [0, {GLOBAL_CODES})), got "
            f"{len(codes)} value(s) {list(codes)[:4]}..."
        )
    return tuple(codes)


@dataclass
class VoiceBook:
    """Named voices of one checkpoint, and the pinned prints of its generated voices.

    Attributes:
        voices: voices by name, in listing order.
        default: the name used when a request names none.
        template: the Veena3 prompt template, if any.
        emotion_tags: inline tags the model understands.
        controllable: True when ``gender[:pitch[:speed]]`` names are accepted (Spark).
        max_part_chars: the longest text part the model handles well, when the checkpoint
            says (``max_part_chars`` in voices.json).
        num_globals: global codes per voice (BiCodec: 32; SNAC voices have none).
        pinned: voice prints by voice name.
        enrolled: names of the voices enrolled from audio (``enrol``), in ``voices`` too.
        owners: the owner of each enrolled voice (a key fingerprint; ``OPERATOR``: everyone's).
        shared: enrolled voices the operator shared with every caller.
        reserved: names that cannot be enrolled (the server's OpenAI and voice-map names).
    """

    voices: dict[str, Voice]
    default: str
    template: str | None = None
    emotion_tags: tuple[str, ...] = ()
    controllable: bool = False
    max_part_chars: int | None = None
    num_globals: int = 32
    pinned: dict[str, VoicePrint] = field(default_factory=dict)
    enrolled: set[str] = field(default_factory=set)
    owners: dict[str, str] = field(default_factory=dict)
    shared: set[str] = field(default_factory=set)
    reserved: frozenset[str] = frozenset()
    #: the last file's enrolled entries as parsed (an unchanged entry is not checked again)
    _parsed: dict[str, tuple[Any, tuple]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def names(self) -> list[str]:
        """The voice names, default first."""
        return [self.default, *(n for n in self.voices if n != self.default)]

    @property
    def adapters(self) -> list[LoraAdapter]:
        """The LoRA adapters the voices name, one per directory, by id."""
        found = {v.adapter for v in self.voices.values() if v.adapter is not None}
        return sorted(found, key=lambda a: a.id)

    def resolve(self, name: str | None) -> Voice:
        """The voice called ``name`` (None: the default).

        Raises:
            UnknownVoiceError: naming the valid voices.
        """
        if name is None:
            name = self.default
        key = name.strip().lower()
        found = self.voices.get(key)  # one lookup: a reload on a worker thread may remove it
        if found is not None:
            return found
        if self.controllable:
            voice = _parse_controllable(key)
            if voice is not None:
                return voice
        hint = " (or gender:pitch:speed, e.g. female:high:moderate)" if self.controllable else ""
        raise UnknownVoiceError(
            f"unknown voice {name!r}; this checkpoint offers: {', '.join(self.names)}{hint}"
        )

    def register(self, name: str, global_codes: Sequence[int]) -> Voice:
        """Add (or replace) a voice defined by its global codes (a cloned voice)."""
        codes = check_globals(list(global_codes), self.num_globals, f"voice {name!r}")
        key = name.strip().lower()
        if not key:
            raise ValueError("a voice needs a non-empty name")
        self.voices = {**self.voices, key: Voice(name=key, globals=codes)}
        return self.voices[key]

    def enrol(
        self,
        name: str,
        global_codes: Sequence[int],
        semantic: Sequence[int] | None = None,
        transcript: str | None = None,
        *,
        owner: str = OPERATOR,
        replace: bool = True,
        limit: int | None = None,
    ) -> Voice:
        """Add (or replace) an enrolled voice: a checked name that no built-in voice has.

        Args:
            name: the voice's name.
            global_codes: its ``num_globals`` global codes.
            semantic: transcript mode: the reference clip's semantic codes (with ``transcript``).
            transcript: transcript mode: the reference clip's words (with ``semantic``).
            owner: who enrols it (a key fingerprint; ``OPERATOR``: the operator).
            replace: replace ``owner``'s own voice of that name (False: refuse it).
            limit: the most enrolled voices (None: no cap); a replacement does not count.

        Raises:
            EnrolmentError: an unusable name, one that a built-in voice (or a controllable
                ``gender:pitch:speed`` name) already answers to, a reserved name, another
                owner's voice, one's own without ``replace``, or a full book.
            ValueError: codes that are not ``num_globals`` global codes, or a transcript-mode
                reference without its codes or words.
        """
        key = self.check_enrolment(name, owner=owner, replace=replace, limit=limit)
        codes = check_globals(list(global_codes), self.num_globals, f"voice {key!r}")
        reference: tuple[tuple[int, ...] | None, str | None] = (None, None)
        if semantic is not None or transcript is not None:
            reference = check_semantic(semantic, transcript, f"voice {key!r}")
        voice = Voice(name=key, globals=codes, semantic=reference[0], transcript=reference[1])
        self._swap(
            {**self.voices, key: voice},
            self.enrolled | {key},
            {**self.owners, key: owner},
            self.shared - {key},
        )
        return voice

    def forget(self, name: str, owner: str | None = None) -> str:
        """Remove an enrolled voice; returns its canonical name.

        Args:
            name: the voice.
            owner: who asks (None: the operator's CLI or the in-process engine, who may remove
                any enrolled voice); another owner's voice is unknown to them, a shared one
                is refused.

        Raises:
            EnrolmentError: ``name`` is a built-in voice (those cannot be removed), or a voice
                ``owner`` may use but does not own.
            UnknownVoiceError: no voice has that name (that ``owner`` may use).
        """
        key = name.strip().lower()
        if key not in self.enrolled or (owner is not None and not self.usable_by(key, owner)):
            builtin = self.resolve_for(key, owner)  # UnknownVoiceError for a name that is no voice
            raise EnrolmentError(
                f"voice {builtin.name!r} is a built-in voice of this checkpoint; only enrolled "
                f"voices can be removed ({', '.join(self.owned_by(owner)) or 'none yet'})",
                code=EnrolmentError.NAME_TAKEN,
            )
        if owner is not None and self.owners.get(key, OPERATOR) != owner:
            raise EnrolmentError(
                f"voice {key!r} is shared with you but not yours: only its owner (or the "
                "operator, with pipecat-veena voices remove) can remove it",
                code=EnrolmentError.NOT_OWNER,
            )
        self._swap(
            {n: v for n, v in self.voices.items() if n != key},
            self.enrolled - {key},
            {n: o for n, o in self.owners.items() if n != key},
            self.shared - {key},
        )
        return key

    def share(self, name: str, shared: bool = True) -> str:
        """Mark an enrolled voice shared with every caller (or not); returns its name.

        Raises:
            UnknownVoiceError: no enrolled voice has that name.
        """
        key = name.strip().lower()
        if key not in self.enrolled:
            raise UnknownVoiceError(
                f"no enrolled voice {name!r} (enrolled: "
                f"{', '.join(sorted(self.enrolled)) or 'none'})"
            )
        self._swap(
            self.voices,
            self.enrolled,
            self.owners,
            self.shared | {key} if shared else self.shared - {key},
        )
        return key

    def _swap(
        self, voices: dict[str, Voice], enrolled: set[str], owners: dict[str, str], shared: set[str]
    ) -> None:
        """Put the new voices in place: each container is replaced whole, never changed in place.

        Changes run on worker threads (the voices file) while the event loop iterates these, so
        no reader sees one change size under it; the order keeps every voice at most as usable
        as before or after the change (owners and shares narrowed first).
        """
        self.shared = self.shared & shared
        self.owners = {**self.owners, **owners}
        self.voices = voices
        self.enrolled = enrolled
        self.owners = owners
        self.shared = shared

    # -- who may use what ------------------------------------------------------------------
    def usable_by(self, name: str, owner: str | None) -> bool:
        """True when ``owner`` may speak with voice ``name`` (None: the operator, anything).

        Built-in voices are everyone's; an enrolled voice is its owner's, and everyone's when it
        is shared or the operator's.
        """
        if owner is None or name not in self.enrolled:
            return True
        holder = self.owners.get(name, OPERATOR)
        return holder in (owner, OPERATOR) or name in self.shared

    def owned_by(self, owner: str | None) -> list[str]:
        """The enrolled voices ``owner`` may remove, sorted (None: every enrolled voice)."""
        return sorted(
            n for n in self.enrolled if owner is None or self.owners.get(n, OPERATOR) == owner
        )

    def shared_with_all(self) -> list[str]:
        """The enrolled voices every caller may use (shared, or the operator's), sorted."""
        return sorted(n for n in self.enrolled if self.usable_by(n, "\0nobody"))

    def resolve_for(self, name: str | None, owner: str | None) -> Voice:
        """``resolve``, as ``owner`` sees the book: another owner's voice does not exist.

        Raises:
            UnknownVoiceError: naming the voices ``owner`` may use.
        """
        voice = None
        try:
            voice = self.resolve(name)
        except UnknownVoiceError:
            pass
        if voice is not None and self.usable_by(voice.name, owner):
            return voice
        usable = [n for n in self.names if self.usable_by(n, owner)]
        hint = " (or gender:pitch:speed, e.g. female:high:moderate)" if self.controllable else ""
        raise UnknownVoiceError(
            f"unknown voice {name!r}; this checkpoint offers: {', '.join(usable)}{hint}"
        )

    def check_enrolment(
        self,
        name: str,
        *,
        owner: str = OPERATOR,
        replace: bool = True,
        limit: int | None = None,
    ) -> str:
        """The canonical name for a new enrolled voice; EnrolmentError as ``enrol`` raises."""
        key = check_voice_name(name)
        if key in self.enrolled:
            if self.owners.get(key, OPERATOR) != owner:
                raise EnrolmentError(
                    f"voice name {key!r} is taken: pick another name",
                    code=EnrolmentError.NAME_TAKEN,
                )
            if not replace:
                raise EnrolmentError(
                    f"you already have a voice {key!r}: send replace=true to replace it with "
                    "this clip, or pick another name",
                    code=EnrolmentError.NAME_TAKEN,
                )
            return key
        if key in self.reserved:
            raise EnrolmentError(
                f"voice name {key!r} is reserved on this server (an OpenAI voice name or a "
                "--voice-map alias, which every client may send): pick another name",
                code=EnrolmentError.NAME_TAKEN,
            )
        try:
            taken = self.resolve(key).name not in self.enrolled
        except UnknownVoiceError:
            taken = False
        if taken:
            raise EnrolmentError(
                f"voice name {key!r} belongs to a built-in voice of this checkpoint "
                f"({', '.join(n for n in self.names if n not in self.enrolled)}): pick another",
                code=EnrolmentError.NAME_TAKEN,
            )
        if limit is not None and len(self.enrolled) >= limit:
            raise EnrolmentError(
                f"this server holds its cap of {limit} enrolled voices: remove one of yours "
                "first (DELETE /v1/audio/voices/NAME), or ask the operator to raise the cap "
                "(pipecat-veena serve --max-enrolled-voices)",
                code=EnrolmentError.TOO_MANY_VOICES,
            )
        return key

    # -- pinned voice prints ----------------------------------------------------------------
    def print_for(self, voice: Voice) -> VoicePrint | None:
        """The pinned print of a generated voice, if any."""
        return self.pinned.get(voice.name) if voice.generated else None

    def offer_pin(self, voice: Voice, voiceprint: VoicePrint) -> bool:
        """Pin ``voiceprint`` for ``voice`` unless one is pinned already; True when pinned.

        Call it only for a request that completed cleanly (no error, guard, abort or cap).
        """
        if not voice.generated or voice.name in self.pinned:
            return False
        self.pinned = {**self.pinned, voice.name: voiceprint}  # replaced whole: see ``_swap``
        logger.debug(f"voice {voice.name!r} pinned")
        return True

    def export_prints(self, model: str) -> dict[str, Any]:
        """The pinned prints and the enrolled voices as a JSON-ready dict (``load_prints``)."""
        data: dict[str, Any] = {
            "format": PRINTS_FORMAT,
            "model": model,
            "voices": {
                name: {"prefix": list(p.prefix), "globals": list(p.globals)}
                for name, p in sorted(self.pinned.items())
            },
        }
        if self.enrolled:
            data["enrolled"] = {
                name: _enrolled_entry(
                    self.voices[name], self.owners.get(name, OPERATOR), name in self.shared
                )
                for name in sorted(self.enrolled)
            }
        return data

    def load_prints(
        self,
        data: dict[str, Any],
        check_prefix: Callable[[Sequence[int]], tuple[int, ...]],
        *,
        replace_enrolled: bool = False,
    ) -> list[str]:
        """Pin the prints of an exported dict, and enrol the voices it enrols.

        Args:
            data: what ``export_prints`` returned (e.g. read from its JSON file).
            check_prefix: parses a prefix with the model's grammar and returns its globals
                (raises ValueError when the prefix is not a voice prefix of this model).
            replace_enrolled: the file is the whole set of enrolled voices (a reload of a shared
                voices file): those it lacks are removed, an entry that is unusable is skipped
                with a warning (never the whole file), and a voice pinned already keeps its
                print (a call may be speaking with it). Otherwise (``load_voices``) the file's
                prints replace pins of the same voices and any bad entry raises.

        Returns:
            The names pinned, then the names of the enrolled voices the file adds.

        Raises:
            ValueError: a file that is not a voice-print file; without ``replace_enrolled``, also
                an unknown voice, a prefix that does not parse, or a bad enrolled entry
                (EnrolmentError for one whose name a built-in voice has).
        """
        if not isinstance(data, dict) or data.get("format") != PRINTS_FORMAT:
            raise ValueError(f"not a voice-print file: expected format {PRINTS_FORMAT!r}")
        entries = data.get("voices")
        if not isinstance(entries, dict):
            raise ValueError("voice-print file: 'voices' must be an object")
        enrolled = data.get("enrolled", {})
        if not isinstance(enrolled, dict):
            raise ValueError("voice-print file: 'enrolled' must map names to {'globals': [...]}")
        lenient = replace_enrolled

        def skip(what: str, e: Exception) -> None:
            if not lenient:
                raise e
            logger.warning(f"voices file: {what} skipped: {e}")

        checked = {}
        for n, e in enrolled.items():
            seen = self._parsed.get(n)
            if seen is not None and seen[0] == e and seen[1][0] not in self.reserved:
                checked[n] = seen[1]  # as the last file had it (20,000 voices: a reload is quick)
                continue
            try:
                checked[n] = self._enrolled_from_file(n, e)
            except ValueError as error:
                skip(f"enrolled voice {n!r}", error)
        self._parsed = {n: (enrolled[n], parsed) for n, parsed in checked.items()}
        loaded: dict[str, VoicePrint] = {}
        for name, entry in entries.items():
            try:
                voice, pin = self._pin_from_file(name, entry, check_prefix)
            except ValueError as error:
                skip(f"the pinned print of {name!r}", error)
                continue
            if not (lenient and voice in self.pinned):
                loaded[voice] = pin
        self.pinned = {**self.pinned, **loaded}
        found = dict(checked.values())
        gone = self.enrolled - found.keys() if replace_enrolled else set()
        voices = {n: v for n, v in self.voices.items() if n not in gone}
        voices.update((key, voice) for key, (voice, _, _) in found.items())
        owners = {n: o for n, o in self.owners.items() if n not in gone}
        owners.update((key, owner) for key, (_, owner, _) in found.items())
        shared = {n for n in self.shared if n not in gone and n not in found}
        shared.update(key for key, (_, _, is_shared) in found.items() if is_shared)
        self._swap(voices, (self.enrolled - gone) | found.keys(), owners, shared)
        return sorted(loaded) + sorted(found)

    def _enrolled_from_file(self, name: Any, entry: Any) -> tuple[str, tuple[Voice, str, bool]]:
        """(key, (voice, owner, shared)) of an enrolled entry of a file; ValueError if unusable."""
        if not isinstance(entry, dict) or not isinstance(entry.get("globals"), list):
            raise ValueError(f"voice {name!r}: expected {{'globals': [...]}}")
        owner, shared = entry.get("owner", OPERATOR), entry.get("shared", False)
        if not isinstance(owner, str) or not isinstance(shared, bool):
            raise ValueError(f"voice {name!r}: 'owner' must be text and 'shared' true or false")
        key = check_voice_name(name)
        if key in self.reserved or (key not in self.enrolled and key in self.voices):
            raise EnrolmentError(
                f"voice name {key!r} belongs to a built-in voice of this checkpoint, or is "
                "reserved on this server",
                code=EnrolmentError.NAME_TAKEN,
            )
        codes = check_globals(list(entry["globals"]), self.num_globals, f"voice {key!r}")
        semantic, transcript = _reference_of(key, entry)
        voice = Voice(name=key, globals=codes, semantic=semantic, transcript=transcript)
        return key, (voice, owner, shared)

    def _pin_from_file(
        self, name: str, entry: Any, check_prefix: Callable[[Sequence[int]], tuple[int, ...]]
    ) -> tuple[str, VoicePrint]:
        voice = self.resolve(name)
        if not voice.generated:
            raise ValueError(f"voice {name!r} is not generated by the model: nothing to pin")
        prefix = entry.get("prefix") if isinstance(entry, dict) else None
        if not isinstance(prefix, list) or not all(isinstance(t, int) for t in prefix):
            raise ValueError(f"voice {name!r}: 'prefix' must be a list of token ids")
        codes = check_prefix(prefix)
        if list(codes) != entry.get("globals"):
            raise ValueError(f"voice {name!r}: 'globals' do not match the prefix")
        return voice.name, VoicePrint(tuple(prefix), tuple(codes))


def _enrolled_entry(voice: Voice, owner: str, shared: bool) -> dict[str, Any]:
    """An enrolled voice in a voice-print file.

    Its globals, its transcript-mode reference, its owner (none: the operator's) and whether it
    is shared.
    """
    entry: dict[str, Any] = {"globals": list(voice.globals or ())}
    if voice.semantic is not None:
        entry.update(semantic=list(voice.semantic), transcript=voice.transcript)
    if owner:
        entry["owner"] = owner
    if shared:
        entry["shared"] = True
    return entry


def _reference_of(name: str, entry: dict[str, Any]) -> tuple[tuple[int, ...] | None, str | None]:
    """The (semantic codes, transcript) of an enrolled entry; (None, None) when global-only."""
    if "semantic" not in entry and "transcript" not in entry:
        return None, None
    return check_semantic(entry.get("semantic"), entry.get("transcript"), f"voice {name!r}")


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


def _adapters_from_file(data: dict, path: Path) -> dict[str, LoraAdapter]:
    """The LoRA adapter of each voice that names one, by voice key; one adapter per directory.

    Relative adapter paths are read from the voices file's directory (the checkpoint's).
    """
    adapters: dict[Path, LoraAdapter] = {}
    by_voice = {}
    for name, spec in data["voices"].items():
        lora = spec.get("lora") if isinstance(spec, dict) else None
        if lora is None:
            continue
        if not isinstance(lora, str) or not lora.strip():
            raise CheckpointError(
                f"{path}: voice {name!r}: 'lora' must be the path of a LoRA adapter directory, "
                f"got {lora!r}"
            )
        where = (path.parent / Path(lora.strip()).expanduser()).resolve()
        if where not in adapters:
            try:
                adapters[where] = load_adapter(where, name.strip().lower(), len(adapters) + 1)
            except ValueError as e:
                raise CheckpointError(f"{path}: voice {name!r}: {e}") from e
        by_voice[name.strip().lower()] = adapters[where]
    return by_voice


def _voices_from_file(data: dict, path: Path, num_globals: int) -> dict[str, Voice]:
    adapters = _adapters_from_file(data, path)
    voices = {}
    for name, spec in data["voices"].items():
        key = name.strip().lower()
        codes = spec.get("globals")
        speaker = spec.get("speaker")
        if codes is None and speaker is None:
            raise CheckpointError(f"{path}: voice {name!r} needs 'speaker' or 'globals'")
        if codes is not None:
            try:
                codes = check_globals(codes, num_globals, f"{path}: voice {name!r}")
            except ValueError as e:
                raise CheckpointError(str(e)) from e
        voices[key] = Voice(name=key, speaker=speaker, globals=codes, adapter=adapters.get(key))
    return voices


def spark_voices(root: Path, num_globals: int) -> VoiceBook:
    """Voices of a BiCodec checkpoint: voices.json when present, else the controllable set."""
    path = root / VOICES_FILE
    if not path.is_file():
        voices = {g: Voice(name=g, gender=i) for i, g in enumerate(GENDERS)}
        return VoiceBook(voices, "female", controllable=True, num_globals=num_globals)
    data = _read_voices_file(path)
    voices = _voices_from_file(data, path, num_globals)
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
        num_globals=num_globals,
    )


def veena_voices(root: Path) -> VoiceBook:
    """Voices of a SNAC (Veena) checkpoint: voices.json speakers, else Veena's four."""
    path = root / VOICES_FILE
    if path.is_file():
        data = _read_voices_file(path)
        adapters = _adapters_from_file(data, path)
        voices = {
            n.lower(): Voice(
                name=n.lower(), speaker=s.get("speaker", n), adapter=adapters.get(n.lower())
            )
            for n, s in data["voices"].items()
        }
        default = str(data.get("default_voice", next(iter(voices)))).lower()
        tags = tuple(data.get("emotion_tags", ()))
        max_part_chars = data.get("max_part_chars")
    else:
        voices = {n: Voice(name=n, speaker=n) for n in VEENA_SPEAKERS}
        default, tags, max_part_chars = VEENA_SPEAKERS[0], (), None
    return VoiceBook(
        voices, default, emotion_tags=tags, max_part_chars=max_part_chars, num_globals=0
    )
