"""Token inventories and stream parsers: pure functions of integers (no torch, no vLLM).

Ids are read from the checkpoint's tokenizer by their strings at load and checked, never assumed:
a tokenizer without the codec tokens is a ``TokenizerError`` that says what is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property

from pipecat_veena.engine.voices import LEVELS
from pipecat_veena.errors import MalformedStreamError, TokenizerError

#: Look up a token string's id (None when absent).
Lookup = Callable[[str], int | None]

#: Generated ids in a row that are neither codec nor structure tokens before the stream is
#: declared malformed (the model is writing text instead of audio).
MAX_STRAY_TOKENS = 64


def _require(lookup: Lookup, token: str, what: str) -> int:
    token_id = lookup(token)
    if token_id is None:
        raise TokenizerError(
            f"the tokenizer has no {token!r} ({what}); is this the LLM of a "
            "Spark-TTS/Veena3 or Veena/Orpheus checkpoint?"
        )
    return token_id


def _contiguous(lookup: Lookup, pattern: str, count: int, what: str) -> int:
    """Return the id of ``pattern.format(0)`` after checking the ``count`` ids are consecutive."""
    base = _require(lookup, pattern.format(0), what)
    for i in (1, count // 2, count - 1):
        token = pattern.format(i)
        if lookup(token) != base + i:
            raise TokenizerError(
                f"{what}: expected {token!r} at id {base + i}, found {lookup(token)}; "
                "the codec tokens must be consecutive ids"
            )
    return base


@dataclass(frozen=True)
class BiCodecIds:
    """Ids of the Spark-TTS / Veena3 token inventory (BiCodec globals and semantics, markers)."""

    global_base: int
    num_global_codes: int
    semantic_base: int
    num_semantic_codes: int
    eos: int
    markers: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_lookup(
        cls, lookup: Lookup, *, num_global_codes: int = 4096, num_semantic_codes: int = 8192
    ) -> BiCodecIds:
        """Read and check the inventory through ``lookup`` (token string -> id)."""
        global_base = _contiguous(
            lookup, "<|bicodec_global_{}|>", num_global_codes, "BiCodec global tokens"
        )
        semantic_base = _contiguous(
            lookup, "<|bicodec_semantic_{}|>", num_semantic_codes, "BiCodec semantic tokens"
        )
        eos = _require(lookup, "<|im_end|>", "end of speech")
        names = (
            "task_tts task_controllable_tts start_content end_content start_style_label "
            "end_style_label start_acoustic_token end_acoustic_token start_global_token "
            "end_global_token start_semantic_token end_semantic_token"
        ).split()
        required = {"task_tts", "start_content", "end_content", "start_global_token",
                    "end_global_token", "start_semantic_token"}  # fmt: skip
        markers = {}
        for name in names:
            token_id = lookup(f"<|{name}|>")
            if token_id is None and name in required:
                _require(lookup, f"<|{name}|>", "a Spark-TTS structure token")
            if token_id is not None:
                markers[name] = token_id
        for i in range(2):
            _optional(markers, lookup, f"gender_{i}")
        for i in range(len(LEVELS)):
            _optional(markers, lookup, f"pitch_label_{i}")
            _optional(markers, lookup, f"speed_label_{i}")
        return cls(global_base, num_global_codes, semantic_base, num_semantic_codes, eos, markers)

    def marker(self, name: str) -> int:
        """Id of a structure/style token by name (e.g. "start_global_token")."""
        try:
            return self.markers[name]
        except KeyError:
            raise TokenizerError(f"the tokenizer has no <|{name}|> token") from None

    def global_ids(self, codes: Iterable[int]) -> list[int]:
        """Token ids of global codes in [0, num_global_codes)."""
        return [self.global_base + int(c) for c in codes]

    def semantic_ids(self, codes: Iterable[int]) -> list[int]:
        """Token ids of semantic codes in [0, num_semantic_codes)."""
        return [self.semantic_base + int(c) for c in codes]

    @cached_property
    def control_ids(self) -> frozenset[int]:
        """Every id that steers generation (markers, style labels, eos)."""
        return frozenset([*self.markers.values(), self.eos])


def _optional(markers: dict[str, int], lookup: Lookup, name: str) -> None:
    token_id = lookup(f"<|{name}|>")
    if token_id is not None:
        markers[name] = token_id


@dataclass(frozen=True)
class SnacIds:
    """Ids of the Veena / Orpheus inventory: ``<custom_token_N>`` at ``base + N``.

    N = 1..6 are START/END_OF_SPEECH, START/END_OF_HUMAN, START/END_OF_AI; code c of slot j is
    ``<custom_token_{10 + j * codebook_size + c}>``.
    """

    base: int
    codebook_size: int = 4096
    slots: int = 7

    @classmethod
    def from_lookup(cls, lookup: Lookup, *, codebook_size: int = 4096, slots: int = 7) -> SnacIds:
        """Read and check the inventory through ``lookup`` (token string -> id)."""
        count = 10 + slots * codebook_size
        base = _contiguous(lookup, "<custom_token_{}>", count, "Veena/Orpheus SNAC tokens")
        return cls(base, codebook_size, slots)

    @property
    def start_of_speech(self) -> int:
        """START_OF_SPEECH (128257 in Veena)."""
        return self.base + 1

    @property
    def end_of_speech(self) -> int:
        """END_OF_SPEECH (128258 in Veena): the normal stop."""
        return self.base + 2

    @property
    def start_of_human(self) -> int:
        """START_OF_HUMAN (128259 in Veena)."""
        return self.base + 3

    @property
    def end_of_human(self) -> int:
        """END_OF_HUMAN (128260 in Veena)."""
        return self.base + 4

    @property
    def start_of_ai(self) -> int:
        """START_OF_AI (128261 in Veena)."""
        return self.base + 5

    @property
    def end_of_ai(self) -> int:
        """END_OF_AI (128262 in Veena): also a stop."""
        return self.base + 6

    @property
    def audio_base(self) -> int:
        """Id of code 0 of slot 0 (128266 in Veena)."""
        return self.base + 10

    @property
    def stop_ids(self) -> tuple[int, int]:
        """Ids that end an utterance."""
        return (self.end_of_speech, self.end_of_ai)

    @cached_property
    def control_ids(self) -> frozenset[int]:
        """Every id below the audio codes (the ten control tokens)."""
        return frozenset(range(self.base, self.audio_base))


class BiCodecParser:
    """Splits one generated part into the voice prefix (32 globals) and semantic codes.

    Grammar: [acoustic block] ``<|start_global_token|>`` 32 globals ``<|end_global_token|>``
    ``<|start_semantic_token|>`` semantics ``<|im_end|>``. With ``prefilled`` the prompt already
    holds the voice prefix and only the semantic part is expected.

    Args:
        ids: the inventory.
        num_globals: global tokens per voice (the codec's condition size, 32).
        prefilled: True when the prompt ends with the globals.
    """

    def __init__(self, ids: BiCodecIds, num_globals: int, *, prefilled: bool = False) -> None:
        self._ids = ids
        self._num_globals = num_globals
        self._start_global = ids.marker("start_global_token")
        self._end_global = ids.marker("end_global_token")
        self._stops = {ids.eos, ids.markers.get("end_semantic_token", ids.eos)}
        self._in_prefix = not prefilled
        self.globals: list[int] = []
        self.prefix: list[int] = []
        self.done = False
        self.semantic_count = 0
        self._stray = 0

    @property
    def voice_ready(self) -> bool:
        """True once the globals are known (generated or prefilled)."""
        return not self._in_prefix

    def feed(self, token_ids: Iterable[int]) -> list[int]:
        """Consume generated ids; return the new semantic codes (in [0, 8192)).

        Raises:
            MalformedStreamError: semantics before the globals, a wrong number of globals,
                globals after the prefix, or a long run of non-codec tokens.
        """
        out: list[int] = []
        ids = self._ids
        for tid in token_ids:
            if self.done:
                break
            code = tid - ids.semantic_base
            if 0 <= code < ids.num_semantic_codes:
                if self._in_prefix:
                    raise MalformedStreamError(
                        f"semantic token before the voice was complete ({len(self.globals)} of "
                        f"{self._num_globals} global tokens)"
                    )
                out.append(code)
                self._stray = 0
                continue
            if self._in_prefix:
                self._feed_prefix(tid)
            elif tid in self._stops:
                self.done = True
            elif 0 <= tid - ids.global_base < ids.num_global_codes:
                raise MalformedStreamError("global token after the voice prefix")
            elif tid not in ids.control_ids:
                self._count_stray(tid)
        self.semantic_count += len(out)
        return out

    def _feed_prefix(self, tid: int) -> None:
        code = tid - self._ids.global_base
        self.prefix.append(tid)
        if 0 <= code < self._ids.num_global_codes:
            if len(self.globals) == self._num_globals:
                raise MalformedStreamError(f"more than {self._num_globals} global tokens")
            self.globals.append(code)
        elif tid == self._end_global:
            if len(self.globals) != self._num_globals:
                raise MalformedStreamError(
                    f"voice prefix ended with {len(self.globals)} of {self._num_globals} "
                    "global tokens"
                )
            self._in_prefix = False
        elif tid in self._stops:
            raise MalformedStreamError(
                f"stream ended inside the voice prefix ({len(self.globals)} of "
                f"{self._num_globals} global tokens)"
            )
        elif tid not in self._ids.control_ids:
            self._count_stray(tid)

    def _count_stray(self, tid: int) -> None:
        self._stray += 1
        if self._stray > MAX_STRAY_TOKENS:
            raise MalformedStreamError(
                f"{self._stray} generated tokens in a row are not codec tokens (last id {tid}): "
                "the model is not producing speech"
            )


class SnacParser:
    """Turns generated Veena/Orpheus ids into flat SNAC codes, slot order checked.

    Args:
        ids: the inventory.
    """

    def __init__(self, ids: SnacIds) -> None:
        self._ids = ids
        self._span = ids.slots * ids.codebook_size
        self._stops = set(ids.stop_ids)
        self.count = 0
        self.done = False
        self._stray = 0

    def feed(self, token_ids: Iterable[int]) -> list[int]:
        """Consume generated ids; return the new codes (each in [0, codebook_size)).

        Raises:
            MalformedStreamError: a code in the wrong slot, or a long run of non-codec tokens.
        """
        out: list[int] = []
        ids = self._ids
        for tid in token_ids:
            if self.done:
                break
            value = tid - ids.audio_base
            if 0 <= value < self._span:
                slot, code = divmod(value, ids.codebook_size)
                expected = self.count % ids.slots
                if slot != expected:
                    raise MalformedStreamError(
                        f"SNAC code for slot {slot} where slot {expected} was due "
                        f"(token {self.count} of the stream)"
                    )
                out.append(code)
                self.count += 1
                self._stray = 0
            elif tid in self._stops:
                self.done = True
            elif tid not in ids.control_ids:
                self._stray += 1
                if self._stray > MAX_STRAY_TOKENS:
                    raise MalformedStreamError(
                        f"{self._stray} generated tokens in a row are not SNAC codes: "
                        "the model is not producing speech"
                    )
        return out
