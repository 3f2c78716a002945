"""VeenaTTSService: the Pipecat TTSService over a shared, already-started engine.

The engine is anything that implements ``SpeechEngine`` (interface.py): the in-process
``VeenaEngine``, an ``EngineThread``, or a ``RemoteVeenaEngine`` speaking to a server.
"""

from __future__ import annotations

import bisect
import re
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from loguru import logger
from pipecat.frames.frames import ErrorFrame, Frame, StartFrame, TTSAudioRawFrame
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TextAggregationMode, TTSService
from pipecat.transcriptions.language import Language
from pipecat.utils.tracing.service_decorators import traced_tts
from pipecat.utils.types import NOT_GIVEN, NotGiven

from pipecat_veena import tracing
from pipecat_veena.audio import ProgressiveFramer
from pipecat_veena.engine import check_level, check_speed, voice_with_levels
from pipecat_veena.errors import EngineDeadError, EngineNotRunningError, VeenaError
from pipecat_veena.interface import SpeechEngine
from pipecat_veena.logs import log_failure
from pipecat_veena.normalize.ssml import markup_of_hook, phoneme_markup
from pipecat_veena.resample import StreamResampler
from pipecat_veena.text import is_speakable

_SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "repetition_penalty", "seed")
#: ``<speak ...>`` and ``</speak>``: with ``ssml``, dropped from each aggregated sentence.
_SPEAK_TAG = re.compile(r"</?speak\b[^<>]*>")

#: Pipecat ends an audio context that receives nothing for ``stop_frame_timeout_s`` (3 s by
#: default, made for network services). Chunks here grow, so on a busy or slow machine seconds
#: can pass between two of them: a shorter timeout would cut an utterance in two. It never
#: delays the next turn: this service yields its audio inline, so Pipecat closes each context
#: as soon as its turn's text is done (``tts_process_generator``), audio or not.
STOP_FRAME_TIMEOUT_S = 30.0


def _not_given() -> Any:
    return field(default_factory=lambda: NOT_GIVEN)


@dataclass
class VeenaTTSSettings(TTSSettings):
    """Runtime settings of VeenaTTSService (changes apply from the next utterance).

    Parameters:
        temperature: sampling temperature (None: the model family's default).
        top_k: top-k sampling (None: default; 0 disables).
        top_p: nucleus sampling mass (None: default).
        repetition_penalty: > 1 discourages loops (None: default).
        seed: sampling seed for reproducible speech (None: random).
        pitch: Spark controllable voices only: very_low, low, moderate, high or very_high.
        speed: a number from 0.5 to 2.0: playback speed, any voice (the audio is stretched
            keeping its pitch, word times scale with it; 1.0 leaves it untouched); or a Spark
            controllable voice's speed level: very_low, low, moderate, high or very_high.
        lexicon: term -> spoken form entries for this service's requests (``Lexicon`` shapes,
            at most 1000 entries and 64 KiB), laid over the engine's lexicon.
        ssml: the text is SSML (the subset in README "SSML"); text a pronunciation transform
            (``pronunciation_transform_ipa``) marked up is read as SSML either way. Each text
            Pipecat aggregates (a sentence of an LLM's reply) is one document: inline tags work
            as they are; a ``<speak>`` around the whole reply is dropped.
    """

    temperature: float | None | NotGiven = _not_given()
    top_k: int | None | NotGiven = _not_given()
    top_p: float | None | NotGiven = _not_given()
    repetition_penalty: float | None | NotGiven = _not_given()
    seed: int | None | NotGiven = _not_given()
    pitch: str | None | NotGiven = _not_given()
    speed: float | str | None | NotGiven = _not_given()
    lexicon: dict[str, Any] | None | NotGiven = _not_given()
    ssml: bool | None | NotGiven = _not_given()


class VeenaTTSService(TTSService):
    """Streaming TTS from an in-process LLM-TTS engine (Veena3 / Spark-TTS BiCodec, Veena SNAC).

    Start ONE engine per process before building pipelines (loading vLLM takes longer
    than Pipecat's 20 s setup window), then give each call's pipeline its own service over that
    engine. Audio is generated on the engine's shared LLM and codec, resampled from the codec's
    rate (16 or 24 kHz) to the pipeline's output rate with a stream resampler owned by each
    utterance, and pushed in frames that start small (fast first audio) and grow. An
    interruption cancels ``run_tts``, which aborts the LLM request at once. Text with nothing
    speakable (empty, markup only) never reaches the engine. Text arrives in sentences
    (Pipecat's default ``SENTENCE`` aggregation): an LLM-TTS model speaks whole sentences, and
    ``TOKEN`` mode is refused.

    Words: by default (``word_timestamps=True``), over an engine that times words
    (``engine.times_words``: the in-process engine, ``EngineThread``, and ``RemoteVeenaEngine``
    over a server that times them), the service reports
    every written word with its estimated start through Pipecat's word-timestamp path
    (``push_text_frames=False``, ``add_word_timestamps``). The transport then releases each
    word as its audio plays, so an interrupted turn leaves the words heard so far in the
    assistant's context, not the whole sentence nor nothing. Otherwise (``word_timestamps=False``,
    or over an engine that does not time words) the base class pushes one ``TTSTextFrame`` per
    sentence after its audio.

    Example::

        engine = VeenaEngine(EngineConfig(checkpoint=Path("Spark-TTS-0.5B")))
        await engine.start()                       # once per process
        tts = VeenaTTSService(engine, voice="female")  # once per call
    """

    Settings = VeenaTTSSettings
    _settings: Settings

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
        language: Language | str | None = None,
        normalize: bool | None = None,
        lexicon: dict[str, Any] | None = None,
        ssml: bool | None = None,
        settings: Settings | None = None,
        **kwargs: Any,
    ) -> None:
        """Create a service over a shared engine.

        Args:
            engine: the process's engine (``VeenaEngine``, ``EngineThread`` or
                ``RemoteVeenaEngine``; started now or before the pipeline starts).
            voice: a voice name of the engine's checkpoint (None: its default).
            sample_rate: output rate (None: the pipeline's ``audio_out_sample_rate``).
            temperature: sampling temperature (None: the model family's default).
            top_k: top-k sampling (None: default).
            top_p: nucleus sampling (None: default).
            repetition_penalty: repetition penalty (None: default).
            seed: sampling seed (None: random).
            pitch: pitch level of Spark controllable voices.
            speed: playback speed from 0.5 to 2.0 (pitch kept, word times scaled), or the
                speed level of Spark controllable voices (``"high"``).
            language: the language numbers, dates and codes are spoken in (``Language.HI`` or
                ``Language.EN``, any region); None: per sentence, from its script.
            normalize: speak numbers, dates, codes and symbols as words (None: the engine's
                setting). TTSTextFrames always carry the text as written.
            lexicon: this service's own term -> spoken form entries, over the engine's.
            ssml: the text is SSML (breaks, sub, say-as, phoneme, lang); default off.
            settings: a settings delta applied over these values.
            **kwargs: passed to ``TTSService`` (e.g. ``text_transforms``, ``name``).

        Raises:
            UnknownVoiceError: the (started) engine does not offer ``voice``.
            ValueError: an invalid pitch or speed level, pitch/speed on a voice without those
                controls, invalid sampling values, or ``TOKEN`` text aggregation.
        """
        if kwargs.get("text_aggregation_mode") == TextAggregationMode.TOKEN or (
            kwargs.get("aggregate_sentences") is False
        ):
            raise ValueError(
                "VeenaTTSService speaks whole sentences: an LLM-TTS prompt per LLM token would "
                "be one engine request per token with no prosody; use the default "
                "text_aggregation_mode=TextAggregationMode.SENTENCE"
            )
        defaults = self.Settings(
            model=engine.model_name,
            voice=voice,
            language=language,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            repetition_penalty=repetition_penalty,
            seed=seed,
            pitch=pitch,
            speed=speed,
            lexicon=lexicon,
            ssml=ssml,
        )
        if settings is not None:
            defaults.apply_update(settings)
        kwargs.setdefault("stop_frame_timeout_s", STOP_FRAME_TIMEOUT_S)
        # Words through Pipecat's word-timestamp path when the engine times them (on by default).
        words = kwargs.pop("word_timestamps", True) and getattr(engine, "times_words", False)
        kwargs.setdefault("push_text_frames", not words)
        self._times_words = not kwargs["push_text_frames"]  # report words, or sentences
        super().__init__(
            push_start_frame=True,
            push_stop_frames=True,
            sample_rate=sample_rate,
            settings=defaults,
            **kwargs,
        )
        self._engine = engine
        self._normalize = normalize
        self._dead_reported = False
        # Audio is always yielded inline, so Pipecat closes each context with its turn. Also
        # true of turns whose text Pipecat never hands to run_tts (a service no longer usable):
        # left False, each of them held the pipeline for stop_frame_timeout_s (30 s).
        self._is_yielding_frames_synchronously = True
        # Each open context's audio so far: word times are cumulative within a turn.
        self._timelines: dict[str, _Timeline] = {}
        self._check_settings()
        # Runs after any user transforms: unspeakable text then never opens an audio context.
        self.add_text_transformer(_drop_unspeakable, "*")

    def can_generate_metrics(self) -> bool:
        """TTFB, TTFA, processing and usage metrics are supported."""
        return True

    def language_to_service_language(self, language: Language) -> str | None:
        """The text normaliser's language for ``language``: "hi", "en", or None (other codes).

        The models read Hindi, English and code-mixed text as written; the language only picks
        the words numbers, dates and codes are spoken in (None: per sentence, from its script).
        """
        code = str(language).lower()
        return next((lang for lang in ("hi", "en") if code.split("-")[0] == lang), None)

    @property
    def engine(self) -> SpeechEngine:
        """The shared engine this service speaks through."""
        return self._engine

    async def start(self, frame: StartFrame) -> None:
        """Check that the shared engine is running and the voice exists."""
        await super().start(frame)
        if not self._engine.is_running:
            await self._report_dead(
                EngineNotRunningError(
                    f"{self}: the VeenaEngine is not running; start it once per process "
                    "(await engine.start()) before running pipelines"
                )
            )
            return
        try:
            self._check_settings()
        except ValueError as e:  # UnknownVoiceError included
            await self.push_error(f"{self}: {e}", exception=e)

    def _check_settings(self) -> None:
        """Raise ValueError naming the problem when the settings cannot work.

        Levels and their combination with the voice are checked always; the voice name and the
        sampling values once the engine is running (they depend on the loaded model).
        """
        check_level("pitch", self._settings.pitch)
        level = self._settings.speed
        if isinstance(level, str):
            check_level("speed", level)
        elif level is not None:
            check_speed(level)
        name = self._voice_name()
        if self._engine.is_running:
            self._settings.voice = self._engine.check_voice(self._settings.voice)
            self._engine.check_voice(name)
            self._engine.check_options(**self._sampling(), speed=self._speed(), **self._markup())

    async def _update_settings(self, delta: Settings) -> dict[str, Any]:
        """Apply a settings delta; anything that cannot work is an error and changes nothing.

        Voice, pitch, speed and sampling values are checked together; on failure every one of
        them keeps its previous value and an ErrorFrame says what was wrong.
        """
        checked = ("voice", "pitch", "speed", "lexicon", "ssml", *_SAMPLING_FIELDS)
        previous = {k: getattr(self._settings, k) for k in checked}
        changed = await super()._update_settings(delta)
        try:
            self._check_settings()
        except ValueError as e:
            for key, value in previous.items():
                setattr(self._settings, key, value)
            await self.push_error(f"{self}: settings update rejected: {e}", exception=e)
            return {k: v for k, v in changed.items() if k not in previous}
        self._warn_unhandled_updated_settings(set(changed) - set(checked))
        return changed

    def _voice_name(self) -> str | None:
        """The engine voice: a controllable gender gets the pitch/speed levels appended."""
        level = self._settings.speed if isinstance(self._settings.speed, str) else None
        return voice_with_levels(self._settings.voice, self._settings.pitch, level)

    def _speed(self) -> float | None:
        """The playback speed (None: a Spark speed level, or none set)."""
        speed = self._settings.speed
        return None if isinstance(speed, str) else speed

    def _markup(self) -> dict[str, Any]:
        """The lexicon and SSML options set (none when unset)."""
        markup = {}
        if self._settings.lexicon is not None:
            markup["lexicon"] = self._settings.lexicon
        if self._settings.ssml:
            markup["ssml"] = True
        return markup

    @classmethod
    def format_pronunciation(cls, word: str, ipa: str) -> str | None:
        """Pipecat's pronunciation hook: ``word`` said as ``ipa`` says, through SSML ``<phoneme>``.

        The IPA becomes a respelling the model reads (Latin or Devanagari, the word's script);
        None where a symbol has none (Pipecat then speaks the word as written and says so once).
        Text holding these tags is read as SSML even with ``ssml`` off; the rest of it stays
        data (escaped). Word timings report the word as written.
        """
        return phoneme_markup(word, ipa)

    def _sampling(self) -> dict[str, Any]:
        return {name: getattr(self._settings, name) for name in _SAMPLING_FIELDS}

    def _options(self) -> dict[str, Any]:
        """Everything ``engine.stream`` takes besides text and voice."""
        language = self._settings.language
        options = {
            **self._sampling(),
            "language": language if language in ("hi", "en") else "auto",
        }
        if self._speed() not in (None, 1, 1.0):
            options["speed"] = self._speed()
        if self._normalize is not None:
            options["normalize"] = self._normalize
        options.update(self._markup())
        return options

    async def tts_process_generator(
        self, context_id: str, generator: AsyncGenerator[Frame | None, None]
    ) -> None:
        """Route ``run_tts`` frames into the audio context, which closes with its turn.

        Pipecat 1.14 closes a context at the end of its turn only when the last ``run_tts``
        yielded audio, and otherwise waits ``stop_frame_timeout_s`` for more: after a failed
        sentence every later turn would wait that long. This service always yields its audio
        inline (never ``None``), so every context is closed with its turn, audio or not.
        """
        await super().tts_process_generator(context_id, generator)
        self._is_yielding_frames_synchronously = True

    @traced_tts
    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Speak one aggregated text (usually a sentence) as audio frames of ``context_id``.

        Traced as Pipecat's own TTS services are (``PipelineTask(enable_tracing=True)``): the
        turn's ``tts`` span, with the engine's ``veena.utterance`` spans (or, over
        ``RemoteVeenaEngine``, the server's) as its children.

        Args:
            text: the text to speak.
            context_id: the Pipecat audio context (one per turn).

        Yields:
            Frame: TTSAudioRawFrame at ``self.sample_rate``, or an ErrorFrame on failure.
        """
        await self.start_tts_usage_metrics(text)
        resampler = StreamResampler(self._engine.sample_rate, self.sample_rate)
        framer = ProgressiveFramer(self.sample_rate)
        spoke = False
        timeline = self._timelines.setdefault(context_id, _Timeline())
        offset = timeline.seconds  # where this utterance starts in its context's audio
        options = self._options()
        document = None if options.get("ssml") else markup_of_hook(text)
        if document is not None:  # the pronunciation hook's tags (format_pronunciation)
            text, options["ssml"] = document, True
        elif options.get("ssml"):  # Pipecat cuts an LLM's reply into sentences: each is a
            text = _SPEAK_TAG.sub(" ", text)  # document, a <speak> around the reply dropped
        try:
            stream = tracing.traced(
                self._tts_span(context_id),
                self._engine.stream(text, self._voice_name(), request_id=context_id, **options),
            )
            async with aclosing(stream) as chunks:
                async for chunk in chunks:
                    for piece in framer.split(resampler.resample(chunk.pcm)):
                        spoke = True
                        timeline.add(len(piece) / (2 * self.sample_rate))
                        yield TTSAudioRawFrame(piece, self.sample_rate, 1, context_id=context_id)
                    if chunk.words and self._times_words:
                        # Queued behind the audio just yielded: each word's audio exists.
                        await self.add_word_timestamps(
                            [(w.word, timeline.at(offset + w.start)) for w in chunk.words],
                            context_id,
                        )
            tail = resampler.flush()
            if tail:
                timeline.add(len(tail) / (2 * self.sample_rate))
                yield TTSAudioRawFrame(tail, self.sample_rate, 1, context_id=context_id)
        except EngineDeadError as e:
            if not e.retryable:  # the engine gave up restarting its backend
                await self._report_dead(e)
                return
            # the engine restarts its backend: this sentence is lost, the next turns speak
            logger.warning(f"{self}: {e}")
            yield ErrorFrame(error=f"{self}: {e}", exception=e)
        except EngineNotRunningError as e:
            await self._report_dead(e)
        except VeenaError as e:
            logger.warning(f"{self}: {e}")
            yield ErrorFrame(error=f"{self}: {e}", exception=e)
        except ValueError as e:  # a request the engine refused (it names the problem)
            logger.warning(f"{self}: request refused: {e}")
            yield ErrorFrame(error=f"{self}: request refused: {e}", exception=e)
        except Exception as e:  # never let one utterance take the pipeline down
            log_failure(f"{self}: unexpected error", e)  # no variables: they hold the key
            yield ErrorFrame(error=f"{self}: unexpected TTS error: {e}", exception=e)
        finally:
            # Time to first byte is only meaningful for an utterance that produced audio.
            if spoke:
                await self.stop_ttfb_metrics()
            else:
                await self.cancel_ttfb_metrics()

    def _tts_span(self, context_id: str) -> Any:
        """Pipecat's open ``tts`` span of ``context_id`` (``@traced_tts``), or None."""
        if not self._tracing_enabled:
            return None
        return tracing.pipecat_tts_span(self, context_id)  # Pipecat's private state, guarded

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Abort the engine requests of an interrupted context.

        Belt and braces: the base also cancels ``run_tts``, which aborts them.
        """
        self._timelines.pop(context_id, None)
        aborted = await self._engine.abort(context_id)
        if aborted:
            logger.debug(f"{self}: aborted {aborted} engine request(s) of {context_id}")

    async def on_audio_context_completed(self, context_id: str) -> None:
        """Forget a finished context's audio length (word times restart with the next)."""
        self._timelines.pop(context_id, None)
        await super().on_audio_context_completed(context_id)

    async def _report_dead(self, error: Exception) -> None:
        """Report an engine that cannot serve as a permanent error, once."""
        if self._dead_reported:
            return
        self._dead_reported = True
        logger.error(f"{self}: {error}")
        await self.push_error(str(error), exception=error, force_treat_as_permanent=True)


class _Timeline:
    """One context's audio as the transport plays it: its length and where playback stalled.

    Pipecat times a word from the moment the context's first audio left the service, plus the
    word's time in the audio. A transport plays audio as it arrives, so when generation falls
    behind real time (a loaded machine) its buffer runs dry and later audio plays late by the
    time it waited: words in that audio are shifted by the same amount, so that none is
    released before it plays.
    """

    def __init__(self) -> None:
        self.seconds = 0.0  # audio yielded so far
        self._first: float | None = None  # when the first audio was yielded
        self._stalls: list[tuple[float, float]] = [(0.0, 0.0)]  # (audio second, delay from it)

    def add(self, seconds: float) -> None:
        """Note audio about to be yielded (``seconds`` long)."""
        now = time.monotonic()
        if self._first is None:
            self._first = now
        else:
            delay = now - self._first - self.seconds  # > 0: the transport ran dry
            if delay > self._stalls[-1][1]:
                self._stalls.append((self.seconds, delay))
        self.seconds += seconds

    def at(self, t: float) -> float:
        """The time to report for second ``t`` of the audio: ``t`` plus the stalls before it."""
        i = bisect.bisect_right(self._stalls, t, key=lambda stall: stall[0]) - 1
        return t + self._stalls[max(i, 0)][1]


async def _drop_unspeakable(text: str, text_type: str) -> str:
    """Text transform: nothing speakable (markup, tags, punctuation) becomes empty."""
    return text if is_speakable(text) else ""
