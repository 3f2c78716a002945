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
from dataclasses import dataclass, replace
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
from pipecat_veena.streaming import StreamConfig, StreamDecoder, should_hurry
from pipecat_veena.text import Part
from pipecat_veena.timing import SourceWords, WordTiming, align_words, split_words
from pipecat_veena.tracing import UtteranceTrace

#: A code stream periodic over this many seconds is a loop; periods up to LOOP_PERIOD_S count.
LOOP_WINDOW_S = 3.0
LOOP_PERIOD_S = 0.5
#: ``Utterance._rate`` after a pause: the next part notes its speed again.
_AFTER_PAUSE = -1.0
#: The loop guard checks at every this many codes (rounded up to whole frames) of the stream.
_LOOP_CHECK_CODES = 16


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
    """

    config: EngineConfig
    fmt: ModelFormat
    codec: AudioCodec
    generator: TokenGenerator
    batcher: Any
    stream_config: StreamConfig


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
        # Word timing: a group (parts up to one whose written text closes it) is aligned once
        # its audio is complete, off the loop; its words ride the next chunk after that.
        self._groups: deque[tuple[int, str, bool]] = deque()  # (end sample, written, cut)
        self._group_start = 0  # first sample of the group being spoken
        self._group_audio: list[np.ndarray] = []  # its samples so far
        self._source = SourceWords(text) if text else None  # where words are in the caller's
        self._written_at = 0  # without it: offset of the group's written text in theirs
        self._spoiled = False  # a part of the open group was cut short: no words for it
        self._timing: deque[asyncio.Future[list[WordTiming]]] = deque()
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
        if self._timing:
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
        if last and self._timing:
            await asyncio.wait(self._timing)
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
        if self._timing:
            await asyncio.wait(self._timing)
        n = round(seconds * self.codec.sample_rate)
        self.pauses[self.samples] = n
        self._rate = _AFTER_PAUSE
        self.samples += n
        self._silence += n
        self._base = self._group_start = self.samples
        self._group_audio = []
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
        """Keep the group's audio; start timing each group whose audio is now complete."""
        self._group_audio.append(samples)
        while self._groups and self._groups[0][0] <= self.samples:
            end, written, cut = self._groups.popleft()
            audio = np.concatenate(self._group_audio)
            split = end - self._group_start
            self._group_audio = [audio[split:]] if split < len(audio) else []
            offset_s = self._group_start / self.codec.sample_rate
            self._group_start = end
            spans = self._source_spans(written)  # (in order, a cut group's words too)
            if not cut:
                self._timing.append(
                    asyncio.ensure_future(
                        asyncio.to_thread(self._align, written, audio[:split], offset_s, spans)
                    )
                )

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

    def _align(
        self,
        written: str,
        audio: np.ndarray,
        offset_s: float,
        spans: list[tuple[int, int] | None],
    ) -> list[WordTiming]:
        """Word timings of one group, shifted to the utterance and its caller's text.

        Runs on a worker thread. A word not found in the caller's text keeps its normalised
        form and the offset of the word before (best effort).
        """
        try:
            words = align_words(
                written, audio, self.codec.sample_rate, self.language, assume_speech=True
            )
        except Exception as e:  # noqa: BLE001 (timing must never break the audio)
            logger.warning(f"{self.rid}: word timing failed ({type(e).__name__}: {e})")
            return []
        if not words:
            return []
        source = self._source.text if self._source is not None else None
        timed, at = [], 0
        for w, span in zip(words, spans, strict=True):
            word = w.word
            if span is not None:
                at = span[0]
                word = word if source is None else source[span[0] : span[1]]
            timed.append(
                WordTiming(word, round(w.start + offset_s, 4), round(w.end + offset_s, 4), at)
            )
        return timed

    def _timed_words(self) -> tuple[WordTiming, ...]:
        """The words of the groups timed so far, in order (a group waits for those before)."""
        words: list[WordTiming] = []
        while self._timing and self._timing[0].done():
            words += self._timing.popleft().result()
        return tuple(words)


def _voiceprint(parser: Any) -> VoicePrint:
    """The voice print a BiCodec parser read once ``voice_ready``."""
    return VoicePrint(tuple(parser.prefix), tuple(parser.globals))
