"""One utterance through the engine: parts -> prompts -> tokens -> windows -> int16 chunks.

The per-request half of the engine (VeenaEngine owns what is shared). All state here belongs to
one ``stream()`` call; nothing is shared between calls except through ``EngineParts``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from loguru import logger

from pipecat_veena.audio import to_pcm_bytes
from pipecat_veena.codecs.base import AudioCodec
from pipecat_veena.engine.config import EngineConfig
from pipecat_veena.engine.formats import ModelFormat
from pipecat_veena.engine.guards import RepetitionGuard
from pipecat_veena.engine.voices import Voice, VoicePrint
from pipecat_veena.errors import NoAudioError
from pipecat_veena.generation import SamplingOptions, TokenGenerator
from pipecat_veena.generation.base import MAX_SEED
from pipecat_veena.interface import AudioChunk
from pipecat_veena.logs import caller_text
from pipecat_veena.normalize import sentence_language
from pipecat_veena.streaming import StreamConfig, StreamDecoder, should_hurry
from pipecat_veena.text import Part
from pipecat_veena.timing import SourceWords, WordTiming, split_words
from pipecat_veena.tracing import UtteranceTrace
from pipecat_veena.word_stream import WordStream

#: A code stream periodic over this many seconds is a loop; periods up to LOOP_PERIOD_S count.
LOOP_WINDOW_S = 3.0
LOOP_PERIOD_S = 0.5
#: ``Utterance._rate`` after a pause: the next part notes its speed again.
_AFTER_PAUSE = -1.0
#: The loop guard checks at every this many codes (rounded up to whole frames) of the stream.
_LOOP_CHECK_CODES = 16
#: Weight of a group's measured speaking rate in its voice's moving average (the prior of the
#: next group's provisional word times).
RATE_MEMORY = 0.3


@dataclass
class EngineParts:
    """What every utterance of one engine shares (built by ``VeenaEngine.start``).

    Attributes:
        config: the engine's settings.
        fmt: the checkpoint's model format (ids, prompts, parsers, voices).
        codec: the audio codec.
        generator: the LLM backend.
        batcher: the decode micro-batcher in front of the codec.
        stream_config: the sliding-window settings in use.
        speaking_rates: each (voice, language)'s speaking rate in seconds per spoken unit
            (``pipecat_veena.timing``), a moving average over the groups timed so far: the
            prior of provisional word times (``WordStream``).
    """

    config: EngineConfig
    fmt: ModelFormat
    codec: AudioCodec
    generator: TokenGenerator
    batcher: Any
    stream_config: StreamConfig
    speaking_rates: dict[tuple[str, str], float] = field(default_factory=dict)

    def remember_rate(self, key: tuple[str, str], seconds_per_unit: float) -> None:
        """Fold one group's measured speaking rate into its voice's moving average."""
        old = self.speaking_rates.get(key)
        self.speaking_rates[key] = (
            seconds_per_unit if old is None else old + RATE_MEMORY * (seconds_per_unit - old)
        )


class Utterance:
    """State of one ``VeenaEngine.stream()`` call: its parts, voice, decoder and counters.

    Args:
        shared: the engine's parts every utterance uses.
        rid: this request's id (the LLM requests are ``{rid}-{part index}``).
        voice: the resolved voice.
        options: sampling options (the family's defaults with the caller's overrides).
        max_tokens: the caller's cap on tokens per part, if any.
        language: how the text's numbers and codes are read ("auto", "hi", "en"), for timing.
        text: the caller's text as passed: word offsets point into it ("" when not known: the
            offsets then point into the parts' written text, joined by spaces).
        speed: the playback speed the engine stretches this audio to (``engine.speed``): the
            listener plays it that much faster, which hurrying reckons with.
    """

    def __init__(
        self,
        shared: EngineParts,
        rid: str,
        voice: Voice,
        options: SamplingOptions,
        max_tokens: int | None,
        *,
        language: str = "auto",
        text: str = "",
        speed: float = 1.0,
    ) -> None:
        self.shared = shared
        self.language = language
        self.speed = speed
        self.config = shared.config
        self.max_tokens = max_tokens
        self.fmt = shared.fmt
        self.rid = rid
        self.voice = voice
        self.options = options
        codec = shared.codec
        self.codec = codec
        self.rate = codec.frame_rate * codec.codes_per_frame  # LLM codec tokens per second
        self.decoder: StreamDecoder | None = None
        # The voice print every part continues in: the pinned one, or the one the first part
        # generates (``captured``), offered for pinning once the request completed cleanly.
        self.voiceprint = self.fmt.voices.print_for(voice) if self.config.pin_voices else None
        self.captured = False
        self.capped = False
        self.cut: str | None = None  # AudioChunk.cut
        self.tokens = 0
        self.prompt_tokens = 0
        self.samples = 0
        self.aborted = False
        self.error: Exception | None = None
        self.first_audio_at: float | None = None
        self.first_code_at = 0.0
        self.first_token_at: float | None = None  # perf_counter of the first LLM token
        self.last_decode_s = 0.0
        self.llm_request_id: str | None = None
        self.started = time.perf_counter()
        self.trace: UtteranceTrace | None = None  # set by the engine when traced
        self.guard = RepetitionGuard(
            window=round(LOOP_WINDOW_S * self.rate),
            max_period=round(LOOP_PERIOD_S * self.rate),
            check_every=codec.codes_per_frame * -(-_LOOP_CHECK_CODES // codec.codes_per_frame),
        )
        # Word timing: a group (parts up to one whose written text closes it) is timed while
        # its audio arrives (``WordStream``: a word is released once the audio covering it
        # exists, and rides the chunk that brought it); the rest once its audio is complete,
        # off the loop. ``_slots`` keeps the words in order: released words, and the futures of
        # groups being finished (the next group's words wait behind them).
        self._groups: deque[tuple[int, str, bool]] = deque()  # (end sample, written, cut)
        self._texts: deque[str] = deque()  # the written texts of the groups not opened yet
        self._group: _Group | None = None  # the group whose audio is arriving
        self._group_start = 0  # first sample of the next group
        self._source = SourceWords(text) if text else None  # where words are in the caller's
        self._written_at = 0  # without it: offset of the group's written text in theirs
        self._spoiled = False  # a part of the open group was cut short: no words for it
        self._slots: deque[list[WordTiming] | asyncio.Future[list[WordTiming]]] = deque()
        self._base = 0  # samples before the current decoder (earlier decoders and pauses)
        self._silence = 0  # samples of pauses (SSML breaks)
        # SSML: (first sample, speed: None the request's) in order, and the pauses' (first
        # sample: samples): a stretched utterance passes those around its stretcher (exact)
        self._speeds: list[tuple[int, float | None]] = [(0, None)]
        self._rate: float | None = None  # the speed of the part being spoken (None: request's)
        self.pauses: dict[int, int] = {}

    async def run(self, parts: list[Part]) -> AsyncIterator[AudioChunk]:
        """Speak the parts in order, one voice throughout; yields int16 chunks."""
        if self.config.log_requests:
            logger.info(f"{self.rid}: voice={self.voice.name} parts={len(parts)}")
        self._texts = deque(part.written for part in parts if part.written)
        for index, part in enumerate(parts):
            if part.pause_s:
                async with aclosing(self._pause(part.pause_s)) as chunks:
                    async for chunk in chunks:
                        yield chunk
                continue
            if part.rate != self._rate:  # (SSML <prosody rate>) from the part's first sample
                self._rate = part.rate
                self._speeds.append((self._next_sample(), part.rate))
            capped = self.capped
            async with aclosing(self._run_part(index, part.spoken)) as chunks:
                async for chunk in chunks:
                    yield chunk
            if self.aborted:
                break
            self._end_part(part, cut=self.guard.tripped or self.capped and not capped)
            if self.trace is not None:
                self.trace.part(index, self.tokens, self.samples / self.codec.sample_rate)
            if self.guard.tripped:
                break
        if self.aborted:
            logger.debug(f"{self.rid}: aborted")
            if self.error is not None:
                raise self.error
            return
        if self.decoder is not None:
            jobs = self.decoder.plan_finish()
            for i, job in enumerate(jobs):
                chunk = await self._decode(job, last=i == len(jobs) - 1)
                if chunk is not None:
                    yield chunk
        said = [part.spoken for part in parts if part.spoken]
        if self.samples == self._silence and said:
            raise NoAudioError(
                f"{self.rid}: the model produced no audio for speakable text "
                f"{caller_text(said[0], show=self.config.log_text)}"
            )
        if self._slots:
            logger.debug(f"{self.rid}: no chunk left to carry the last words' timings")
        if self.captured and self.config.pin_voices and not (self.guard.tripped or self.capped):
            self.fmt.voices.offer_pin(self.voice, self.voiceprint)
        logger.debug(
            f"{self.rid}: done: {self.tokens} tokens, "
            f"{self.samples / self.codec.sample_rate:.2f} s audio in "
            f"{time.perf_counter() - self.started:.2f} s"
        )

    def _part_request(self, index: int, text: str) -> tuple[list[int], SamplingOptions, Any]:
        """The prompt, sampling options and parser of part ``index``."""
        fmt = self.fmt
        prefilled = self.voiceprint is not None or self.voice.globals is not None
        prompt = fmt.prompt(text, self.voice, self.voiceprint)
        options = fmt.options(
            self.options,
            text,
            self.voice,
            prefilled=prefilled,
            rate=self.rate,
            constrain=self.config.constrain_grammar,
        )
        room = self.config.max_model_len - len(prompt)
        cap = min(options.max_tokens, room, self.max_tokens or room)
        options = replace(
            options,
            max_tokens=cap,
            min_tokens=min(options.min_tokens, cap),
            seed=None if options.seed is None else (options.seed + index) % (MAX_SEED + 1),
        )
        return prompt, options, fmt.parser(prefilled=prefilled)

    async def _run_part(self, index: int, text: str) -> AsyncIterator[AudioChunk]:
        prompt, options, parser = self._part_request(index, text)
        self.prompt_tokens += len(prompt)
        if self.trace is not None:
            self.trace.prompt(index, len(prompt), len(text))
        generator = self.shared.generator
        reason = None
        self.llm_request_id = request_id = f"{self.rid}-{index}"
        try:
            async with aclosing(generator.generate(prompt, options, request_id)) as deltas:
                async for delta in deltas:
                    if self.aborted:
                        return
                    reason = delta.finish_reason
                    for job in self._plan(delta, parser):
                        chunk = await self._decode(job)
                        if self.aborted:
                            return
                        if chunk is not None:
                            yield chunk
                    if parser.done or self.guard.tripped:
                        break
        finally:
            if reason is None:
                # Ended early (guard, abort, error, listener gone): stop the LLM now, whatever
                # wraps the generator (closing the iterator aborts too; a second abort is a no-op).
                await generator.abort(request_id)
        if reason == "length":
            self.capped = True
            self.cut = self.cut or "token_cap"
            logger.warning(
                f"{self.rid}: part {index} hit the runaway cap ({options.max_tokens} tokens) "
                "for its text length; stopped it"
            )

    def _plan(self, delta: Any, parser: Any) -> list[Any]:
        """Parse one delta of generated ids and plan the decodes it makes due."""
        self.tokens += len(delta.token_ids)
        if self.first_token_at is None and delta.token_ids:
            self.first_token_at = time.perf_counter()
            if self.trace is not None:
                self.trace.first_token()
        codes = parser.feed(delta.token_ids)
        if self.decoder is None and self._voice_known(parser):
            self.decoder = StreamDecoder(
                self.codec, self.shared.stream_config, condition=self._condition(parser)
            )
        if not codes:
            return []
        if not self.first_code_at:
            self.first_code_at = time.monotonic()
        was_looping = self.guard.tripped
        codes = codes[: self.guard.feed(codes)]  # without the loop's tail past the check
        if self.guard.tripped and not was_looping:
            self.cut = "loop_guard"
            logger.warning(
                f"{self.rid}: generation is looping (period {self.guard.period} codes); "
                "stopping this utterance"
            )
        return self.decoder.plan(codes, urgent=self._urgent())

    def _urgent(self) -> bool:
        """True when waiting for the next grown chunk would let the listener's buffer run dry.

        The wait is estimated from this request's own generation rate; the margin is the
        configured minimum buffer or 1.5 times the last decode time, whichever is larger. A
        request generated slower than real time never hurries (it would only add decode work).
        It hurries even when the last chunk took longer to decode than it lasts (a small chunk
        of a large codec on CPU: most of its cost is the codec's fixed context): an urgent chunk
        is never smaller than the previous one, and waiting for the doubled chunk instead
        starved the listener at every doubling (BENCHMARKS.md, playground).

        Never for a request with a seed: hurrying depends on timing, and a seeded request's
        chunks (so its seams, so its audio) must depend on its tokens alone.
        """
        if self.options.seed is not None:
            return False
        if self.first_audio_at is None:
            return False
        now = time.monotonic()
        return should_hurry(
            buffered_s=self.samples / self.codec.sample_rate / self.speed
            - (now - self.first_audio_at),
            frames_until_due=self.decoder.frames_until_due,
            frames_per_s=self.decoder.frames_received / max(now - self.first_code_at, 1e-6),
            margin_s=max(self.config.min_buffer_s, 1.5 * self.last_decode_s),
            real_time_fps=self.codec.frame_rate * self.speed,
        )

    async def abort(self, error: Exception | None = None) -> None:
        """Stop this request: abort its LLM request now.

        Its iterator then ends quietly, or raises ``error`` when one is given (the engine
        shutting down under it).
        """
        self.aborted = True
        self.error = error
        if self.llm_request_id is not None:
            await self.shared.generator.abort(self.llm_request_id)

    def end_trace(self, error: BaseException | None) -> None:
        """Close this utterance's span: cancelled (closed, cancelled or aborted) or failed."""
        stopped = isinstance(error, GeneratorExit | asyncio.CancelledError)
        failure = self.error or (None if stopped else error)
        self.trace.end(
            tokens=self.tokens,
            prompt_tokens=self.prompt_tokens,
            audio_s=self.samples / self.codec.sample_rate,
            cut=self.cut,
            cancelled=(self.aborted or stopped) and failure is None,
            error=failure,
        )

    def _voice_known(self, parser: Any) -> bool:
        """True once the stream's voice is known (BiCodec: after its globals)."""
        if self.fmt.family != "bicodec":
            return True
        if not parser.voice_ready:
            return False
        if self.voiceprint is None and self.voice.globals is None:
            # later parts of this request continue in the voice its first part generated
            self.voiceprint = _voiceprint(parser)
            self.captured = True
        return True

    def _condition(self, parser: Any) -> tuple[int, ...] | None:
        if self.fmt.family != "bicodec":
            return None
        if self.voice.globals is not None:
            return self.voice.globals
        return self.voiceprint.globals

    async def _decode(self, job: Any, *, last: bool = False) -> AudioChunk | None:
        """Decode one job into a chunk.

        The utterance's ``last`` chunk waits for the last words' timings (they need all of the
        audio; a few milliseconds, while the listener plays what came before).
        """
        started = time.monotonic()
        audio = await self.shared.batcher.decode(job.window)
        self.last_decode_s = time.monotonic() - started
        samples = self.decoder.accept(job, audio)
        if len(samples) == 0:
            return None
        if self.trace is not None:
            self.trace.chunk(self.samples / self.codec.sample_rate)
        self.samples += len(samples)
        if self.first_audio_at is None:
            self.first_audio_at = time.monotonic()
        self._time_words(samples)
        if last:
            await self._words_finished()
        return AudioChunk(
            to_pcm_bytes(samples), self.codec.sample_rate, self.tokens, self.prompt_tokens,
            cut=self.cut, queue_s=self.first_token_at - self.started,
            words=self._timed_words(),
        )  # fmt: skip

    def speed_changes(self, speed: float) -> Callable[[], list[tuple[int, float]]]:
        """For a request at ``speed``: the speed changes noted since the last call.

        The function returns (first sample, speed) pairs, each known before its audio is
        yielded. Parts with their own rate (SSML ``<prosody rate>``) at theirs, the rest at
        ``speed`` (pauses are not stretched at all: ``pauses``).
        """
        seen = 0

        def changes() -> list[tuple[int, float]]:
            nonlocal seen
            new, seen = self._speeds[seen:], len(self._speeds)
            return [(at, speed if rate is None else rate) for at, rate in new]

        return changes

    def _next_sample(self) -> int:
        """The sample at which the audio of the next generated frame will start."""
        if self.decoder is None:
            return self.samples
        return self._base + self.decoder.frames_received * self.codec.samples_per_frame

    async def _flush(self) -> AsyncIterator[AudioChunk]:
        """Decode all the audio generated so far; the next part starts a new decoder.

        The words of the groups closed are timed on the audio they have.
        """
        if self.decoder is not None:
            jobs = self.decoder.plan_finish()
            for i, job in enumerate(jobs):
                chunk = await self._decode(job, last=i == len(jobs) - 1)
                if chunk is not None:
                    yield chunk
            self.decoder = None
        self._base = self.samples
        # A group still open here ends with the audio there is.
        self._groups = deque((min(end, self.samples), w, c) for end, w, c in self._groups)
        self._time_words(np.zeros(0, dtype=np.float32))

    async def _pause(self, seconds: float) -> AsyncIterator[AudioChunk]:
        """Exact silence of ``seconds`` (an SSML break) after everything said so far.

        The decoder is flushed first (its held-back audio is the words before the pause) and a
        new one starts after it; the words before are timed on the audio before the silence.
        """
        async with aclosing(self._flush()) as chunks:
            async for chunk in chunks:
                yield chunk
        await self._words_finished()
        n = round(seconds * self.codec.sample_rate)
        self.pauses[self.samples] = n
        self._rate = _AFTER_PAUSE
        self.samples += n
        self._silence += n
        self._base = self._group_start = self.samples
        if self._group is not None:  # a sentence goes on after the pause: its words span it
            self._feed(self._group, np.zeros(n, dtype=np.float32))
        if self.first_audio_at is None:
            self.first_audio_at = time.monotonic()
        queue_s = None if self.first_token_at is None else self.first_token_at - self.started
        yield AudioChunk(
            to_pcm_bytes(np.zeros(n, dtype=np.float32)), self.codec.sample_rate, self.tokens,
            self.prompt_tokens, cut=self.cut, queue_s=queue_s, words=self._timed_words(),
        )  # fmt: skip

    def _end_part(self, part: Part, *, cut: bool) -> None:
        """Note where a finished part's audio ends; a closed group is timed once it is decoded.

        Args:
            part: the part that just finished generating.
            cut: it was cut short (loop guard, token cap): its group reports no words.
        """
        self._spoiled = self._spoiled or cut
        if not part.written:
            return
        end = self.decoder.frames_received * self.codec.samples_per_frame if self.decoder else 0
        self._groups.append((self._base + end, part.written, self._spoiled))
        if self._spoiled:
            logger.debug(f"{self.rid}: part cut short: its words are not timed")
        self._spoiled = False

    def _time_words(self, samples: np.ndarray) -> None:
        """Time the words of the new ``samples`` (the last decoded); finish each complete group.

        The open group's stream gets its share of the samples and releases the words they
        complete; a group whose audio is now complete is finished off the loop.
        """
        at = self.samples - len(samples)  # where ``samples`` start in the utterance
        while self._groups and self._groups[0][0] <= self.samples:
            end, written, cut = self._groups.popleft()
            group = self._open_group()
            take = max(0, end - at)
            if group is not None:
                self._feed(group, samples[:take])
            samples, at = samples[take:], max(at, end)
            self._group, self._group_start = None, end
            if group is not None and not cut:
                future = asyncio.ensure_future(asyncio.to_thread(self._finish, group))
                future.add_done_callback(lambda _, g=group: self._remember(g))
                self._slots.append(future)
        if len(samples) and (group := self._open_group()) is not None:
            self._feed(group, samples)

    def _open_group(self) -> _Group | None:
        """The group whose audio is arriving, opened on its first samples (None: no more text)."""
        if self._group is None and self._texts:
            written = self._texts.popleft()
            key = (self.voice.name, _language_of(written, self.language))
            stream = WordStream(
                written,
                self.codec.sample_rate,
                self.language,
                seconds_per_unit=self.shared.speaking_rates.get(key),
            )
            self._group = _Group(
                stream,
                self._group_start / self.codec.sample_rate,
                self._source_spans(written),  # (in order, a cut group's words too)
                None if self._source is None else self._source.text,
                key,
            )
        return self._group

    def _feed(self, group: _Group, samples: np.ndarray) -> None:
        """Give a group its next samples; the words they complete join the words to send."""
        try:
            words = group.stream.feed(samples)
        except Exception as e:  # noqa: BLE001 (timing must never break the audio)
            logger.warning(f"{self.rid}: word timing failed ({type(e).__name__}: {e})")
            return
        if words:
            placed = group.place(words)
            if self._slots and isinstance(self._slots[-1], list):
                self._slots[-1].extend(placed)
            else:
                self._slots.append(placed)

    def _finish(self, group: _Group) -> list[WordTiming]:
        """The words of a complete group not released yet (on a worker thread)."""
        try:
            return group.place(group.stream.finish())
        except Exception as e:  # noqa: BLE001 (timing must never break the audio)
            logger.warning(f"{self.rid}: word timing failed ({type(e).__name__}: {e})")
            return []

    def _remember(self, group: _Group) -> None:
        """A finished group's measured speaking rate joins its voice's average (on the loop)."""
        if group.stream.seconds_per_unit:
            self.shared.remember_rate(group.key, group.stream.seconds_per_unit)

    async def _words_finished(self) -> None:
        """Wait until the groups being finished are (their words can ride the next chunk)."""
        pending = [slot for slot in self._slots if isinstance(slot, asyncio.Future)]
        if pending:
            await asyncio.wait(pending)

    def _source_spans(self, written: str) -> list[tuple[int, int] | None]:
        """Where each word of a group's written text is in the caller's text (None: not found)."""
        words = split_words(written)
        if self._source is None:
            at, self._written_at = self._written_at, self._written_at + len(written) + 1
            return [(at + a, at + b) for a, b in words]
        spans = [self._source.find(written[a:b]) for a, b in words]
        if None in spans:
            logger.debug(f"{self.rid}: a timed word is not in the caller's text")
        return spans

    def _timed_words(self) -> tuple[WordTiming, ...]:
        """The words timed so far, in order (a group's wait for the groups before it)."""
        words: list[WordTiming] = []
        while self._slots:
            slot = self._slots[0]
            if isinstance(slot, asyncio.Future):
                if not slot.done():
                    break
                slot = slot.result()
            words += slot
            self._slots.popleft()
        return tuple(words)


@dataclass
class _Group:
    """One group's words while they are timed.

    Attributes:
        stream: its word stream (fed the group's audio).
        offset_s: where its audio starts in the utterance, seconds.
        spans: where each of its words is in the caller's text (None: not found).
        source: the caller's text (None: offsets point into the parts' written text).
        key: (voice, language) of its speaking rate.
        released: words placed so far.
        at: the offset of the last word found in the caller's text.
    """

    stream: WordStream
    offset_s: float
    spans: list[tuple[int, int] | None]
    source: str | None
    key: tuple[str, str]
    released: int = 0
    at: int = 0

    def place(self, words: list[WordTiming]) -> list[WordTiming]:
        """The group's next words shifted to the utterance and spelled as in the caller's text.

        A word not found in the caller's text keeps its normalised form and the offset of the
        word before (best effort).
        """
        placed = []
        for w in words:
            span = self.spans[self.released] if self.released < len(self.spans) else None
            self.released += 1
            word = w.word
            if span is not None:
                self.at = span[0]
                word = word if self.source is None else self.source[span[0] : span[1]]
            start, end = round(w.start + self.offset_s, 4), round(w.end + self.offset_s, 4)
            placed.append(WordTiming(word, start, end, self.at))
        return placed


def _language_of(written: str, language: str) -> str:
    """The language a group is spoken in: the request's, else its script's."""
    return language if language != "auto" else sentence_language(written) or "en"


def _voiceprint(parser: Any) -> VoicePrint:
    """The voice print a BiCodec parser read once ``voice_ready``."""
    return VoicePrint(tuple(parser.prefix), tuple(parser.globals))
