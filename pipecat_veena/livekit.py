"""LiveKit Agents TTS plugin over a shared engine (install the ``livekit`` extra).

``VeenaTTS`` speaks through an engine shared by the whole process (in-process ``VeenaEngine``,
an ``EngineThread``, or a ``RemoteVeenaEngine``): one-shot ``synthesize()`` and streaming-text
``stream()`` (sentence by sentence while the LLM is still writing), audio pushed as the engine
decodes it. LiveKit's retry rules hold as the installed version applies them: a ``stream()``
error is retried only before any audio of the attempt was pushed; ``synthesize()`` (LiveKit
1.7+) is retried after partial audio too, under a new request id that marks that audio stale.
Every wait for the engine's next chunk is bounded by ``conn_options.timeout``, so a stalled
engine surfaces as an error instead of an agent that keeps "speaking" silence.
A LiveKit worker loads the engine in its (synchronous, loop-less) prewarm function through
``pipecat_veena.engine_thread.EngineThread``, which serves every job's event loop.
Nothing here imports Pipecat, and the engine knows nothing of LiveKit.
"""

from __future__ import annotations

import asyncio
import re
import weakref
from contextlib import aclosing
from dataclasses import asdict, dataclass, replace
from typing import Any

from livekit.agents import (
    DEFAULT_API_CONNECT_OPTIONS,
    APIConnectionError,
    APIConnectOptions,
    APIError,
    APITimeoutError,
    tokenize,
    tts,
    utils,
)
from livekit.agents import __version__ as _LIVEKIT_VERSION
from livekit.agents.types import TimedString
from loguru import logger

from pipecat_veena.engine import check_speed, voice_with_levels
from pipecat_veena.errors import EngineDeadError, EngineNotRunningError
from pipecat_veena.interface import AudioChunk, SpeechEngine
from pipecat_veena.logs import caller_text
from pipecat_veena.normalize.ssml import break_markup, markup_of_hook
from pipecat_veena.resample import StreamResampler
from pipecat_veena.text import is_speakable

PROVIDER = "pipecat-veena"
#: Errors that a retry cannot fix: bad input (unknown voice, bad sampling), a stopped engine.
#: An ``EngineDeadError`` says itself (``retryable``: the engine restarts its LLM backend).
_PERMANENT = (ValueError, EngineNotRunningError)
#: LiveKit 1.7 and later retry ``synthesize()`` after partial audio (a fresh request id marks
#: that audio stale); earlier versions, like ``stream()`` in every version, only before it.
CHUNKED_RETRIES_AFTER_AUDIO = tuple(int(x) for x in _LIVEKIT_VERSION.split(".")[:2]) >= (1, 7)
_TAG = re.compile(r"<(sound|expression|emotion)\s+value=\"([^\"]+)\"\s*/>|\[([a-z_ ]+)\]")


@dataclass(frozen=True)
class VeenaTTSOptions:
    """Per-utterance settings (``update_options`` changes them for later streams).

    Parameters:
        voice: a voice of the engine's checkpoint (None: its default).
        temperature: sampling temperature (None: the model family's default).
        top_k: top-k sampling (None: default).
        top_p: nucleus sampling mass (None: default).
        repetition_penalty: > 1 discourages loops (None: default).
        seed: sampling seed for reproducible speech (None: random).
        pitch: Spark controllable voices only: very_low, low, moderate, high or very_high.
        speed: a number from 0.5 to 2.0: playback speed, any voice (the audio is stretched
            keeping its pitch, word times scale with it; 1.0 leaves it untouched); or a Spark
            controllable voice's speed level: very_low, low, moderate, high or very_high.
        lexicon: term -> spoken form entries for these requests (``Lexicon`` shapes, at most
            1000 entries and 64 KiB), laid over the engine's lexicon.
        ssml: the text is SSML (README "SSML"). LiveKit's ``<break time>`` markup is read as a
            pause either way (``Markup.convert``), the rest of such text staying data.
    """

    voice: str | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    pitch: str | None = None
    speed: float | str | None = None
    lexicon: dict[str, Any] | None = None
    ssml: bool = False

    def sampling(self) -> dict[str, Any]:
        """The sampling overrides that are set, and a playback speed, as ``engine.stream`` keywords.

        Raises:
            ValueError: a playback speed outside 0.5-2.0.
        """
        skip = ("voice", "pitch", "speed", "lexicon", "ssml")
        options = {k: v for k, v in asdict(self).items() if k not in skip and v is not None}
        if self.lexicon is not None:
            options["lexicon"] = self.lexicon
        if self.ssml:
            options["ssml"] = True
        if self.speed is not None and not isinstance(self.speed, str):
            if check_speed(self.speed) != 1.0:
                options["speed"] = self.speed
        return options

    def voice_name(self) -> str | None:
        """The engine voice: ``female`` with pitch high is ``female:high:moderate``.

        Raises:
            ValueError: a bad level, or levels on a voice without those controls.
        """
        level = self.speed if isinstance(self.speed, str) else None
        return voice_with_levels(self.voice, self.pitch, level)


class VeenaTTS(tts.TTS):
    """LiveKit TTS over a shared engine (``VeenaEngine``, ``EngineThread``, ``RemoteVeenaEngine``).

    Audio is int16 mono at the engine's codec rate (16 kHz BiCodec, 24 kHz SNAC), or at
    ``sample_rate`` through a low-latency stream resampler owned by each stream. Closing a stream
    aborts its engine request at once. The engine is shared: ``aclose()`` closes this TTS's
    open streams but never shuts the engine down.

    Emotion tags the checkpoint declares (e.g. ``<laugh>``) are offered to the LLM through
    LiveKit's expressive markup (``tts.markup``) and LiveKit's own sound markup is converted to
    them; everything else is spoken as text.

    Args:
        engine: the process's engine, started (or startable by ``prewarm()``).
        voice, temperature, top_k, top_p, repetition_penalty, seed, pitch, speed, lexicon, ssml:
            see ``VeenaTTSOptions``.
        sample_rate: output rate (None: the engine's rate; the engine must then be running).
        sentence_tokenizer: splits streamed text into sentences (default: LiveKit's blingfire).

    Raises:
        ValueError: no ``sample_rate`` for a stopped engine, or invalid sampling values.
        UnknownVoiceError: the running engine does not offer ``voice``.
    """

    def __init__(
        self,
        engine: SpeechEngine,
        *,
        voice: str | None = None,
        sample_rate: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        seed: int | None = None,
        pitch: str | None = None,
        speed: float | str | None = None,
        lexicon: dict[str, Any] | None = None,
        ssml: bool = False,
        sentence_tokenizer: tokenize.SentenceTokenizer | None = None,
    ) -> None:
        if sample_rate is None:
            if not engine.is_running:
                raise ValueError(
                    "VeenaTTS: the engine is not started, so its sample rate is unknown; start "
                    "it first (await engine.start() or EngineThread.launch) or pass sample_rate"
                )
            sample_rate = engine.sample_rate
        if sample_rate <= 0:
            raise ValueError(f"sample_rate must be a positive rate in Hz, got {sample_rate}")
        super().__init__(
            # Aligned: the engine times each written word (AgentSession then truncates an
            # interrupted reply at the word played when use_tts_aligned_transcript=True).
            capabilities=tts.TTSCapabilities(
                streaming=True, aligned_transcript=bool(getattr(engine, "times_words", False))
            ),
            sample_rate=sample_rate,
            num_channels=1,
        )
        self._engine = engine
        self._opts = self._checked(
            VeenaTTSOptions(
                voice,
                temperature,
                top_k,
                top_p,
                repetition_penalty,
                seed,
                pitch,
                speed,
                lexicon,
                ssml,
            )  # fmt: skip
        )
        self._tokenizer = sentence_tokenizer or tokenize.blingfire.SentenceTokenizer()
        config = getattr(engine, "config", None)  # in-process engines only
        if config is not None and not config.pin_voices:
            logger.warning(
                f"{self.label}: stream() speaks each sentence as its own engine request; with "
                "EngineConfig(pin_voices=False) a generated voice may change between sentences"
            )
        self._start_task: asyncio.Future[None] | None = None
        self._streams: weakref.WeakSet[Any] = weakref.WeakSet()

    class Markup(tts.TTS.Markup):
        """The checkpoint's emotion tags (``<laugh>``, ``<sigh>``...) as LiveKit markup."""

        def _tags(self) -> tuple[str, ...]:
            engine = self._tts.engine
            return engine.emotion_tags if engine.is_running else ()

        @property
        def info(self) -> tts.MarkupInfo:
            """The sounds this voice can make (the declared tags without brackets)."""
            return tts.MarkupInfo(nonverbals={"sound": [t.strip("<>") for t in self._tags()]})

        def llm_instructions(self, *, speech_steering: Any = None) -> str | None:
            """Tell the LLM which inline tags it may write (None when the model has none)."""
            tags = self._tags()
            if not tags:
                return None
            return (
                "You may add these non-verbal sounds inline, exactly as written and only "
                f"where natural: {', '.join(tags)}. Use no other markup."
            )

        def normalize(self, text: str) -> str:
            """Declared tags stay; nothing else changes."""
            return text

        def convert(self, text: str) -> str:
            """LiveKit's ``<sound value="laugh"/>`` (or ``[laugh]``) becomes ``<laugh>``.

            Sounds the model does not declare are dropped rather than spoken as text. A
            ``<break time="500ms"/>`` becomes an exact pause (SSML, read by ``speak``).
            """
            text = break_markup(text)
            tags = set(self._tags())

            def lower(match: re.Match[str]) -> str:
                name = (match.group(2) or match.group(3) or "").strip().lower()
                tag = f"<{name.replace(' ', '_')}>"
                return tag if tag in tags else ""

            return _TAG.sub(lower, text) if tags else text

    @property
    def model(self) -> str:
        """The model's name (the checkpoint directory's)."""
        return self._engine.model_name

    @property
    def provider(self) -> str:
        """This package (the model runs in-process)."""
        return PROVIDER

    @property
    def engine(self) -> SpeechEngine:
        """The shared engine this TTS speaks through."""
        return self._engine

    def list_voices(self) -> list[str]:
        """The voices of the engine's model (default first); the engine must be running."""
        return self._engine.voices

    @property
    def options(self) -> VeenaTTSOptions:
        """The current per-utterance settings."""
        return self._opts

    def update_options(self, **changes: Any) -> None:
        """Change voice or sampling settings for streams created from now on.

        Raises:
            TypeError: an unknown option name.
            ValueError, UnknownVoiceError: an invalid value (nothing changes).
        """
        self._opts = self._checked(replace(self._opts, **changes))

    def _checked(self, opts: VeenaTTSOptions) -> VeenaTTSOptions:
        name = opts.voice_name()  # level checks need no engine
        opts.sampling()  # nor the speed range
        if not self._engine.is_running:  # the rest is checked by the engine on the first call
            return opts
        self._engine.check_options(**opts.sampling())
        self._engine.check_voice(name)
        return replace(opts, voice=self._engine.check_voice(opts.voice))

    def prewarm(self) -> None:
        """Start the engine in the background if it is not running (needs a running loop)."""
        if self._engine.is_running or self._start_task is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            logger.warning(f"{self.label}: prewarm() needs a running event loop; not started")
            return
        self._start_task = loop.create_task(self._engine.start())

    async def _ensure_started(self) -> None:
        if self._engine.is_running:
            return
        if self._start_task is None:
            self._start_task = asyncio.ensure_future(self._engine.start())
        await asyncio.shield(self._start_task)

    def synthesize(
        self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> VeenaChunkedStream:
        """Speak ``text`` (one request); frames arrive as the engine decodes them."""
        stream = VeenaChunkedStream(tts=self, input_text=text, conn_options=conn_options)
        self._streams.add(stream)
        return stream

    def stream(
        self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> VeenaSynthesizeStream:
        """A stream that speaks pushed text sentence by sentence (one segment per stream)."""
        stream = VeenaSynthesizeStream(tts=self, conn_options=conn_options)
        self._streams.add(stream)
        return stream

    async def aclose(self) -> None:
        """Close this TTS's open streams (aborting their requests); the engine keeps running."""
        await asyncio.gather(*(s.aclose() for s in list(self._streams)))


class _Attempt:
    """One try of a stream: speaks text into the emitter and knows whether audio went out.

    Args:
        stream: the LiveKit stream this attempt belongs to.
        emitter: that attempt's audio emitter.
        retry_after_audio: whether LiveKit retries this kind of stream after partial audio.
    """

    def __init__(
        self,
        stream: VeenaChunkedStream | VeenaSynthesizeStream,
        emitter: tts.AudioEmitter,
        *,
        retry_after_audio: bool,
    ) -> None:
        stream._tries += 1
        self.tts = stream._tts
        self.opts = self.tts.options
        if stream._tries > 1 and self.opts.seed is not None:
            # the same seed would fail the same way: each retry samples with the next seed
            self.opts = replace(self.opts, seed=self.opts.seed + stream._tries - 1)
        self.emitter = emitter
        self.retry_after_audio = retry_after_audio
        self.timeout = stream._conn_options.timeout or None
        self.request_id = utils.shortuuid()
        self.pushed = False
        self.spoke = False
        self.tokens = 0
        self.prompt_tokens = 0
        self.resampler: StreamResampler | None = None
        self.seconds = 0.0  # audio of this attempt so far (word times are counted from its start)

    def _retryable(self, error: Exception) -> bool:
        if isinstance(error, _PERMANENT) or not getattr(error, "retryable", True):
            return False
        return self.retry_after_audio or not self.pushed

    async def speak(self, text: str) -> None:
        """Push the engine's audio for ``text``; engine errors become LiveKit ``APIError``s.

        The wait for each chunk (the first one included) is bounded by the connection
        timeout: an engine that stalls mid-utterance is an error, not endless silence.
        """
        engine = self.tts.engine
        waited = "first audio"
        try:
            await self.tts._ensure_started()
            if self.resampler is None:
                self.resampler = StreamResampler(engine.sample_rate, self.tts.sample_rate)
            options = self.opts.sampling()
            document = None if options.get("ssml") else markup_of_hook(text)
            if document is not None:  # LiveKit's <break> markup (Markup.convert)
                text, options["ssml"] = document, True
            stream = engine.stream(
                text, self.opts.voice_name(), request_id=self.request_id, **options
            )
            last: AudioChunk | None = None
            offset = self.seconds
            async with aclosing(stream) as chunks, asyncio.timeout(self.timeout) as deadline:
                async for last in chunks:
                    self._push(last.pcm)
                    self.seconds += last.duration
                    if last.words:  # behind their audio: each word's audio exists
                        self.emitter.push_timed_transcript(
                            [
                                TimedString(
                                    f"{w.word} ",
                                    start_time=offset + w.start,
                                    end_time=offset + w.end,
                                )
                                for w in last.words
                            ]
                        )
                    waited = "the next chunk"
                    if self.timeout is not None:
                        deadline.reschedule(asyncio.get_running_loop().time() + self.timeout)
            if last is not None:
                self.tokens += last.tokens
                self.prompt_tokens += last.prompt_tokens
                self.spoke = True
        except APIError:
            raise
        except TimeoutError as e:
            raise APITimeoutError(
                f"{self.tts.label}: no audio within {self.timeout} s ({waited}) for "
                f"{caller_text(text)}: the engine stalled",
                retryable=self._retryable(e),
            ) from e
        except EngineDeadError as e:  # the backend died; it restarts (retryable) or is gone
            raise APIConnectionError(
                f"{self.tts.label}: EngineDeadError: {e}", retryable=self._retryable(e)
            ) from e
        except Exception as e:
            raise APIError(
                f"{self.tts.label}: {type(e).__name__}: {e}",
                body=e,
                retryable=self._retryable(e),
            ) from e

    def _push(self, pcm: bytes) -> None:
        if self.resampler is not None:
            pcm = self.resampler.resample(pcm)
        if pcm:
            self.emitter.push(pcm)
            self.pushed = True

    def finish(self) -> None:
        """Push what the resampler still holds (end of the stream's audio)."""
        if self.resampler is not None:
            tail = self.resampler.flush()
            if tail:
                self.emitter.push(tail)
                self.pushed = True

    def check_spoken(self, text: str) -> None:
        """Raise a clear, final error for text with nothing speakable (emoji, punctuation)."""
        if text.strip() and not self.spoke:
            raise APIError(
                f"{self.tts.label}: nothing speakable in {caller_text(text)}; filter such text "
                "before TTS (AgentSession tts_text_transforms)",
                retryable=False,
            )


class VeenaChunkedStream(tts.ChunkedStream):
    """``VeenaTTS.synthesize()``: one engine request for the whole text."""

    _tts: VeenaTTS
    _tries = 0

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        attempt = _Attempt(self, output_emitter, retry_after_audio=CHUNKED_RETRIES_AFTER_AUDIO)
        output_emitter.initialize(
            request_id=attempt.request_id,
            sample_rate=self._tts.sample_rate,
            num_channels=1,
            mime_type="audio/pcm",
        )
        if is_speakable(self.input_text):
            await attempt.speak(self.input_text)
            attempt.finish()
        attempt.check_spoken(self.input_text)
        self._set_token_usage(input_tokens=attempt.prompt_tokens, output_tokens=attempt.tokens)


class VeenaSynthesizeStream(tts.SynthesizeStream):
    """``VeenaTTS.stream()``: pushed text is cut into sentences, each spoken as it completes.

    One segment per stream, as LiveKit 1.8 expects: the first ``flush()`` (or
    ``end_input()``) ends the text; the segment's last frame has ``is_final``.
    """

    _tts: VeenaTTS
    _tries = 0

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        attempt = _Attempt(self, output_emitter, retry_after_audio=False)
        output_emitter.initialize(
            request_id=attempt.request_id,
            sample_rate=self._tts.sample_rate,
            num_channels=1,
            mime_type="audio/pcm",
            stream=True,
        )
        output_emitter.start_segment(segment_id=utils.shortuuid())
        sentences = self._tts._tokenizer.stream()

        async def forward_text() -> None:
            async for data in self._input_ch:
                if isinstance(data, self._FlushSentinel):
                    break  # LiveKit 1.8 drops text pushed after the first flush
                sentences.push_text(data)
            sentences.end_input()

        async def speak_sentences() -> None:
            async for sentence in sentences:
                if is_speakable(sentence.token):
                    if attempt.pushed:  # release held-back audio while this sentence starts
                        output_emitter.flush()
                    self._mark_started()
                    await attempt.speak(sentence.token)
            attempt.finish()
            attempt.check_spoken(self._pushed_text)
            self._set_token_usage(input_tokens=attempt.prompt_tokens, output_tokens=attempt.tokens)
            output_emitter.end_segment()

        tasks = [asyncio.create_task(forward_text()), asyncio.create_task(speak_sentences())]
        try:
            await asyncio.gather(*tasks)
        finally:
            await sentences.aclose()
            await utils.aio.cancel_and_wait(*tasks)
