"""SpeechEngine: the one interface the framework adapters (Pipecat, LiveKit, the server) speak to.

Three engines implement it: ``VeenaEngine`` (in-process vLLM and codec), ``EngineThread`` (a
VeenaEngine on a thread and loop of its own) and ``RemoteVeenaEngine`` (a ``pipecat-veena
serve`` server over a WebSocket). Adapters type against this Protocol, never a concrete engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pipecat_veena.audio import BYTES_PER_SAMPLE

__all__ = ["AudioChunk", "SpeechEngine", "WordTiming"]


@dataclass(frozen=True)
class WordTiming:
    """One written word and where it is spoken (an estimate).

    Attributes:
        word: the word as written in the caller's text (with its attached punctuation), character
            for character (a decomposed accent stays decomposed).
        start: seconds from the first sample of the audio to the word's start.
        end: seconds to its end (the next word's start, or the start of the pause after it).
        offset: index of the word's first character in the caller's text exactly as it was
            passed (not its normalised form), in Python code points (str indices):
            ``text[offset:offset + len(word)] == word``.
        offset_utf16: the same index in UTF-16 code units (JavaScript string indices: an emoji
            or other character outside the BMP counts 2); set by the speech server on the
            words it sends, None elsewhere.
    """

    word: str
    start: float
    end: float
    offset: int
    offset_utf16: int | None = None


@dataclass(frozen=True)
class AudioChunk:
    """A piece of one utterance's audio.

    Attributes:
        pcm: mono little-endian int16 samples (empty on a chunk that only carries ``words``:
            ``RemoteVeenaEngine`` gets them in a message of their own, after their audio).
        sample_rate: their rate (the codec's: 16 kHz BiCodec, 24 kHz SNAC).
        tokens: LLM tokens generated in the request up to this chunk.
        prompt_tokens: prompt tokens of the request's LLM calls up to this chunk.
        cut: why the utterance was cut short, on the chunks decoded after it was: "loop_guard"
            (the model repeated itself) or "token_cap" (a part hit its cap on tokens); None.
        queue_s: seconds from the engine taking the request to its first LLM token (waiting
            for a vLLM slot, plus prefill); None when unknown (a remote engine).
        words: words of the text as written whose audio is complete by the end of this chunk
            (or of an earlier one), each timed in seconds from the utterance's first sample.
            Estimates (``pipecat_veena.timing.align_words`` on each part's generated audio;
            part boundaries are exact). A part cut short (loop guard, token cap) reports no
            words; engines that do not time words (``times_words`` False) report none.
    """

    pcm: bytes
    sample_rate: int
    tokens: int
    prompt_tokens: int = 0
    cut: str | None = None
    queue_s: float | None = None
    words: tuple[WordTiming, ...] = ()

    @property
    def num_samples(self) -> int:
        """Samples in the chunk."""
        return len(self.pcm) // BYTES_PER_SAMPLE

    @property
    def duration(self) -> float:
        """Seconds of audio in the chunk."""
        return self.num_samples / self.sample_rate


@runtime_checkable
class SpeechEngine(Protocol):
    """Text in, streamed int16 PCM chunks out; shared by every call of a process."""

    @property
    def model_name(self) -> str:
        """A short name of the loaded model (the checkpoint directory's name)."""
        ...

    @property
    def is_running(self) -> bool:
        """True while the engine can serve requests."""
        ...

    @property
    def sample_rate(self) -> int:
        """Rate of the emitted audio in Hz (the codec's: 16 kHz BiCodec, 24 kHz SNAC)."""
        ...

    @property
    def voices(self) -> list[str]:
        """Voice names of the loaded model, default first."""
        ...

    @property
    def times_words(self) -> bool:
        """True when ``AudioChunk.words`` carries the word timings of the text as written."""
        ...

    @property
    def emotion_tags(self) -> tuple[str, ...]:
        """Inline tags the model understands (e.g. ``<laugh>``); empty when none."""
        ...

    async def start(self) -> None:
        """Load or connect; idempotent, and safe to call from several tasks at once."""
        ...

    async def shutdown(self) -> None:
        """Release everything the engine holds; idempotent."""
        ...

    def stream(
        self, text: str, voice: str | None = None, *, request_id: str | None = None, **options: Any
    ) -> AsyncIterator[AudioChunk]:
        """Speak ``text``: int16 chunks as they are decoded; closing the iterator aborts it."""
        ...

    async def abort(self, request_id: str) -> int:
        """Stop the in-flight streams started with ``request_id``; returns how many."""
        ...

    def check_voice(self, voice: str | None) -> str:
        """Canonical name of ``voice`` (None: the default); raises UnknownVoiceError."""
        ...

    def check_options(self, **options: Any) -> None:
        """Raise ValueError naming the problem when request options cannot work."""
        ...

    def stats(self) -> dict[str, Any]:
        """Live counters (active streams, unfinished LLM requests, decode batching, ...)."""
        ...
