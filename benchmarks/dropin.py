"""Time to first audio through Cartesia's ``/tts/websocket`` beside our own WebSocket.

One server over the spark-tiny demo checkpoint (vLLM CPU); two raw WebSocket clients on
loopback, one per protocol, each kept open. Round by round, the same text is spoken through
both (which goes first alternates), from the client's send to the first audio message it
receives; Cartesia's request has no seed, so every engine request gets the same seed here (a
generator wrapper), which makes the pair generate the same tokens. The figure is the paired
difference: what the Cartesia layer adds (target: within 5 ms).

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
from pathlib import Path

import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from recording import ForwardingGenerator  # noqa: E402

from benchmarks._report import percentile, update_section  # noqa: E402
from pipecat_veena.demo import build_demo_checkpoint  # noqa: E402
from pipecat_veena.engine import EngineConfig, VeenaEngine, detect_layout  # noqa: E402
from pipecat_veena.generation.vllm_local import VllmGenerator  # noqa: E402
from pipecat_veena.server import ServerHandle, create_app  # noqa: E402

TEXTS = [
    "नमस्ते! आपका order आज शाम तक deliver हो जाएगा।",
    "Your appointment is confirmed for Monday at ten in the morning.",
    "Kya aap apna account number bata sakte hain, please?",
    "मैं आपकी और क्या मदद कर सकती हूँ? Thank you for calling.",
]
SEED = 1234


class SameSeed(ForwardingGenerator):
    """The real generator, every request with one seed (the same text: the same tokens)."""

    def generate(self, prompt_ids, options, request_id):
        return self.inner.generate(prompt_ids, dataclasses.replace(options, seed=SEED), request_id)


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


async def rounds(server: ServerHandle, n: int) -> dict:
    base = f"ws://{server.host}:{server.port}"
    async with (
        websockets.connect(f"{base}/v1/audio/stream", compression=None) as ours,
        websockets.connect(f"{base}/tts/websocket", compression=None) as cartesia,
    ):
        await ours.recv()  # ready
        for i, text in enumerate(TEXTS):  # not counted: warm-up, voices pinned
            await _ours(ours, -1 - i, text)
            await _cartesia(cartesia, -1 - i, text)
        mine, theirs = [], []
        for i in range(n):
            text = TEXTS[i % len(TEXTS)]
            if i % 2 == 0:
                mine.append(await _ours(ours, i, text))
                theirs.append(await _cartesia(cartesia, i, text))
            else:
                theirs.append(await _cartesia(cartesia, i, text))
                mine.append(await _ours(ours, i, text))
    added = [c - o for c, o in zip(theirs, mine, strict=True)]
    return {
        "ours_p50": percentile(mine, 0.5) * 1000,
        "cartesia_p50": percentile(theirs, 0.5) * 1000,
        "added_p50": percentile(added, 0.5) * 1000,
        "added_p95": percentile(added, 0.95) * 1000,
    }


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
    finally:
        if server is not None:
            await server.stop()
        await engine.shutdown()
        await generator.shutdown()
    return "\n".join(
        [
            "Raw WebSocket clients on loopback, one per protocol, the same text and seed per "
            "round (alternating which goes first); from the client's send to its first audio "
            "message. Cartesia's with `add_timestamps`, base64 audio in JSON. The paired p50 is "
            "the figure; the p95 measures the machine (load average at start / end: "
            f"{load[0]:.1f} / {load[1]:.1f} on {os.cpu_count()} cores).",
            "",
            "| figure | measured | target |",
            "|---|---|---|",
            f"| time to first audio, our WebSocket p50 | {figures['ours_p50']:.1f} ms | |",
            f"| time to first audio, `/tts/websocket` p50 | {figures['cartesia_p50']:.1f} ms | |",
            f"| added by the Cartesia layer, paired p50 / p95 ({args.rounds} rounds) "
            f"| {figures['added_p50']:.1f} / {figures['added_p95']:.1f} ms | p50 <= 5 ms |",
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
        "Drop-in endpoints: time to first audio beside our WebSocket (spark-tiny, CPU)",
        f"python -m benchmarks.dropin --rounds {args.rounds}",
        body,
    )
    print(f"wrote {path}")
