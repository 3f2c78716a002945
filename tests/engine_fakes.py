"""Fakes for engine unit tests: a scripted token generator and a numpy codec.

The real parts (vLLM CPU engine, torch codecs) are exercised in tests/test_engine_real.py; these
fakes let unit tests script exact token streams (malformed, looping, runaway) cheaply.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import numpy as np
from tokenizers_for_tests import spark_tokenizer, spark_tokenizer_json

from pipecat_veena.codecs.base import AudioCodec, CodecWindow
from pipecat_veena.engine.tokens import BiCodecIds
from pipecat_veena.generation import SamplingOptions, TokenDelta, TokenGenerator

TEMPLATE = "<|task_tts|><|start_content|>{speaker}{text}<|end_content|><|start_global_token|>"


class FakeBiCodec(AudioCodec):
    """A fake BiCodec-shaped codec (numpy): each frame is a constant level set by its code and
    the first global code, so windows are exact and output reveals which voice decoded it."""

    sample_rate = 16000
    samples_per_frame = 320
    codes_per_frame = 1
    condition_size = 32
    context_frames = 4

    def __init__(self) -> None:
        self.windows = 0

    def decode_windows(self, windows: Sequence[CodecWindow]) -> list[np.ndarray]:
        self.windows += len(windows)
        out = []
        for w in windows:
            level = (w.frames[:, 0] % 100) / 400.0 + w.condition[0] / 40960.0
            out.append(self.kept_audio(w, np.repeat(level, self.samples_per_frame)))
        return out


Script = Callable[[list[int], SamplingOptions], list[int]]


class ScriptedGenerator(TokenGenerator):
    """A fake TokenGenerator: ``script(prompt, options)`` gives the whole output, which is
    streamed in deltas of ``step`` tokens; honours max_tokens, stop ids and abort."""

    def __init__(self, script: Script, *, step: int = 3, delay: float = 0.0) -> None:
        self.script = script
        self.step = step
        self.delay = delay
        self.prompts: list[list[int]] = []
        self.options: list[SamplingOptions] = []
        self.aborted: list[str] = []
        self._unfinished: set[str] = set()
        self._running = False
        self.shut_down = False

    async def start(self) -> None:
        self._running = True

    async def shutdown(self) -> None:
        self._running = False
        self.shut_down = True

    @property
    def is_running(self) -> bool:
        return self._running

    @property
    def was_shut_down(self) -> bool:
        return self.shut_down

    def num_unfinished(self) -> int:
        return len(self._unfinished)

    async def abort(self, request_id: str) -> None:
        if request_id in self._unfinished:
            self.aborted.append(request_id)
            self._unfinished.discard(request_id)

    async def generate(
        self, prompt_ids: list[int], options: SamplingOptions, request_id: str
    ) -> AsyncIterator[TokenDelta]:
        self.prompts.append(list(prompt_ids))
        self.options.append(options)
        tokens = self.script(list(prompt_ids), options)
        self._unfinished.add(request_id)
        try:
            sent = 0
            while request_id in self._unfinished:
                await asyncio.sleep(self.delay)
                chunk = tokens[sent : sent + self.step][: options.max_tokens - sent]
                sent += len(chunk)
                stop = next((i for i, t in enumerate(chunk) if t in options.stop_token_ids), None)
                if stop is not None:
                    chunk, reason = chunk[: stop + 1], "stop"
                elif sent >= options.max_tokens:
                    reason = "length"
                elif sent >= len(tokens):
                    reason = "stop"
                else:
                    reason = None
                if reason is not None:
                    self._unfinished.discard(request_id)
                yield TokenDelta(tuple(chunk), reason)
                if reason is not None:
                    return
            yield TokenDelta((), "abort")
        finally:
            if request_id in self._unfinished:
                await self.abort(request_id)


def spark_ids() -> BiCodecIds:
    return BiCodecIds.from_lookup(spark_tokenizer().token_to_id)


def well_formed(ids: BiCodecIds, *, voice_globals: Sequence[int], semantics: int) -> Script:
    """A script that follows the Spark grammar; prefilled prompts get the semantic part only."""
    end_global, start_semantic = ids.marker("end_global_token"), ids.marker("start_semantic_token")

    def script(prompt: list[int], options: SamplingOptions) -> list[int]:
        speech = [ids.semantic_base + (i * 7) % 8192 for i in range(semantics)] + [ids.eos]
        if start_semantic in prompt:  # prefilled voice (transcript mode: then reference semantics)
            return speech
        head = [ids.marker("start_global_token"), *ids.global_ids(voice_globals), end_global]
        return [*head, start_semantic, *speech]

    return script


def make_checkpoint(root: Path, *, voices: dict | None = None) -> Path:
    """A checkpoint dir in the Spark layout: LLM/ (config + tokenizer) and an empty BiCodec/."""
    (root / "LLM").mkdir(parents=True, exist_ok=True)
    (root / "BiCodec").mkdir(exist_ok=True)
    (root / "LLM" / "config.json").write_text("{}")
    (root / "LLM" / "tokenizer.json").write_text(spark_tokenizer_json())
    if voices is not None:
        (root / "voices.json").write_text(json.dumps(voices))
    return root
