"""VeenaTTSService: the Pipecat TTSService over a shared, already-started SpeechEngine.

The engine is a ``VeenaEngine`` in this process, or a ``RemoteVeenaEngine`` speaking to a
``pipecat-veena serve`` server: the service sees only the ``SpeechEngine`` interface.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from loguru import logger
from pipecat.audio.utils import create_stream_resampler
from pipecat.frames.frames import ErrorFrame, Frame, StartFrame, TTSAudioRawFrame
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TTSService
from pipecat.transcriptions.language import Language
from pipecat.utils.types import NOT_GIVEN, NotGiven

from pipecat_veena.audio import ProgressiveFramer
from pipecat_veena.errors import (
    EngineDeadError,
    EngineNotRunningError,
    UnknownVoiceError,
    VeenaError,
)
from pipecat_veena.interface import SpeechEngine
from pipecat_veena.prompts import GENDERS, LEVELS
from pipecat_veena.text import is_speakable

_SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "repetition_penalty", "seed")

#: Pipecat ends an audio context that receives nothing for ``stop_frame_timeout_s`` (3 s by
#: default, made for network services). Chunks here grow, so on a busy or slow machine seconds
#: can pass between two of them; ``run_tts`` returning is what ends a context of this service.
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
        speed: Spark controllable voices only: very_low, low, moderate, high or very_high.
    """

    temperature: float | None | NotGiven = _not_given()
    top_k: int | None | NotGiven = _not_given()
    top_p: float | None | NotGiven = _not_given()
    repetition_penalty: float | None | NotGiven = _not_given()
    seed: int | None | NotGiven = _not_given()
    pitch: str | None | NotGiven = _not_given()
    speed: str | None | NotGiven = _not_given()


class VeenaTTSService(TTSService):
    """Streaming TTS from an in-process LLM-TTS engine (Veena3 / Spark-TTS BiCodec, Veena SNAC).

    Start ONE ``VeenaEngine`` per process before building pipelines (loading vLLM takes longer
    than Pipecat's 20 s setup window), then give each call's pipeline its own service over that
    engine. Audio is generated on the engine's shared LLM and codec, resampled from the codec's
    rate (16 or 24 kHz) to the pipeline's output rate with a stream resampler owned by each
    utterance, and pushed in frames that start small (fast first audio) and grow. An
    interruption cancels ``run_tts``, which aborts the LLM request at once. Text with nothing
    speakable (empty, markup only) never reaches the engine.

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
        speed: str | None = None,
        settings: Settings | None = None,
        **kwargs: Any,
    ) -> None:
        """Create a service over a shared engine.

        Args:
            engine: the process's engine, started now or before the pipeline starts: a
                ``VeenaEngine`` or a ``RemoteVeenaEngine`` (any ``SpeechEngine``).
            voice: a voice name of the engine's checkpoint (None: its default).
            sample_rate: output rate (None: the pipeline's ``audio_out_sample_rate``).
            temperature: sampling temperature (None: the model family's default).
            top_k: top-k sampling (None: default).
            top_p: nucleus sampling (None: default).
            repetition_penalty: repetition penalty (None: default).
            seed: sampling seed (None: random).
            pitch: pitch level of Spark controllable voices.
            speed: speed level of Spark controllable voices.
            settings: a settings delta applied over these values.
            **kwargs: passed to ``TTSService`` (e.g. ``text_transforms``, ``name``).

        Raises:
            UnknownVoiceError: the (started) engine does not offer ``voice``.
            ValueError: an invalid pitch or speed level.
        """
        defaults = self.Settings(
            model=engine.model_name,
            voice=voice,
            language=None,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            repetition_penalty=repetition_penalty,
            seed=seed,
            pitch=pitch,
            speed=speed,
        )
        if settings is not None:
            defaults.apply_update(settings)
        kwargs.setdefault("stop_frame_timeout_s", STOP_FRAME_TIMEOUT_S)
        super().__init__(
            push_start_frame=True,
            push_stop_frames=True,
            sample_rate=sample_rate,
            settings=defaults,
            **kwargs,
        )
        self._engine = engine
        self._dead_reported = False
        _check_level("pitch", self._settings.pitch)
        _check_level("speed", self._settings.speed)
        if engine.is_running:
            self._settings.voice = engine.check_voice(self._settings.voice)
        # Runs after any user transforms: unspeakable text then never opens an audio context.
        self.add_text_transformer(_drop_unspeakable, "*")

    def can_generate_metrics(self) -> bool:
        """TTFB, TTFA, processing and usage metrics are supported."""
        return True

    def language_to_service_language(self, language: Language) -> str | None:
        """The models read Hindi, English and code-mixed text as written: no language switch."""
        return None

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
                    f"{self}: the engine is not running; start it once per process "
                    "(await engine.start()) before running pipelines"
                )
            )
            return
        try:
            self._settings.voice = self._engine.check_voice(self._settings.voice)
        except UnknownVoiceError as e:
            await self.push_error(str(e), exception=e)

    async def _update_settings(self, delta: Settings) -> dict[str, Any]:
        """Apply a settings delta; an unknown voice or level is an error and changes nothing."""
        previous = {k: getattr(self._settings, k) for k in ("voice", "pitch", "speed")}
        changed = await super()._update_settings(delta)
        try:
            if "voice" in changed:
                self._settings.voice = self._engine.check_voice(self._settings.voice)
            _check_level("pitch", self._settings.pitch)
            _check_level("speed", self._settings.speed)
        except (UnknownVoiceError, ValueError) as e:
            for key, value in previous.items():
                setattr(self._settings, key, value)
            await self.push_error(f"{self}: settings update rejected: {e}", exception=e)
            return {k: v for k, v in changed.items() if k not in previous}
        unhandled = set(changed) - {"voice", "pitch", "speed", *_SAMPLING_FIELDS}
        self._warn_unhandled_updated_settings(unhandled)
        return changed

    def _voice_name(self) -> str | None:
        """The engine voice: a controllable gender gets the pitch/speed levels appended."""
        voice = self._settings.voice
        pitch, speed = self._settings.pitch, self._settings.speed
        if voice in GENDERS and (pitch or speed):
            return f"{voice}:{pitch or 'moderate'}:{speed or 'moderate'}"
        return voice

    def _sampling(self) -> dict[str, Any]:
        return {name: getattr(self._settings, name) for name in _SAMPLING_FIELDS}

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Speak one aggregated text (usually a sentence) as audio frames of ``context_id``.

        Args:
            text: the text to speak.
            context_id: the Pipecat audio context (one per turn).

        Yields:
            Frame: TTSAudioRawFrame at ``self.sample_rate``, or an ErrorFrame on failure.
        """
        await self.start_tts_usage_metrics(text)
        resampler = create_stream_resampler(clear_after_secs=None)
        framer = ProgressiveFramer(self.sample_rate)
        in_rate = self._engine.sample_rate
        try:
            stream = self._engine.stream(
                text, self._voice_name(), request_id=context_id, **self._sampling()
            )
            async with aclosing(stream) as chunks:
                async for chunk in chunks:
                    pcm = chunk.pcm
                    if in_rate != self.sample_rate:
                        pcm = await resampler.resample(pcm, in_rate, self.sample_rate)
                    for piece in framer.split(pcm):
                        yield TTSAudioRawFrame(piece, self.sample_rate, 1, context_id=context_id)
            tail = await resampler.flush() if in_rate != self.sample_rate else b""
            if tail:
                yield TTSAudioRawFrame(tail, self.sample_rate, 1, context_id=context_id)
        except (EngineDeadError, EngineNotRunningError) as e:
            await self._report_dead(e)
        except VeenaError as e:
            logger.warning(f"{self}: {e}")
            yield ErrorFrame(error=f"{self}: {e}", exception=e)
        except ValueError as e:  # bad sampling values from settings
            yield ErrorFrame(error=f"{self}: invalid TTS settings: {e}", exception=e)
        except Exception as e:  # never let one utterance take the pipeline down
            logger.exception(f"{self}: unexpected error: {e}")
            yield ErrorFrame(error=f"{self}: unexpected TTS error: {e}", exception=e)
        finally:
            await self.stop_ttfb_metrics()

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Abort the engine requests of an interrupted context.

        Belt and braces: the base also cancels ``run_tts``, which aborts them.
        """
        aborted = await self._engine.abort(context_id)
        if aborted:
            logger.debug(f"{self}: aborted {aborted} engine request(s) of {context_id}")

    async def _report_dead(self, error: Exception) -> None:
        """Report an engine that cannot serve as a permanent error, once."""
        if self._dead_reported:
            return
        self._dead_reported = True
        logger.error(f"{self}: {error}")
        await self.push_error(str(error), exception=error, force_treat_as_permanent=True)


async def _drop_unspeakable(text: str, text_type: str) -> str:
    """Text transform: nothing speakable (markup, tags, punctuation) becomes empty."""
    return text if is_speakable(text) else ""


def _check_level(name: str, value: Any) -> None:
    if value is not None and value not in LEVELS:
        raise ValueError(f"{name} must be one of {', '.join(LEVELS)}, got {value!r}")
