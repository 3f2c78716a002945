"""Load-time settings of the engine (one frozen dataclass, no heavy imports)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipecat_veena.streaming import StreamConfig


@dataclass(frozen=True)
class EngineConfig:
    """Load-time settings of a VeenaEngine.

    Parameters:
        checkpoint: checkpoint directory (Spark-TTS-0.5B layout ``LLM/`` + ``BiCodec/``, Veena3,
            or Veena: LLM + SNAC directory); the layout is detected.
        device: codec device, "auto" (CUDA when available), "cpu" or "cuda[:n]".
        codec_dtype: codec dtype name ("float32", "bfloat16", "float16"); None: on CPU, a
            short timed probe at start picks bfloat16 where this CPU computes it natively and
            it is clearly faster, else float32 (logged with its figures); on CUDA bfloat16
            for BiCodec, float32 for SNAC.
        stream: sliding-window settings; None: the measured defaults for the codec.
        calibrate_seams_db: when set, measure at start the smallest lookahead whose seams reach
            this SNR against an offline decode on the LOADED codec weights (seconds on CPU,
            milliseconds on GPU), and use it; see ``pipecat-veena calibrate``.
        max_part_chars: long text is split into parts of at most this many characters (None:
            the checkpoint's ``max_part_chars`` from voices.json, else 220).
        normalize: speak numbers, money, dates, times, codes and symbols as words (Hindi or
            Indian English per sentence, see ``pipecat_veena.normalize``) before the model sees
            the text; a request may turn it off (``stream(..., normalize=False)``).
        lexicon: user respellings applied first when normalising: a JSON file path or a dict
            ``{"*"|"hi"|"en": {term: spoken}}`` (see ``pipecat_veena.normalize.Lexicon``).
        pin_voices: reuse the voice print (generated globals) of each voice's first request
            that completed cleanly for every later utterance of that voice (no drift between
            sentences or calls, and fewer tokens before first audio).
        voices_file: voice prints (and enrolled voices) exported by
            ``VeenaEngine.export_voices`` to load at start, so every replica of a service speaks
            each voice the same.
        constrain_grammar: hold every generated token to the codec grammar (the LLM backend
            masks the ids the grammar forbids at each step), so no model, however trained or
            sampled, can produce a malformed stream. Off: the stream parser still rejects a
            malformed stream with a clear error.
        max_num_seqs: most concurrent generation requests in vLLM.
        max_model_len: longest prompt plus generation.
        decode_max_batch: most windows decoded in one codec call.
        decode_max_wait_ms: how long a window may wait for others to batch with.
        min_buffer_s: the least audio to keep ahead of the listener: when waiting for the next
            (grown) chunk would leave less, a chunk is decoded at once instead, so playback stays
            gapless even when the LLM runs at less than twice real time.
        warmup: run one short utterance at start so the first call is not slow (it pins the
            default voice, sampled with ``warmup_seed``, unless a voices file pinned it).
        warmup_seed: sampling seed of the warm-up utterance.
        log_requests: log each request at info level.
        log_text: show callers' text (its first 60 characters) in log lines, trace spans and
            error messages; off, only its length and a short hash (``logs.caller_text``).
        generator_kwargs: further VllmGenerator arguments (dtype, kv_cache_memory_bytes, ...).
        restart_attempts: when the LLM backend dies under a started engine (its vLLM process
            killed: a GPU fault, the OOM killer), how many times to start a new one before the
            engine gives up (``VeenaEngine.state`` "failed"); 0: never (a host that replaces
            the whole process, as Ray Serve does, restarts it instead). The codec and the
            voices stay loaded: only the LLM restarts.
        restart_backoff_s: the wait before the first restart attempt, doubling for each next
            one (each wait jittered between half and all of it, so replicas that died together
            do not restart in step).
    """

    checkpoint: Path
    device: str = "auto"
    codec_dtype: str | None = None
    stream: StreamConfig | None = None
    calibrate_seams_db: float | None = None
    max_part_chars: int | None = None
    normalize: bool = True
    lexicon: str | Path | dict | None = None
    pin_voices: bool = True
    voices_file: Path | None = None
    constrain_grammar: bool = True
    max_num_seqs: int = 64
    max_model_len: int = 4096
    decode_max_batch: int = 16
    decode_max_wait_ms: float = 2.0
    min_buffer_s: float = 0.05
    warmup: bool = True
    warmup_seed: int = 0
    log_requests: bool = False
    log_text: bool = False
    generator_kwargs: dict[str, Any] = field(default_factory=dict)
    restart_attempts: int = 3
    restart_backoff_s: float = 1.0

    def __post_init__(self) -> None:
        if self.restart_attempts < 0:
            raise ValueError(f"restart_attempts must be >= 0, got {self.restart_attempts}")
        if not self.restart_backoff_s >= 0:
            raise ValueError(f"restart_backoff_s must be >= 0, got {self.restart_backoff_s}")
