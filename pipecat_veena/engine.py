"""VeenaEngine: one shared, in-process engine turning text into streamed audio chunks.

Flow of one request: text -> parts (sentences within a length budget) -> prompt ids -> vLLM
tokens -> parser (globals / semantics, or SNAC codes) -> StreamDecoder windows -> DecodeBatcher
(codec on a worker thread, batched across streams) -> int16 PCM chunks at the codec's rate.
All state is per request. The engine knows nothing of Pipecat: the service, the CLI and the
LiveKit plugin all sit on top of ``stream()``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from loguru import logger

from pipecat_veena.audio import BYTES_PER_SAMPLE, to_pcm_bytes
from pipecat_veena.checkpoint import detect_layout
from pipecat_veena.codecs.base import AudioCodec
from pipecat_veena.errors import EngineNotRunningError, NoAudioError
from pipecat_veena.formats import ModelFormat, VoicePrint, load_format, load_tokenizer
from pipecat_veena.generation import SamplingOptions, TokenGenerator
from pipecat_veena.guards import RepetitionGuard
from pipecat_veena.streaming import StreamConfig, StreamDecoder, should_hurry
from pipecat_veena.text import DEFAULT_MAX_PART_CHARS, split_text

#: A code stream periodic over this many seconds is a loop; periods up to LOOP_PERIOD_S count.
LOOP_WINDOW_S = 3.0
LOOP_PERIOD_S = 0.5
_SAMPLING_KEYS = {f.name for f in fields(SamplingOptions)} - {"stop_token_ids", "min_tokens"}


@dataclass(frozen=True)
class EngineConfig:
    """Load-time settings of a VeenaEngine.

    Parameters:
        checkpoint: checkpoint directory (Spark-TTS-0.5B layout ``LLM/`` + ``BiCodec/``, Veena3,
            or Veena: LLM + SNAC directory); the layout is detected.
        device: codec device, "auto" (CUDA when available), "cpu" or "cuda[:n]".
        codec_dtype: codec dtype name ("float32", "bfloat16", "float16"); None: fp32 on CPU,
            fp16 on CUDA.
        stream: sliding-window settings; None: the measured defaults for the codec.
        calibrate_seams_db: when set, measure at start the smallest lookahead whose seams reach
            this SNR against an offline decode on the LOADED codec weights (seconds on CPU,
            milliseconds on GPU), and use it; see ``pipecat-veena calibrate``.
        max_part_chars: long text is split into parts of at most this many characters (None:
            the checkpoint's ``max_part_chars`` from voices.json, else 220).
        pin_voices: reuse each voice's first generated globals for every later utterance of
            that voice (no drift between sentences, and fewer tokens before first audio).
        max_num_seqs: most concurrent generation requests in vLLM.
        max_model_len: longest prompt plus generation.
        decode_max_batch: most windows decoded in one codec call.
        decode_max_wait_ms: how long a window may wait for others to batch with.
        min_buffer_s: when the audio emitted ahead of real time falls below this, whatever is
            ready is decoded at once instead of waiting for the next (growing) chunk: playback
            stays gapless even when the LLM runs at less than twice real time.
        warmup: run one short utterance at start so the first call is not slow.
        log_requests: log each request at info level.
        generator_kwargs: further VllmGenerator arguments (dtype, kv_cache_memory_bytes, ...).
    """

    checkpoint: Path
    device: str = "auto"
    codec_dtype: str | None = None
    stream: StreamConfig | None = None
    calibrate_seams_db: float | None = None
    max_part_chars: int | None = None
    pin_voices: bool = True
    max_num_seqs: int = 64
    max_model_len: int = 4096
    decode_max_batch: int = 16
    decode_max_wait_ms: float = 2.0
    min_buffer_s: float = 0.3
    warmup: bool = True
    log_requests: bool = False
    generator_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AudioChunk:
    """A piece of one utterance's audio.

    Attributes:
        pcm: mono little-endian int16 samples.
        sample_rate: their rate (the codec's: 16 kHz BiCodec, 24 kHz SNAC).
        tokens: LLM tokens generated in the request up to this chunk.
    """

    pcm: bytes
    sample_rate: int
    tokens: int

    @property
    def num_samples(self) -> int:
        """Samples in the chunk."""
        return len(self.pcm) // BYTES_PER_SAMPLE

    @property
    def duration(self) -> float:
        """Seconds of audio in the chunk."""
        return self.num_samples / self.sample_rate


class VeenaEngine:
    """Text to streamed audio, shared by every call of a process.

    Start it once (``await engine.start()``, seconds to minutes) before serving; it is bound to
    the event loop it started in (a vLLM rule). ``stream()`` may run concurrently from many tasks.

    Args:
        config: the load-time settings.
        generator: an already-built token generator to use instead of loading one from the
            checkpoint (it is then not shut down by this engine).
        codec: an already-loaded codec to use instead of loading the checkpoint's.
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        generator: TokenGenerator | None = None,
        codec: AudioCodec | None = None,
    ) -> None:
        self.config = config
        self._generator = generator
        self._owns_generator = generator is None
        self._codec = codec
        self._format: ModelFormat | None = None
        self._batcher: Any = None
        self._stream_config: StreamConfig | None = None
        self._pinned: dict[str, VoicePrint] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running = False
        self._inflight: dict[str, _Request] = {}
        self._requests = 0

    def __str__(self) -> str:
        return f"VeenaEngine({Path(self.config.checkpoint).name})"

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Load tokenizer, codec and LLM, then warm up; idempotent."""
        if self._running:
            return
        from pipecat_veena.codecs.batching import DecodeBatcher

        cfg = self.config
        layout = detect_layout(cfg.checkpoint)
        if self._codec is None:
            self._codec = await asyncio.to_thread(load_codec, layout, cfg)
        tokenizer = await asyncio.to_thread(load_tokenizer, layout.llm_dir)
        self._format = load_format(layout, tokenizer, self._codec.condition_size)
        self._stream_config = cfg.stream or StreamConfig.for_codec(self._codec)
        if cfg.calibrate_seams_db is not None:
            from pipecat_veena.calibrate import calibrate_lookahead

            self._stream_config = await asyncio.to_thread(
                calibrate_lookahead, self._codec, cfg.calibrate_seams_db, self._stream_config
            )
            logger.info(
                f"{self}: lookahead {self._stream_config.lookahead_frames} frames reaches "
                f"{cfg.calibrate_seams_db} dB seams on these weights"
            )
        if self._generator is None:
            from pipecat_veena.generation.vllm_local import VllmGenerator

            self._generator = VllmGenerator(
                layout.llm_dir,
                max_model_len=cfg.max_model_len,
                max_num_seqs=cfg.max_num_seqs,
                **cfg.generator_kwargs,
            )
        await self._generator.start()
        self._batcher = DecodeBatcher(
            self._codec, max_batch=cfg.decode_max_batch, max_wait_ms=cfg.decode_max_wait_ms
        )
        self._loop = asyncio.get_running_loop()
        self._running = True
        logger.debug(f"{self}: started ({layout.family}, {self._codec.sample_rate} Hz)")
        if cfg.warmup:
            async for _ in self.stream("Hello.", request_id="warmup"):
                pass

    async def shutdown(self) -> None:
        """Stop serving and release the LLM (when owned) and the decode thread; idempotent."""
        self._running = False
        batcher, self._batcher = getattr(self, "_batcher", None), None
        if batcher is not None:
            await batcher.close()
        generator = getattr(self, "_generator", None)
        if generator is not None and self._owns_generator:
            await generator.shutdown()
        logger.debug(f"{self}: shut down")

    async def __aenter__(self) -> VeenaEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # -- introspection ---------------------------------------------------------------------
    @property
    def is_running(self) -> bool:
        """True between ``start()`` and ``shutdown()`` while the LLM backend is healthy."""
        return self._running and self._generator is not None and self._generator.is_running

    @property
    def voices(self) -> list[str]:
        """Voice names of the loaded checkpoint (default first)."""
        return self._require_format().voices.names

    @property
    def default_voice(self) -> str:
        """The voice used when a request names none."""
        return self._require_format().voices.default

    @property
    def sample_rate(self) -> int:
        """Sample rate of the emitted audio (the codec's)."""
        if self._codec is None:
            raise EngineNotRunningError(f"{self}: call start() first")
        return self._codec.sample_rate

    @property
    def family(self) -> str:
        """The checkpoint family: "bicodec" or "snac"."""
        return self._require_format().family

    def check_voice(self, voice: str | None) -> str:
        """Canonical name of ``voice``; raises UnknownVoiceError listing the valid ones."""
        return self._require_format().voices.resolve(voice).name

    def register_voice(self, name: str, global_codes: list[int]) -> None:
        """Add a BiCodec voice given by its 32 global codes (a cloned or pinned voice)."""
        fmt = self._require_format()
        if fmt.family != "bicodec":
            raise ValueError("only BiCodec checkpoints take voices given by global codes")
        fmt.voices.register(name, global_codes)

    def stats(self) -> dict[str, Any]:
        """Live counters: active streams, vLLM's unfinished requests, decode batching."""
        batch = self._batcher.stats() if self._batcher is not None else {}
        return {
            "active_streams": len(self._inflight),
            "unfinished_requests": self._generator.num_unfinished() if self._generator else 0,
            "decode_batch_mean": batch.get("mean_batch_size", 0.0),
            "decode_batches": batch.get("batches", 0),
            "requests": self._requests,
            "pinned_voices": sorted(self._pinned),
        }

    def _require_format(self) -> ModelFormat:
        if self._format is None:
            raise EngineNotRunningError(f"{self}: call start() first")
        return self._format

    def _check_running(self) -> None:
        if not self._running:
            raise EngineNotRunningError(f"{self} is not running: await engine.start() first")
        if asyncio.get_running_loop() is not self._loop:
            raise EngineNotRunningError(
                f"{self} was started in another event loop; vLLM engines are bound to their "
                "loop: start the engine in the loop that serves the calls"
            )
        if not self._generator.is_running:
            from pipecat_veena.errors import EngineDeadError

            raise EngineDeadError(f"{self}: the LLM backend is not running (it died or stopped)")

    def sampling(self, **overrides: Any) -> SamplingOptions:
        """The family's default sampling with ``overrides`` (None values are ignored).

        Raises:
            ValueError: an unknown option or an invalid value.
        """
        unknown = set(overrides) - _SAMPLING_KEYS
        if unknown:
            raise ValueError(
                f"unknown sampling option(s) {sorted(unknown)}; valid: {sorted(_SAMPLING_KEYS)}"
            )
        given = {k: v for k, v in overrides.items() if v is not None}
        return replace(self._require_format().default_sampling, **given)

    # -- streaming -------------------------------------------------------------------------
    async def stream(
        self, text: str, voice: str | None = None, *, request_id: str | None = None, **sampling
    ) -> AsyncIterator[AudioChunk]:
        """Speak ``text``: yields int16 PCM chunks at the codec's rate as they are decoded.

        Text with nothing speakable yields nothing. Closing or cancelling the iterator aborts
        the LLM request at once.

        Args:
            text: what to say (any length: long text is split into parts, one voice throughout).
            voice: a name from ``voices`` (None: the default).
            request_id: prefix of the LLM request ids (e.g. the Pipecat context id).
            **sampling: temperature, top_k, top_p, repetition_penalty, max_tokens, seed.

        Raises:
            UnknownVoiceError, ValueError: bad voice or sampling option (before any work).
            MalformedStreamError: the model broke the codec grammar.
            NoAudioError: speakable text produced no audio.
            EngineNotRunningError, EngineDeadError: the engine cannot serve.
        """
        self._check_running()
        fmt = self._require_format()
        voice_obj = fmt.voices.resolve(voice)
        max_tokens = sampling.pop("max_tokens", None)
        options = self.sampling(**sampling)
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        parts = split_text(
            fmt.clean_text(text),  # injected control strings must not shape the parts either
            self.config.max_part_chars or fmt.voices.max_part_chars or DEFAULT_MAX_PART_CHARS,
        )
        if not parts:
            logger.debug(f"{self}: nothing speakable in {text!r}")
            return
        rid = f"{request_id or 'tts'}-{uuid.uuid4().hex[:12]}"
        request = _Request(self, fmt, rid, voice_obj, options, max_tokens)
        self._inflight[rid] = request
        self._requests += 1
        try:
            async with aclosing(request.run(parts)) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            del self._inflight[rid]

    async def abort(self, request_id: str) -> int:
        """Stop every in-flight stream started with ``request_id``; returns how many.

        Their LLM requests are aborted at once and their iterators end without error. Closing
        or cancelling a ``stream()`` iterator does the same for that one stream.
        """
        hits = [r for rid, r in self._inflight.items() if rid.startswith(f"{request_id}-")]
        for request in hits:
            await request.abort()
        return len(hits)


def load_codec(layout: Any, cfg: EngineConfig) -> AudioCodec:
    """Load the checkpoint's codec (blocking: runs in a worker thread)."""
    import torch

    device = cfg.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, cfg.codec_dtype) if cfg.codec_dtype else None
    if layout.family == "bicodec":
        from pipecat_veena.codecs.bicodec import BiCodecCodec

        return BiCodecCodec.from_pretrained(layout.codec_dir, device=device, dtype=dtype)
    from pipecat_veena.codecs.snac import SnacCodec

    return SnacCodec.from_pretrained(layout.codec_dir, device=device, dtype=dtype)


class _Request:
    """State of one ``stream()`` call: parts, voice, decoder, counters."""

    def __init__(
        self,
        engine: VeenaEngine,
        fmt: ModelFormat,
        rid: str,
        voice: Any,
        options: SamplingOptions,
        max_tokens: int | None,
    ) -> None:
        self.engine = engine
        self.max_tokens = max_tokens
        self.fmt = fmt
        self.rid = rid
        self.voice = voice
        self.options = options
        codec = engine._codec
        self.codec = codec
        self.rate = codec.frame_rate * codec.codes_per_frame  # LLM codec tokens per second
        self.decoder: StreamDecoder | None = None
        self.pinned = engine._pinned.get(voice.name) if engine.config.pin_voices else None
        self.tokens = 0
        self.samples = 0
        self.aborted = False
        self.first_audio_at: float | None = None
        self.first_code_at = 0.0
        self.last_decode_s = 0.0
        self.llm_request_id: str | None = None
        self.started = time.perf_counter()
        per_second = codec.frame_rate * codec.codes_per_frame
        self.guard = RepetitionGuard(
            window=round(LOOP_WINDOW_S * per_second),
            max_period=round(LOOP_PERIOD_S * per_second),
        )

    async def run(self, parts: list[str]) -> AsyncIterator[AudioChunk]:
        engine = self.engine
        if engine.config.log_requests:
            logger.info(f"{engine}: {self.rid} voice={self.voice.name} parts={len(parts)}")
        for index, part in enumerate(parts):
            async with aclosing(self._run_part(index, part)) as chunks:
                async for chunk in chunks:
                    yield chunk
            if self.guard.tripped or self.aborted:
                break
        if self.aborted:
            logger.debug(f"{engine}: {self.rid} aborted")
            return
        if self.decoder is not None:
            for job in self.decoder.plan_finish():
                chunk = await self._decode(job)
                if chunk is not None:
                    yield chunk
        if self.samples == 0:
            raise NoAudioError(
                f"{self.rid}: the model produced no audio for speakable text {parts[0][:60]!r}"
            )
        logger.debug(
            f"{engine}: {self.rid} done: {self.tokens} tokens, "
            f"{self.samples / self.codec.sample_rate:.2f} s audio in "
            f"{time.perf_counter() - self.started:.2f} s"
        )

    async def _run_part(self, index: int, text: str) -> AsyncIterator[AudioChunk]:
        fmt = self.fmt
        prefilled = self.pinned is not None or self.voice.globals is not None
        prompt = fmt.prompt(text, self.voice, self.pinned)
        options = fmt.options(self.options, text, prefilled=prefilled, rate=self.rate)
        room = self.engine.config.max_model_len - len(prompt)
        cap = min(options.max_tokens, room, self.max_tokens or room)
        options = replace(
            options,
            max_tokens=cap,
            min_tokens=min(options.min_tokens, cap),
            seed=None if options.seed is None else options.seed + index,
        )
        parser = fmt.parser(prefilled=prefilled)
        generator = self.engine._generator
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
            logger.warning(
                f"{self.rid}: part {index} hit the runaway cap ({options.max_tokens} tokens) "
                "for its text length; stopped it"
            )

    def _plan(self, delta: Any, parser: Any) -> list[Any]:
        """Parse one delta of generated ids and plan the decodes it makes due."""
        self.tokens += len(delta.token_ids)
        codes = parser.feed(delta.token_ids)
        if self.decoder is None and self._voice_ready(parser):
            self.decoder = StreamDecoder(
                self.codec, self.engine._stream_config, condition=self._condition(parser)
            )
        if not codes:
            return []
        if not self.first_code_at:
            self.first_code_at = time.monotonic()
        if self.guard.feed(codes):
            logger.warning(
                f"{self.rid}: generation is looping (period {self.guard.period} codes); "
                "stopping this utterance"
            )
        return self.decoder.plan(codes, urgent=self._urgent())

    def _urgent(self) -> bool:
        """True when waiting for the next grown chunk would let the listener's buffer run dry.

        The wait is estimated from this request's own generation rate; the margin is the
        configured minimum buffer or twice the last decode time, whichever is larger.
        """
        if self.first_audio_at is None:
            return False
        now = time.monotonic()
        return should_hurry(
            buffered_s=self.samples / self.codec.sample_rate - (now - self.first_audio_at),
            frames_until_due=self.decoder.frames_until_due,
            frames_per_s=self.decoder.frames_received / max(now - self.first_code_at, 1e-6),
            margin_s=max(self.engine.config.min_buffer_s, 2.0 * self.last_decode_s),
        )

    async def abort(self) -> None:
        """Stop this request: abort its LLM request now; its iterator then ends quietly."""
        self.aborted = True
        if self.llm_request_id is not None:
            await self.engine._generator.abort(self.llm_request_id)

    def _voice_ready(self, parser: Any) -> bool:
        if self.fmt.family != "bicodec":
            return True
        if not parser.voice_ready:
            return False
        if self.pinned is None and self.voice.globals is None and parser.globals:
            voiceprint = VoicePrint(tuple(parser.prefix), tuple(parser.globals))
            self.pinned = voiceprint  # later parts of this request continue in this voice
            if self.engine.config.pin_voices:
                self.engine._pinned.setdefault(self.voice.name, voiceprint)
        return True

    def _condition(self, parser: Any) -> tuple[int, ...] | None:
        if self.fmt.family != "bicodec":
            return None
        if self.voice.globals is not None:
            return self.voice.globals
        return self.pinned.globals

    async def _decode(self, job: Any) -> AudioChunk | None:
        started = time.monotonic()
        audio = await self.engine._batcher.decode(job.window)
        self.last_decode_s = time.monotonic() - started
        samples = self.decoder.accept(job, audio)
        if len(samples) == 0:
            return None
        self.samples += len(samples)
        if self.first_audio_at is None:
            self.first_audio_at = time.monotonic()
        return AudioChunk(to_pcm_bytes(samples), self.codec.sample_rate, self.tokens)
