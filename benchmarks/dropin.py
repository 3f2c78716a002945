"""The drop-in endpoints: time to first audio beside our WebSocket, ElevenLabs' word times.

One server over the spark-tiny demo checkpoint (vLLM CPU); raw WebSocket clients on loopback,
one per protocol (ours, Cartesia's ``/tts/websocket``, ElevenLabs' ``multi-stream-input``), each
kept open. Round by round, the same text is spoken through each (the order rotates), from the
client's send to the first audio message it receives; the vendors' requests have no seed, so
every engine request gets the same seed here (a generator wrapper), which makes the three
generate the same tokens. The figure is the paired difference: what each layer adds (target:
within 5 ms). Then the stock clients (Pipecat's ``ElevenLabsTTSService``, LiveKit's
``elevenlabs.TTS``) speak a Hindi + English answer and each word's start as the client reads
it from the alignment is compared with the engine's (``alignment_errors``; the tests use it too).

    .venv/bin/python -m benchmarks.dropin [--rounds 40]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from recording import ForwardingGenerator  # noqa: E402

from benchmarks._report import percentile, update_section  # noqa: E402
from pipecat_veena.demo import build_demo_checkpoint  # noqa: E402
from pipecat_veena.engine import EngineConfig, VeenaEngine, detect_layout  # noqa: E402
from pipecat_veena.generation.vllm_local import VllmGenerator  # noqa: E402
from pipecat_veena.interface import WordTiming  # noqa: E402
from pipecat_veena.server import ServerHandle, create_app  # noqa: E402

TEXTS = [
    "नमस्ते! आपका order आज शाम तक deliver हो जाएगा।",
    "Your appointment is confirmed for Monday at ten in the morning.",
    "Kya aap apna account number bata sakte hain, please?",
    "मैं आपकी और क्या मदद कर सकती हूँ? Thank you for calling.",
]
#: The answer whose word times the stock ElevenLabs clients read ("₹1,250" is one word).
ANSWER = "Hello there, your OTP is 4821. आपका बिल ₹1,250 है। Please pay by Monday, thank you."
SEED = 1234
ELEVENLABS_QUERY = "model_id=eleven_flash_v2_5&output_format=pcm_16000&auto_mode=true"


class SameSeed(ForwardingGenerator):
    """The real generator, every request with one seed (the same text: the same tokens)."""

    def generate(self, prompt_ids, options, request_id):
        return self.inner.generate(prompt_ids, dataclasses.replace(options, seed=SEED), request_id)


# -- time to first audio --------------------------------------------------------------------
async def _ours(ws, i: int, text: str) -> float:
    start = time.perf_counter()
    await ws.send(json.dumps({"type": "speak", "id": f"o{i}", "text": text}))
    first = None
    while True:
        msg = await ws.recv()
        if isinstance(msg, bytes):
            first = first or time.perf_counter()
        elif json.loads(msg)["type"] in ("done", "error"):
            assert json.loads(msg)["type"] == "done", msg
            return first - start


async def _cartesia(ws, i: int, text: str) -> float:
    start = time.perf_counter()
    await ws.send(
        json.dumps({"context_id": f"c{i}", "transcript": text, "continue": False,
                    "voice": {"mode": "id", "id": "female"}, "add_timestamps": True,
                    "output_format": {"container": "raw", "encoding": "pcm_s16le",
                                      "sample_rate": 16000}})
    )  # fmt: skip
    first = None
    while True:
        msg = json.loads(await ws.recv())
        if msg["type"] == "chunk":
            first = first or time.perf_counter()
        elif msg["type"] in ("done", "error"):
            assert msg["type"] == "done", msg
            return first - start


async def _elevenlabs(ws, i: int, text: str) -> float:
    context = f"e{i}"
    start = time.perf_counter()
    await ws.send(json.dumps({"text": text, "context_id": context, "flush": True}))
    await ws.send(json.dumps({"text": "", "context_id": context, "flush": True}))
    await ws.send(json.dumps({"context_id": context, "close_context": True}))
    first = None
    while True:
        msg = json.loads(await ws.recv())
        assert "error" not in msg, msg
        if msg.get("audio"):
            first = first or time.perf_counter()
        if msg.get("isFinal"):
            return first - start


async def rounds(server: ServerHandle, n: int) -> dict:
    """Paired time to first audio: our WebSocket, Cartesia's and ElevenLabs' (ms)."""
    base = f"ws://{server.host}:{server.port}"
    eleven = f"{base}/v1/text-to-speech/female/multi-stream-input?{ELEVENLABS_QUERY}"
    async with (
        websockets.connect(f"{base}/v1/audio/stream", compression=None) as ours,
        websockets.connect(f"{base}/tts/websocket", compression=None) as cartesia,
        websockets.connect(eleven, compression=None) as elevenlabs,
    ):
        await ours.recv()  # ready
        clients = [(_ours, ours), (_cartesia, cartesia), (_elevenlabs, elevenlabs)]
        for i, text in enumerate(TEXTS):  # not counted: warm-up, voices pinned
            for speak, ws in clients:
                await speak(ws, -1 - i, text)
        times: list[list[float]] = [[], [], []]
        for i in range(n):
            text = TEXTS[i % len(TEXTS)]
            for k in range(3):  # (the order rotates)
                j = (i + k) % 3
                speak, ws = clients[j]
                times[j].append(await speak(ws, i, text))
    figures = {"ours_p50": percentile(times[0], 0.5) * 1000}
    for name, mine in (("cartesia", times[1]), ("elevenlabs", times[2])):
        added = [c - o for c, o in zip(mine, times[0], strict=True)]
        figures[f"{name}_p50"] = percentile(mine, 0.5) * 1000
        figures[f"{name}_added_p50"] = percentile(added, 0.5) * 1000
        figures[f"{name}_added_p95"] = percentile(added, 0.95) * 1000
    return figures


# -- ElevenLabs' word times as the stock clients read them ----------------------------------
@contextmanager
def engine_words() -> Iterator[list[WordTiming]]:
    """The words (engine times) the ElevenLabs endpoint sends while in the block."""
    from pipecat_veena.server import elevenlabs

    seen: list[WordTiming] = []
    real = elevenlabs.alignment

    def recording(words: list[WordTiming], closing_ms: int | None = None) -> dict[str, list]:
        seen.extend(words)
        return real(words, closing_ms)

    elevenlabs.alignment = recording
    try:
        yield seen
    finally:
        elevenlabs.alignment = real


@dataclasses.dataclass
class ClientWords:
    """One stock client's run: the words it reported (with its start times), the engine's, and
    the audio it got."""

    reported: list[tuple[str, float]]
    truth: list[WordTiming]
    samples: int
    sample_rate: int
    errors: list[str] = dataclasses.field(default_factory=list)

    @property
    def start_errors_ms(self) -> list[float]:
        """Per word: the client's start minus the engine's (ms)."""
        return [(t - w.start) * 1000 for (_, t), w in zip(self.reported, self.truth, strict=True)]


async def pipecat_words(
    ws_base: str, key: str, text: str, *, voice: str = "female", rate: int = 16000
) -> ClientWords:
    """Pipecat's ``ElevenLabsTTSService`` (stock; URL and key changed) speaks ``text``; the word
    times are those it hands its audio context (``add_word_timestamps``), read with its own
    running clock."""
    from pipecat.frames.frames import ErrorFrame, TTSAudioRawFrame, TTSSpeakFrame
    from pipecat.pipeline.worker import PipelineParams
    from pipecat.services.elevenlabs.tts import ElevenLabsTTSService
    from pipecat.tests.utils import run_test

    tts = ElevenLabsTTSService(
        api_key=key, url=ws_base, settings=ElevenLabsTTSService.Settings(voice=voice)
    )
    reported: list[tuple[str, float]] = []
    hand_on = tts.add_word_timestamps

    async def recording(word_times, context_id=None, **kwargs) -> None:
        reported.extend(word_times)
        await hand_on(word_times, context_id, **kwargs)

    tts.add_word_timestamps = recording  # (observed, then handed on unchanged)
    with engine_words() as truth:
        down, up = await run_test(
            tts,
            frames_to_send=[TTSSpeakFrame(text)],
            pipeline_params=PipelineParams(audio_out_sample_rate=rate),
        )
    samples = sum(len(f.audio) // 2 for f in down if isinstance(f, TTSAudioRawFrame))
    errors = [f.error for f in up if isinstance(f, ErrorFrame)]
    return ClientWords(reported, list(truth), samples, rate, errors)


async def livekit_words(
    base_url: str, key: str, text: str, *, voice: str = "female", **options: Any
) -> ClientWords:
    """LiveKit's ``elevenlabs.TTS`` (stock; base URL and key changed) streams ``text``; the word
    times are the ``TimedString`` starts it puts on its frames."""
    import aiohttp
    from livekit.agents import APIConnectOptions
    from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT
    from livekit.plugins import elevenlabs

    async with aiohttp.ClientSession() as session:
        tts = elevenlabs.TTS(
            api_key=key, base_url=base_url, voice_id=voice, http_session=session, **options
        )
        try:
            with engine_words() as truth:
                async with tts.stream(conn_options=APIConnectOptions(timeout=120)) as stream:
                    stream.push_text(text)
                    stream.end_input()
                    frames = [ev.frame async for ev in stream]
        finally:
            await tts.aclose()
    timed = [w for f in frames for w in f.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])]
    return ClientWords(
        [(str(w), w.start_time) for w in timed],
        list(truth),
        sum(f.samples_per_channel for f in frames),
        frames[0].sample_rate if frames else 0,
    )


def _error_row(name: str, run: ClientWords) -> str:
    errors = [abs(e) for e in run.start_errors_ms]
    shortest = min((w.end - w.start) * 1000 for w in run.truth)
    return (
        f"| {name} | {len(errors)} | {percentile(errors, 0.5):.2f} / {max(errors):.2f} ms "
        f"| {shortest:.0f} ms | within one word |"
    )


async def main(args: argparse.Namespace) -> str:
    checkpoint = build_demo_checkpoint("spark-tiny")
    config = EngineConfig(checkpoint=checkpoint)
    layout = detect_layout(checkpoint)
    generator = SameSeed(
        VllmGenerator(layout.llm_dir, max_model_len=config.max_model_len,
                      max_num_seqs=config.max_num_seqs)
    )  # fmt: skip
    engine = VeenaEngine(config, generator=generator)
    server = None
    try:
        await engine.start()
        server = await ServerHandle(create_app(engine, owns_engine=False)).start()
        await server.state.wait_started()
        load = [os.getloadavg()[0]]
        figures = await rounds(server, args.rounds)
        load.append(os.getloadavg()[0])
        ws_base = f"ws://{server.host}:{server.port}"
        pipecat = await pipecat_words(ws_base, "any-key", ANSWER)
        livekit = await livekit_words(f"{server.url}/v1", "any-key", ANSWER)
    finally:
        if server is not None:
            await server.stop()
        await engine.shutdown()
        await generator.shutdown()
    return "\n".join(
        [
            "Raw WebSocket clients on loopback, one per protocol, the same text and seed per "
            "round (the order rotates); from the client's send to its first audio message. "
            "Cartesia's with `add_timestamps`, ElevenLabs' with `auto_mode=true` (each text "
            "spoken as it comes), both base64 audio in JSON. The paired p50 is the figure; the "
            "p95 measures the machine (load average at start / end: "
            f"{load[0]:.1f} / {load[1]:.1f} on {os.cpu_count()} cores).",
            "",
            "| figure | measured | target |",
            "|---|---|---|",
            f"| time to first audio, our WebSocket p50 | {figures['ours_p50']:.1f} ms | |",
            f"| time to first audio, `/tts/websocket` p50 | {figures['cartesia_p50']:.1f} ms | |",
            "| time to first audio, `multi-stream-input` p50 "
            f"| {figures['elevenlabs_p50']:.1f} ms | |",
            f"| added by the Cartesia layer, paired p50 / p95 ({args.rounds} rounds) "
            f"| {figures['cartesia_added_p50']:.1f} / {figures['cartesia_added_p95']:.1f} ms "
            "| p50 <= 5 ms |",
            f"| added by the ElevenLabs layer, paired p50 / p95 ({args.rounds} rounds) "
            f"| {figures['elevenlabs_added_p50']:.1f} / {figures['elevenlabs_added_p95']:.1f} ms "
            "| p50 <= 5 ms |",
            "",
            "ElevenLabs' alignment as each stock client reads it (Pipecat: times relative to "
            "each message on a running clock; LiveKit: absolute), one Hindi + English answer "
            "with numbers: each word's start as the client reports it against the engine's.",
            "",
            "| client | words | start error p50 / max | shortest word | target |",
            "|---|---|---|---|---|",
            _error_row("Pipecat `ElevenLabsTTSService`", pipecat),
            _error_row("LiveKit `elevenlabs.TTS`", livekit),
        ]
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    body = asyncio.run(main(args))
    print(body)
    path = update_section(
        "dropin",
        "Drop-in endpoints: time to first audio beside our WebSocket, ElevenLabs word times "
        "(spark-tiny, CPU)",
        f"python -m benchmarks.dropin --rounds {args.rounds}",
        body,
    )
    print(f"wrote {path}")
