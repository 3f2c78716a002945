"""VeenaEngine: one shared, in-process engine turning text into streamed audio chunks.

Flow of one request: text -> sentences -> spoken form (numbers, dates, codes as words;
pipecat_veena.normalize) -> parts (sentences within a length budget, each knowing the written
text it speaks, for word timings) -> prompt ids -> vLLM
tokens -> parser (globals / semantics, or SNAC codes) -> StreamDecoder windows -> DecodeBatcher
(codec on a worker thread, batched across streams) -> int16 PCM chunks at the codec's rate.
All state is per request. The engine knows nothing of Pipecat: the service, the CLI and the
LiveKit plugin all sit on top of ``stream()``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from concurrent.futures import Executor
from contextlib import aclosing
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from loguru import logger

from pipecat_veena import tracing
from pipecat_veena.codecs.base import AudioCodec
from pipecat_veena.engine.checkpoint import WAV2VEC2_DIR, CheckpointLayout, detect_layout
from pipecat_veena.engine.config import EngineConfig
from pipecat_veena.engine.formats import ModelFormat, load_format, load_tokenizer
from pipecat_veena.engine.speed import at_speed
from pipecat_veena.engine.utterance import AudioChunk, EngineParts, Utterance
from pipecat_veena.engine.voices import OPERATOR, Voice, VoiceBook
from pipecat_veena.engine.voices_file import VoicesFile, snac_cannot_enrol
from pipecat_veena.errors import (
    CheckpointError,
    EngineDeadError,
    EngineNotRunningError,
    EnrolmentError,
)
from pipecat_veena.generation import SamplingOptions, TokenGenerator
from pipecat_veena.logs import caller_text
from pipecat_veena.normalize import LANGUAGES, Lexicon
from pipecat_veena.normalize.lexicon import request_lexicon
from pipecat_veena.normalize.ssml import speech_parts
from pipecat_veena.streaming import StreamConfig
from pipecat_veena.streaming.tsm import TimeStretcher, check_speed
from pipecat_veena.tasks import cancel_and_wait
from pipecat_veena.text import DEFAULT_MAX_PART_CHARS, Part

if TYPE_CHECKING:
    from pipecat_veena.codecs.bicodec.encoder import BiCodecSpeakerEncoder
    from pipecat_veena.codecs.bicodec.semantic import SemanticTokenizer

__all__ = ["AudioChunk", "EngineConfig", "VeenaEngine", "load_codec"]

#: Options a caller may set; the voice sets the adapter.
_SAMPLING_KEYS = {f.name for f in fields(SamplingOptions)} - {
    "stop_token_ids",
    "min_tokens",
    "adapter",
}
T = TypeVar("T")
#: Longest text made ready for the model (normalised, split) on the event loop; longer text is
#: made ready in a worker thread (a sentence takes about 0.15 ms, 16 KB up to 0.2 s).
INLINE_TEXT_CHARS = 256
#: How often a running engine looks whether its LLM backend is still alive (a request that
#: meets the dead backend says so at once; this finds a death while no request runs).
WATCH_S = 0.25
#: The longest wait between two restart attempts, whatever ``restart_backoff_s`` doubles to.
RESTART_BACKOFF_MAX_S = 60.0


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
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running = False
        self._starting: asyncio.Future[None] | None = None
        self._parts: EngineParts | None = None
        self._inflight: dict[str, Utterance] = {}
        self._requests = 0
        self._lexicon = Lexicon.load(config.lexicon)  # a bad lexicon fails here, not mid-call
        self._speaker_encoder: BiCodecSpeakerEncoder | None = None
        self._semantic_tokenizer: SemanticTokenizer | None = None
        self._encoder_lock = asyncio.Lock()
        self._voices_file: VoicesFile | None = None
        self._reserved_voices: frozenset[str] = frozenset()
        # the supervisor: see ``state``
        self._state = "stopped"
        self._llm_dir: Path | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._restarting: asyncio.Task[None] | None = None
        self._settled = asyncio.Event()  # set while the state is not "restarting"
        self._settled.set()
        self.restarts = 0

    def __str__(self) -> str:
        return f"VeenaEngine({Path(self.config.checkpoint).name})"

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Load tokenizer, codec and LLM, then warm up; idempotent.

        Concurrent callers share one start (a LiveKit worker prewarms every session's TTS);
        a caller cancelled while waiting does not cancel it for the others. A start that fails
        releases everything it started before raising; ``start()`` may then be called again,
        as it may after ``shutdown()``.
        """
        if self._state == "failed":  # the restarts ran out: start afresh
            await self._release()
        if self._running:
            return
        if self._starting is None or self._starting.done():
            self._starting = asyncio.ensure_future(self._start())
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        from pipecat_veena.streaming.batching import DecodeBatcher

        cfg = self.config
        self._state = "starting"
        try:
            # Everything that blocks (file reads, model loads) runs on worker threads, so that the
            # loop keeps serving while the engine starts (a server's /health answers).
            layout = await asyncio.to_thread(detect_layout, cfg.checkpoint)
            if self._codec is None:
                self._codec = await asyncio.to_thread(load_codec, layout, cfg)
            tokenizer = await asyncio.to_thread(load_tokenizer, layout.llm_dir)
            pinned = self._format.voices.pinned if self._format else {}  # kept over a restart
            self._format = await asyncio.to_thread(
                load_format, layout, tokenizer, self._codec.condition_size
            )
            self._format.voices.pinned.update(pinned)
            self._format.voices.reserved = self._reserved_voices
            if cfg.voices_file is not None:
                self._voices_file = VoicesFile(
                    Path(cfg.voices_file), self.model_name, self._format.voice_prefix_globals
                )
                await asyncio.to_thread(self._voices_file.start, self._format.voices)
            self._stream_config = await self._stream_settings()
            self._llm_dir = layout.llm_dir
            if self._generator is None:
                self._generator = self._new_generator()
            await self._generator.start()
            self._batcher = DecodeBatcher(
                self._codec, max_batch=cfg.decode_max_batch, max_wait_ms=cfg.decode_max_wait_ms
            )
            self._parts = EngineParts(
                config=cfg,
                fmt=self._format,
                codec=self._codec,
                generator=self._generator,
                batcher=self._batcher,
                stream_config=self._stream_config,
            )
            self._loop = asyncio.get_running_loop()
            self._running = True
            self._state = "running"
            self._watcher = asyncio.ensure_future(self._watch())
            logger.debug(f"{self}: started ({layout.family}, {self._codec.sample_rate} Hz)")
            if cfg.warmup:
                # A fixed seed: every replica of a checkpoint pins the same default voice.
                async for _ in self.stream("Hello.", request_id="warmup", seed=cfg.warmup_seed):
                    pass
        except BaseException as e:
            logger.error(f"{self}: start failed ({type(e).__name__}: {e}); releasing what started")
            await self._release()
            raise

    def _new_generator(self) -> TokenGenerator:
        """A fresh vLLM generator for the checkpoint's LLM (a vLLM engine is one-shot)."""
        from pipecat_veena.generation.vllm_local import VllmGenerator

        cfg = self.config
        return VllmGenerator(
            self._llm_dir,
            max_model_len=cfg.max_model_len,
            max_num_seqs=cfg.max_num_seqs,
            adapters=self._require_format().voices.adapters,
            **cfg.generator_kwargs,
        )

    # -- the supervisor --------------------------------------------------------------------
    @property
    def state(self) -> str:
        """Where the engine stands: its supervisor's state.

        "stopped" (not started, or shut down), "starting", "running", "restarting" (its LLM
        backend died; a new one is starting, requests get a retryable ``EngineDeadError``
        meanwhile) or "failed" (the restarts ran out, see ``EngineConfig.restart_attempts``;
        requests get a non-retryable ``EngineDeadError``; ``start()`` starts afresh).
        """
        if self._state == "running" and not self.is_running:
            if self._backend_shut_down():
                return "stopped"
            return "restarting"  # dead, and its watcher is about to notice (within WATCH_S)
        return self._state

    def _backend_shut_down(self) -> bool:
        """True when the backend was shut down on purpose (SIGTERM, the exit hook): no death."""
        return self._generator is not None and self._generator.was_shut_down

    async def wait_running(self) -> bool:
        """Wait while the engine restarts its backend; True when it runs, else False."""
        while self.state == "restarting":
            if self._settled.is_set():  # dead, and the watcher is about to notice
                await asyncio.sleep(WATCH_S / 5)
            else:
                await self._settled.wait()
        return self.is_running

    async def _watch(self) -> None:
        """Find the backend's death while the engine runs (between requests too)."""
        while self._state == "running":
            generator = self._generator
            if generator is not None and not generator.is_running:
                self._backend_died()
                return
            await asyncio.sleep(WATCH_S)

    def _backend_died(self) -> None:
        """The LLM backend died: fail what is in flight and restart it (once per death)."""
        if self._state != "running":
            return
        if self._backend_shut_down():
            logger.info(f"{self}: the LLM backend was shut down; the engine stops with it")
            self._state = "stopped"
            self._settled.set()
            return
        self._state = "restarting"
        self._settled.clear()
        self._restarting = asyncio.ensure_future(self._restart())

    async def _restart(self) -> None:
        cfg = self.config
        died = time.monotonic()
        error = EngineDeadError(
            f"{self}: the LLM backend died under this utterance; the engine is restarting it: "
            "retry shortly (or on another replica)"
        )
        for request in list(self._inflight.values()):
            await request.abort(error)
        dead, self._generator = self._generator, None
        if dead is not None and self._owns_generator:
            await dead.shutdown()  # ends (and reaps) what is left of its processes
        attempts = cfg.restart_attempts if self._owns_generator else 0
        if not self._owns_generator:
            logger.error(f"{self}: the LLM backend it was given died; its owner must restart it")
        for attempt in range(1, attempts + 1):
            delay = min(cfg.restart_backoff_s * 2 ** (attempt - 1), RESTART_BACKOFF_MAX_S)
            delay *= random.uniform(0.5, 1.0)
            logger.warning(
                f"{self}: the LLM backend died; restart {attempt} of {attempts} in {delay:.1f} s"
            )
            await asyncio.sleep(delay)
            generator = self._new_generator()
            try:
                await generator.start()
            except BaseException as e:
                await generator.shutdown()
                if not isinstance(e, Exception):
                    raise
                logger.error(f"{self}: restart {attempt} of {attempts} failed: {e}")
                continue
            self._generator = generator
            self._parts = replace(self._parts, generator=generator)
            self._state = "running"
            self.restarts += 1
            self._settled.set()
            self._watcher = asyncio.ensure_future(self._watch())
            logger.info(
                f"{self}: the LLM backend is back {time.monotonic() - died:.1f} s after it died "
                f"(restart {attempt} of {attempts})"
            )
            return
        self._state = "failed"
        self._settled.set()
        logger.error(
            f"{self}: the LLM backend died and {attempts} restart(s) did not bring it back; "
            "the engine cannot serve (EngineConfig.restart_attempts)"
        )

    async def _stream_settings(self) -> StreamConfig:
        cfg = self.config
        stream = cfg.stream or StreamConfig.for_codec(self._codec)
        if cfg.calibrate_seams_db is None:
            return stream
        from pipecat_veena.engine.calibrate import calibrate_lookahead

        stream = await asyncio.to_thread(
            calibrate_lookahead, self._codec, cfg.calibrate_seams_db, stream
        )
        logger.info(
            f"{self}: lookahead {stream.lookahead_frames} frames reaches "
            f"{cfg.calibrate_seams_db} dB seams on these weights"
        )
        return stream

    async def shutdown(self) -> None:
        """Stop serving and release the LLM (when owned) and the decode thread; idempotent.

        Streams still in flight end with ``EngineNotRunningError`` ("the engine shut down"),
        their LLM requests aborted. ``start()`` may be called again afterwards.
        """
        self._running = False
        await cancel_and_wait(*(t for t in (self._watcher, self._restarting) if t is not None))
        self._watcher = self._restarting = None
        error = EngineNotRunningError(
            f"{self} shut down while this utterance was in flight: start the engine again "
            "(or use another one) for new requests"
        )
        for request in list(getattr(self, "_inflight", {}).values()):
            await request.abort(error)
        await self._release()
        logger.debug(f"{self}: shut down")

    async def _release(self) -> None:
        """Close the batcher and the owned generator (safe on a half-built engine)."""
        self._running = False
        self._state = "stopped"
        self._settled.set()
        batcher, self._batcher = getattr(self, "_batcher", None), None
        if batcher is not None:
            await batcher.close()
        generator = getattr(self, "_generator", None)
        if generator is not None and self._owns_generator:
            await generator.shutdown()
            self._generator = None  # a restart builds a fresh one (a vLLM engine is one-shot)

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
    def times_words(self) -> bool:
        """True: chunks carry the words of the text as written, timed (``AudioChunk.words``)."""
        return True

    @property
    def model_name(self) -> str:
        """The checkpoint directory's name."""
        return Path(self.config.checkpoint).name

    @property
    def voices(self) -> list[str]:
        """Voice names of the loaded checkpoint (default first), enrolled ones included."""
        self.refresh_voices()
        return self._require_format().voices.names

    @property
    def enrolled_voices(self) -> list[str]:
        """Names of the voices enrolled from audio (``enroll_voice`` or the voices file)."""
        self.refresh_voices()
        return sorted(self._require_format().voices.enrolled)

    @property
    def emotion_tags(self) -> tuple[str, ...]:
        """Inline tags the model understands (e.g. ``<laugh>``), as the checkpoint declares."""
        return self._require_format().voices.emotion_tags

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

    def check_voice(self, voice: str | None, owner: str | None = None) -> str:
        """Canonical name of ``voice``; raises UnknownVoiceError listing the valid ones.

        ``owner``: who asks (a speech server's caller): another owner's enrolled voice is
        unknown to them (None: every voice is known).
        """
        self.refresh_voices()
        return self._require_format().voices.resolve_for(voice, owner).name

    def register_voice(self, name: str, global_codes: list[int]) -> None:
        """Add a BiCodec voice given by its 32 global codes (a cloned voice)."""
        fmt = self._require_format()
        if fmt.family != "bicodec":
            raise ValueError("only BiCodec checkpoints take voices given by global codes")
        fmt.voices.register(name, global_codes)

    @property
    def enrols_with_transcript(self) -> bool:
        """True when ``enroll_voice`` takes a ``transcript`` (False before ``start()``).

        That is a BiCodec checkpoint that ships ``wav2vec2-large-xlsr-53/``.
        """
        if self._format is None or self._format.family != "bicodec":
            return False
        return detect_layout(self.config.checkpoint).wav2vec2_dir is not None

    async def enroll_voice(
        self,
        name: str,
        audio: Any,
        sample_rate: int,
        transcript: str | None = None,
        *,
        executor: Executor | None = None,
        owner: str = OPERATOR,
        replace: bool = True,
        limit: int | None = None,
    ) -> Voice:
        """Enrol a voice from a clip of its speaker; ``stream(voice=name)`` then speaks with it.

        The BiCodec speaker encoder turns the clip into the 32 global codes of a voice (its
        first 6 s, tiled when shorter, after volume normalisation). With a ``transcript`` and a
        checkpoint that ships ``wav2vec2-large-xlsr-53/`` (Spark-TTS-0.5B does), the whole
        clip's semantic tokens are computed too (wav2vec2 + the BiCodec encoder, as Spark-TTS
        does), and every prompt of the voice carries the transcript and those tokens
        (Spark-TTS's clone-with-transcript prompt: closer to the speaker, ~50 prompt tokens per
        second of clip). The voice is kept with the others and exported by ``export_voices``
        (JSON), so replicas that load the file speak it too; with
        ``EngineConfig(voices_file=...)`` it is written to that file at once (replicas sharing
        the file reload it when it changes). The work runs in a worker thread; the encoders
        load on first use, on the CPU. Cloning quality depends on the base model.

        Args:
            name: the new voice's name (letters, digits, ``_ - .``); enrolling a name again
                replaces that enrolled voice. Built-in names are refused.
            audio: mono samples, float in [-1, 1] or int16: 3-30 s holding at least 3 s of
                speech, neither silent nor clipped.
            sample_rate: the clip's rate in Hz (resampled to the encoder's 16 kHz).
            transcript: the words spoken in the clip (transcript mode), or None (global-only).
            executor: the thread pool that runs the encoders (None: the loop's default one;
                the server passes its upload workers).
            owner: whose voice it is (the speech server passes the API key's fingerprint;
                ``OPERATOR``: every caller's). See ``VoiceBook``.
            replace: replace ``owner``'s voice of that name (False: refuse it, NAME_TAKEN).
            limit: the most enrolled voices (None: no cap; TOO_MANY_VOICES).

        Returns:
            The enrolled voice (``voice.globals`` holds its 32 codes; in transcript mode
            ``voice.semantic`` and ``voice.transcript`` hold the reference).

        Raises:
            EnrolmentError: a bad clip, name or transcript, a checkpoint that cannot enrol (a
                SNAC model, or BiCodec weights without the speaker encoder), or a transcript
                with a checkpoint that has no wav2vec2 model, naming the fix.
        """
        from pipecat_veena.engine.enrolment import (
            check_transcript,
            prepare_clip,
            wav2vec2_missing,
        )

        self.check_enrolment(name, owner=owner, replace=replace, limit=limit)  # before any work
        transcript = check_transcript(transcript)
        layout = detect_layout(self.config.checkpoint)
        if transcript is not None and layout.wav2vec2_dir is None:
            raise wav2vec2_missing(self.model_name, layout.root, WAV2VEC2_DIR)
        encoder = await self._speaker_encoder_loaded()
        semantic = None if transcript is None else await self._semantic_tokenizer_loaded(layout)

        def encode() -> tuple[list[int], list[int] | None]:
            wav = prepare_clip(audio, sample_rate, encoder.sample_rate)
            return encoder.tokenize(wav), None if semantic is None else semantic.tokenize(wav)

        start = time.perf_counter()
        codes, semantic_codes = await asyncio.get_running_loop().run_in_executor(executor, encode)
        if semantic_codes is not None:
            self._check_reference_fits(semantic_codes)

        def enrol(book: VoiceBook) -> Voice:  # the book as the voices file is now
            return book.enrol(
                name, codes, semantic_codes, transcript, owner=owner, replace=replace, limit=limit
            )

        voice = await asyncio.to_thread(self._change_voices, enrol)
        if transcript is not None:
            mode = f"with its transcript and {len(semantic_codes or ())} semantic tokens"
        elif layout.wav2vec2_dir is None:
            mode = f"global-only: no transcript, and no {WAV2VEC2_DIR}/ for transcript mode"
        else:
            mode = "global-only: no transcript given"
        logger.info(
            f"{self}: voice {voice.name!r} enrolled in "
            f"{1000 * (time.perf_counter() - start):.0f} ms ({mode})"
        )
        return voice

    def check_enrolment(
        self,
        name: str,
        *,
        owner: str = OPERATOR,
        replace: bool = True,
        limit: int | None = None,
    ) -> str:
        """The name a voice enrolled as ``name`` would get, checked before any work.

        As the engine's voices are now: ``enroll_voice`` checks again against the voices file
        as it is when the voice is written.

        Raises:
            EnrolmentError: a model that cannot enrol (SNAC: use a LoRA adapter voice), an odd
                name, one a built-in voice has or that is reserved, another owner's voice, one's
                own without ``replace``, or a full book (``code`` says which).
        """
        fmt = self._require_format()
        if fmt.family != "bicodec":
            raise snac_cannot_enrol(self.model_name)
        self.refresh_voices()
        return fmt.voices.check_enrolment(name, owner=owner, replace=replace, limit=limit)

    def remove_voice(self, name: str, owner: str | None = None) -> str:
        """Remove an enrolled voice (from the voices file too, when the engine has one).

        Blocks on the voices file (its lock, a read and a write): an event loop calls it in a
        worker thread.

        Args:
            name: the voice.
            owner: who asks (None: the operator, who may remove any enrolled voice); another
                owner's voice is unknown to them, one shared with them is refused.

        Returns:
            The removed voice's canonical name.

        Raises:
            EnrolmentError: ``name`` is a built-in voice, or shared with ``owner`` but not
                theirs (``code`` NOT_OWNER).
            UnknownVoiceError: no voice has that name (that ``owner`` may use).
        """
        key = self._change_voices(lambda book: book.forget(name, owner))
        logger.info(f"{self}: enrolled voice {key!r} removed")
        return key

    def share_voice(self, name: str, shared: bool = True) -> str:
        """Share an enrolled voice with every caller of a server (or stop); blocks on the file.

        Raises:
            UnknownVoiceError: no enrolled voice has that name.
        """
        return self._change_voices(lambda book: book.share(name, shared))

    def reserve_voice_names(self, names: Iterable[str]) -> None:
        """Names that may not be enrolled from now on (a server's OpenAI and voice-map names)."""
        self._reserved_voices = frozenset(n.strip().lower() for n in names)
        if self._format is not None:
            self._format.voices.reserved = self._reserved_voices

    def voice_access(self, owner: str | None) -> dict[str, tuple[bool, bool]]:
        """The enrolled voices ``owner`` may use: name -> (``owner`` may remove it, shared).

        ``shared``: every caller may use it (marked shared, or the operator's).
        """
        self.refresh_voices()
        book = self._require_format().voices
        owned, shared = set(book.owned_by(owner)), set(book.shared_with_all())
        return {
            n: (n in owned, n in shared) for n in sorted(book.enrolled) if book.usable_by(n, owner)
        }

    def _change_voices(self, change: Callable[[VoiceBook], T]) -> T:
        """Apply ``change`` to the voices, through the voices file when there is one (blocking)."""
        book = self._require_format().voices
        if self._voices_file is None:
            return change(book)
        return self._voices_file.change(book, change)

    def refresh_voices(self, *, now: bool = False) -> bool:
        """Reload the voices file (``EngineConfig.voices_file``) if it changed since last read.

        Cheap: one ``stat`` at most every ``VOICES_POLL_S`` seconds (``now``: at once), so that
        replicas sharing the file (a mounted volume) see each other's enrolled and removed
        voices. On the event loop the reload itself runs on a worker thread (until it is done
        the voices are as they were); elsewhere it runs here. A file that cannot be read or
        parsed keeps the voices as they are (warned); an entry that cannot be used is skipped
        (warned); a voice pinned already keeps its print.

        Returns:
            True when the file was reloaded here.
        """
        if self._voices_file is None or self._format is None:
            return False
        return self._voices_file.refresh(self._format.voices, now=now)

    def _check_reference_fits(self, semantic_codes: list[int]) -> None:
        """EnrolmentError when a clip's semantic tokens would take over half the model length."""
        room = self.config.max_model_len // 2
        if len(semantic_codes) > room:
            raise EnrolmentError(
                f"the clip gives {len(semantic_codes)} semantic tokens (50 per second), more "
                f"than half of max_model_len {self.config.max_model_len}: every prompt of the "
                f"voice carries them. Enrol with a clip of at most {room // 50} s (about 10 s "
                "is plenty)."
            )

    async def _speaker_encoder_loaded(self) -> BiCodecSpeakerEncoder:
        """The checkpoint's speaker encoder, loaded once.

        On the CPU in float32, so that every replica computes the same codes for a clip,
        whatever its accelerator.
        """
        from pipecat_veena.codecs.bicodec.encoder import BiCodecSpeakerEncoder

        async with self._encoder_lock:
            if self._speaker_encoder is None:
                codec_dir = detect_layout(self.config.checkpoint).codec_dir
                try:
                    self._speaker_encoder = await asyncio.to_thread(
                        BiCodecSpeakerEncoder.from_pretrained, codec_dir
                    )
                except CheckpointError as e:
                    raise EnrolmentError(str(e), code=EnrolmentError.UNSUPPORTED) from e
        return self._speaker_encoder

    async def _semantic_tokenizer_loaded(self, layout: CheckpointLayout) -> SemanticTokenizer:
        """The semantic tokenizer (wav2vec2 + the BiCodec encoder), loaded once, CPU float32."""
        from pipecat_veena.codecs.bicodec.semantic import SemanticTokenizer

        async with self._encoder_lock:
            if self._semantic_tokenizer is None:
                try:
                    self._semantic_tokenizer = await asyncio.to_thread(
                        SemanticTokenizer.from_pretrained, layout.codec_dir, layout.wav2vec2_dir
                    )
                except CheckpointError as e:
                    raise EnrolmentError(str(e)) from e
        return self._semantic_tokenizer

    def export_voices(self, path: str | Path | None = None) -> dict[str, Any]:
        """The pinned voice prints (to load in another process); written to ``path`` if given.

        Every replica that loads the file (``EngineConfig(voices_file=...)`` or
        ``load_voices``) speaks each pinned voice exactly as this one does.
        """
        data = self._require_format().voices.export_prints(self.model_name)
        if path is not None:
            Path(path).write_text(json.dumps(data, indent=1), encoding="utf-8")
        return data

    def load_voices(self, source: str | Path | dict[str, Any]) -> list[str]:
        """Pin the voice prints of an exported file (or dict); returns the voices pinned.

        Raises:
            ValueError: a malformed file, an unknown voice, or a prefix this model's grammar
                rejects (e.g. a file exported from another model).
        """
        fmt = self._require_format()
        data = source if isinstance(source, dict) else _read_json(Path(source))
        names = fmt.voices.load_prints(data, fmt.voice_prefix_globals)
        logger.info(f"{self}: pinned voice(s) {', '.join(names) or '(none)'} from a file")
        return names

    def stats(self) -> dict[str, Any]:
        """Live counters: active streams, vLLM's unfinished requests, decode batching.

        ``waiting_streams``: streams with no LLM token yet; ``decode_batch_sizes``: batches by
        size.
        """
        batch = self._batcher.stats() if self._batcher is not None else {}
        return {
            "active_streams": len(self._inflight),
            "unfinished_requests": self._generator.num_unfinished() if self._generator else 0,
            "waiting_streams": sum(r.first_token_at is None for r in self._inflight.values()),
            "decode_batch_mean": batch.get("mean_batch_size", 0.0),
            "decode_batch_sizes": batch.get("batch_sizes", {}),
            "decode_batches": batch.get("batches", 0),
            "requests": self._requests,
            "pinned_voices": sorted(self._format.voices.pinned) if self._format else [],
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
        if self._state == "restarting":
            raise EngineDeadError(
                f"{self}: the LLM backend died and is restarting; retry shortly (or on another "
                "replica)"
            )
        if self._state == "failed":
            raise EngineDeadError(
                f"{self}: the LLM backend died and could not be restarted; the engine cannot "
                "serve (shut it down and start it again, or use another one)",
                retryable=False,
            )
        if not self._generator.is_running:
            self._backend_died()
            raise EngineDeadError(f"{self}: the LLM backend died; the engine is restarting it")

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

    def check_options(self, **options: Any) -> None:
        """Raise ValueError naming the problem when request options cannot work."""
        options.pop("normalize", None)
        _check_language(options.pop("language", "auto"))
        _check_markup(options.pop("lexicon", None), options.pop("ssml", None))
        if options.get("speed") is not None:
            check_speed(options["speed"])
        options.pop("speed", None)
        max_tokens = options.pop("max_tokens", None)
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.sampling(**options)

    # -- streaming -------------------------------------------------------------------------
    async def stream(
        self,
        text: str,
        voice: str | None = None,
        *,
        request_id: str | None = None,
        normalize: bool | None = None,
        language: str = "auto",
        speed: float | None = None,
        lexicon: Mapping[str, Any] | Lexicon | None = None,
        ssml: bool = False,
        **sampling,
    ) -> AsyncIterator[AudioChunk]:
        """Speak ``text``: yields int16 PCM chunks at the codec's rate as they are decoded.

        Text with nothing speakable yields nothing. Closing or cancelling the iterator aborts
        the LLM request at once.

        Args:
            text: what to say (any length: long text is split into parts, one voice throughout).
            voice: a name from ``voices`` (None: the default).
            request_id: prefix of the LLM request ids (e.g. the Pipecat context id).
            normalize: speak numbers, dates, codes and symbols as words (None: the config's).
                Only the model's text changes: callers keep reporting the text they passed.
            language: "auto" (per sentence, from its script), "hi" or "en" for normalising.
            speed: 0.5 to 2.0 (None or 1.0: as the model speaks, the chunks untouched): the
                audio is time-stretched keeping its pitch (``streaming.tsm``, at the codec's
                rate, one window of latency) and word times scale with it.
            lexicon: this request's own term -> spoken form entries (``Lexicon`` shapes, at most
                1000 entries and 64 KiB), laid over the engine's lexicon for this request only.
            ssml: ``text`` is SSML (``pipecat_veena.normalize.ssml``: breaks are exact silence,
                ``<sub>``, ``<say-as>``, ``<phoneme>``, ``<lang>`` change what the model reads;
                word timings report the written words, offsets into ``text``).
            **sampling: temperature, top_k, top_p, repetition_penalty, max_tokens, seed.

        Raises:
            UnknownVoiceError, ValueError: bad voice or sampling option (before any work).
            SsmlError: malformed or unsupported markup (a ValueError naming the position).
            MalformedStreamError: the model broke the codec grammar.
            NoAudioError: speakable text produced no audio.
            EngineNotRunningError, EngineDeadError: the engine cannot serve.
        """
        self._check_running()
        self.refresh_voices()
        fmt = self._require_format()
        voice_obj = fmt.voices.resolve(voice)
        self.check_options(language=language, speed=speed, lexicon=lexicon, ssml=ssml, **sampling)
        max_tokens = sampling.pop("max_tokens", None)
        options = self.sampling(**sampling)
        spoken = self.config.normalize if normalize is None else normalize
        lex = self._lexicon
        if lexicon is not None:
            lex = (lex or Lexicon()).merged(request_lexicon(lexicon))
        if len(text) <= INLINE_TEXT_CHARS:
            parts = self._model_texts(fmt, text, spoken, language, lex, ssml)
        else:  # linear, but about 10 us a character at worst: keep the loop (and probes) free
            parts = await asyncio.to_thread(
                self._model_texts, fmt, text, spoken, language, lex, ssml
            )
        if not parts:
            logger.debug(
                f"{self}: nothing speakable in {caller_text(text, show=self.config.log_text)}"
            )
            return
        rid = f"{request_id or 'tts'}-{uuid.uuid4().hex[:12]}"
        request = Utterance(
            self._parts,
            rid,
            voice_obj,
            options,
            max_tokens,
            language=language,
            text=text,
            speed=speed or 1.0,
        )
        request.trace = tracing.utterance(
            rid, voice_obj.name, self.model_name, len(text), len(parts)
        )
        self._inflight[rid] = request
        self._requests += 1
        failure: BaseException | None = None
        try:
            chunks = request.run(parts)
            rated = any(p.rate is not None for p in parts)  # (SSML <prosody rate>)
            if rated or speed is not None and speed != 1.0:
                base = 1.0 if speed is None else speed
                spans = rated or any(p.pause_s for p in parts)  # breaks stay exact
                chunks = at_speed(
                    chunks,
                    TimeStretcher(self.sample_rate, base),
                    request.speed_changes(base) if spans else None,
                    request.pauses if spans else None,
                )
            async with aclosing(chunks) as chunks:
                async for chunk in chunks:
                    yield chunk
        except EngineDeadError as e:
            failure = e
            self._backend_died()  # (the watcher may not have seen it yet)
            raise
        except BaseException as e:
            failure = e
            raise
        finally:
            del self._inflight[rid]
            if request.trace is not None:
                request.end_trace(failure)

    def _model_texts(
        self,
        fmt: ModelFormat,
        text: str,
        spoken: bool,
        language: str,
        lexicon: Lexicon | None = None,
        ssml: bool = False,
    ) -> list[Part]:
        """The model's parts for ``text``.

        Cleaned, split in sentences, each normalised when ``spoken``, packed in parts that know
        the written text they speak. SSML is parsed first: markup never reaches the model.
        """
        written = fmt.clean_text(text)  # injected control strings must not shape the parts either
        return speech_parts(
            written,
            language,
            lexicon=lexicon,
            ssml=ssml,
            spoken=spoken,
            max_chars=(
                self.config.max_part_chars or fmt.voices.max_part_chars or DEFAULT_MAX_PART_CHARS
            ),
        )

    async def abort(self, request_id: str) -> int:
        """Stop every in-flight stream started with ``request_id``; returns how many.

        Their LLM requests are aborted at once and their iterators end without error. Closing
        or cancelling a ``stream()`` iterator does the same for that one stream.
        """
        hits = [r for rid, r in self._inflight.items() if rid.startswith(f"{request_id}-")]
        for request in hits:
            await request.abort()
        return len(hits)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read voice prints from {path}: {e}") from e


def _check_markup(lexicon: object, ssml: object) -> None:
    """Raise ValueError when a request's ``lexicon`` or ``ssml`` option is malformed."""
    if lexicon is not None:
        request_lexicon(lexicon)
    if ssml is not None and not isinstance(ssml, bool):
        raise ValueError(f"ssml must be true or false, got {ssml!r}")


def _check_language(language: str) -> None:
    if language not in LANGUAGES:
        raise ValueError(f"language must be one of {LANGUAGES}, got {language!r}")


def load_codec(layout: Any, cfg: EngineConfig) -> AudioCodec:
    """Load the checkpoint's codec (blocking: runs in a worker thread).

    On the CPU without an explicit ``codec_dtype``, a short timed probe on the loaded weights
    picks float32 or bfloat16 (:func:`pipecat_veena.codecs.probe.choose_cpu_dtype`).
    """
    import torch

    device = cfg.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if layout.family == "bicodec":
        from pipecat_veena.codecs.bicodec import BiCodecCodec as codec_class
    else:
        from pipecat_veena.codecs.snac import SnacCodec as codec_class

    def load(dtype: Any) -> AudioCodec:
        return codec_class.from_pretrained(layout.codec_dir, device=device, dtype=dtype)

    on_cpu = torch.device(device).type == "cpu"
    if on_cpu:
        # Left at torch's default (one per core) on purpose: beside vLLM's CPU engine, which
        # binds its own OpenMP threads, one codec thread was slower (BENCHMARKS.md, threads);
        # only a stream's first, small windows run on one (pipecat_veena.codecs.threads).
        small = getattr(codec_class, "single_thread_frames", 0)
        logger.info(
            f"codec on the CPU with {torch.get_num_threads()} torch threads "
            f"({os.cpu_count()} cores; torch.set_num_threads before start changes it)"
            + (f", calls of at most {small} frames on one" if small else "")
        )
    if cfg.codec_dtype:
        return load(getattr(torch, cfg.codec_dtype))
    if on_cpu:
        from pipecat_veena.codecs.probe import choose_cpu_dtype

        return choose_cpu_dtype(load)[0]
    return load(None)
