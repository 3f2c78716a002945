"""The speech server on CPU (spark-tiny demo checkpoint), all figures as ratios within one run.

1. Time to first audio through the server (RemoteVeenaEngine over a loopback WebSocket) against
   the same engine in-process, same text and seed, paired round by round.
2. Cancel -> vLLM request gone: a client sends ``cancel`` after the first audio; the time until
   vLLM no longer holds the request.
3. Load: N WebSocket clients for D seconds, each speaking one utterance after another and
   cancelling some at random: errors, unfinished requests at the end, server RSS growth, and
   whether every completed utterance's audio is the length its semantic tokens say.
4. Bad input: the malformed messages and requests of tests/protocol_fuzz.py against the real
   server: how many got an error, and whether it stayed healthy.

The server, the engine and the clients share one process and one event loop (the engine's vLLM
EngineCore is its own process), so the loopback figures include the clients' own work.

    .venv/bin/python -m benchmarks.serve [--clients 16] [--duration 60] [--rounds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import sys
import time
import tracemalloc
from collections import Counter
from contextlib import aclosing
from pathlib import Path

import httpx
import psutil
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import protocol_fuzz  # noqa: E402
from recording import ForwardingGenerator  # noqa: E402

from benchmarks._report import percentile, update_section  # noqa: E402
from pipecat_veena.demo import build_demo_checkpoint  # noqa: E402
from pipecat_veena.engine import (  # noqa: E402
    EngineConfig,
    VeenaEngine,
    detect_layout,  # noqa: E402
)
from pipecat_veena.generation import TokenGenerator  # noqa: E402
from pipecat_veena.generation.vllm_local import VllmGenerator  # noqa: E402
from pipecat_veena.remote import RemoteVeenaEngine  # noqa: E402
from pipecat_veena.remote.protocol import decode_audio_frame, parse_server_message  # noqa: E402
from pipecat_veena.server import ServerHandle, create_app  # noqa: E402

TEXTS = [
    "नमस्ते! आपका order आज शाम तक deliver हो जाएगा।",
    "Your appointment is confirmed for Monday at ten in the morning.",
    "Kya aap apna account number bata sakte hain, please?",
    "मैं आपकी और क्या मदद कर सकती हूँ? Thank you for calling.",
]
LONG = "This answer keeps going on and on, so that generation takes a good while. " * 3


class SemanticCounter(ForwardingGenerator):
    """The real generator, counting each server request's semantic tokens (then forgotten)."""

    def __init__(self, inner: TokenGenerator) -> None:
        super().__init__(inner)
        self.counts: Counter[str] = Counter()
        self.semantic = range(0)

    async def generate(self, prompt_ids, options, request_id):
        server_request = request_id.rsplit("-", 2)[0]  # drop the engine's "-<uuid>-<part>"
        async with aclosing(self.inner.generate(prompt_ids, options, request_id)) as deltas:
            async for delta in deltas:
                self.counts[server_request] += sum(t in self.semantic for t in delta.token_ids)
                yield delta


async def _first_audio_s(stream) -> float:
    start = time.perf_counter()
    async with aclosing(stream) as chunks:
        async for _ in chunks:
            return time.perf_counter() - start
    raise RuntimeError("no audio")


async def ttfa_rounds(engine: VeenaEngine, remote: RemoteVeenaEngine, rounds: int) -> dict:
    local, served = [], []
    for text in TEXTS:  # not counted: the first utterance of a voice also pins its globals
        await _first_audio_s(engine.stream(text))
        await _first_audio_s(remote.stream(text))
    await _settle(engine)
    for i in range(rounds):
        text, seed = TEXTS[i % len(TEXTS)], 1000 + i
        pair = [engine.stream(text, seed=seed), remote.stream(text, seed=seed)]
        first, second = pair if i % 2 == 0 else pair[::-1]  # alternate which goes first
        times = [await _first_audio_s(first), 0.0]
        await _settle(engine)
        times[1] = await _first_audio_s(second)
        await _settle(engine)
        local.append(times[0] if i % 2 == 0 else times[1])
        served.append(times[1] if i % 2 == 0 else times[0])
    added = [s - loc for s, loc in zip(served, local, strict=True)]
    return {
        "local_p50": percentile(local, 0.5) * 1000,
        "served_p50": percentile(served, 0.5) * 1000,
        "added_p50": percentile(added, 0.5) * 1000,
        "added_p95": percentile(added, 0.95) * 1000,
    }


async def _settle(engine: VeenaEngine, poll_s: float = 0.001, limit_s: float = 30.0) -> None:
    """Poll until vLLM holds no request (it has no event to wait on)."""
    for _ in range(int(limit_s / poll_s)):
        if not engine.stats()["unfinished_requests"]:
            return
        await asyncio.sleep(poll_s)
    raise RuntimeError(f"vLLM still holds requests after {limit_s:g} s: {engine.stats()}")


async def cancel_rounds(engine: VeenaEngine, url: str, rounds: int) -> dict:
    delays = []
    async with websockets.connect(url, compression=None) as ws:
        await ws.recv()  # ready
        for i in range(rounds):
            await ws.send(json.dumps({"type": "speak", "id": f"c{i}", "text": LONG}))
            while not isinstance(await ws.recv(), bytes):
                pass
            start = time.perf_counter()
            await ws.send(json.dumps({"type": "cancel", "id": f"c{i}"}))
            await _settle(engine, poll_s=0.0005)
            delays.append(time.perf_counter() - start)
            while True:  # drain to the done
                message = await ws.recv()
                if isinstance(message, str) and parse_server_message(message).type == "done":
                    break
    return {
        "p50": percentile(delays, 0.5) * 1000,
        "p95": percentile(delays, 0.95) * 1000,
        "n": rounds,
    }


async def _client(
    url: str, stop_at: float, seed: int, counter: SemanticCounter, totals: Counter, frame: int
) -> None:
    """One client: utterances back to back, ~30% cancelled; ``frame``: samples per token."""
    rng = random.Random(seed)
    async with websockets.connect(url, compression=None, max_size=None) as ws:
        ready = parse_server_message(await ws.recv())
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            uid = f"u{n}"
            cancel_after = rng.uniform(0.05, 1.0) if rng.random() < 0.3 else None
            await ws.send(json.dumps({"type": "speak", "id": uid, "text": rng.choice(TEXTS),
                                      "options": {"seed": rng.randrange(10**6)}}))  # fmt: skip
            samples, first, cancelled = 0, None, False
            while True:
                if cancel_after is not None and first and time.monotonic() - first > cancel_after:
                    await ws.send(json.dumps({"type": "cancel", "id": uid}))
                    cancel_after, cancelled = None, True
                try:
                    message = await asyncio.wait_for(ws.recv(), 0.05)
                except TimeoutError:
                    continue
                if isinstance(message, bytes):
                    first = first or time.monotonic()
                    samples += len(decode_audio_frame(message).pcm) // 2
                    continue
                event = parse_server_message(message)
                if event.type == "error":
                    totals["errors"] += 1
                    totals[f"error {event.code}"] += 1
                    break
                tokens = counter.counts.pop(event.request_id, 0)
                if event.reason == "cancelled" or cancelled:
                    totals["cancelled"] += 1
                    break
                totals["completed"] += 1
                totals["audio_s"] += samples / ready.sample_rate
                totals["length_mismatches"] += samples != tokens * frame
                break


async def load(engine: VeenaEngine, url: str, counter: SemanticCounter, clients: int,
               duration: float, *, trace: bool = False) -> dict:  # fmt: skip
    process = psutil.Process()
    totals: Counter = Counter()
    rss: list[float] = []

    async def sample() -> None:
        while True:
            rss.append(process.memory_info().rss / 2**20)
            await asyncio.sleep(duration / 12)

    sampler = asyncio.create_task(sample())
    if trace:  # the Python heap alone: what the server layer (and everything in Python) keeps
        gc.collect()
        tracemalloc.start()
        heap_before = tracemalloc.get_traced_memory()[0]
    stop_at = time.monotonic() + duration
    frame = engine._codec.samples_per_frame
    await asyncio.gather(
        *(_client(url, stop_at, i, counter, totals, frame) for i in range(clients))
    )
    await _settle(engine)
    sampler.cancel()
    rss.append(process.memory_info().rss / 2**20)
    heap_mb = None
    if trace:
        gc.collect()
        heap_mb = (tracemalloc.get_traced_memory()[0] - heap_before) / 2**20
        tracemalloc.stop()
    return {
        **totals,
        "unfinished": engine.stats()["unfinished_requests"],
        "rss": rss,
        "heap_mb": heap_mb,
    }


def _codes(totals: dict) -> str:
    codes = {k[6:]: v for k, v in totals.items() if k.startswith("error ")}
    return f" ({', '.join(f'{k}: {v}' for k, v in codes.items())})" if codes else ""


async def warm_up(engine: VeenaEngine, url: str, counter: SemanticCounter, clients: int) -> dict:
    """The load, in 10 s rounds, until RSS grows < 10 MB in a round (at most 90 s).

    The codec meets new batch shapes for a while under concurrent load and torch/oneDNN keep
    what they build for each (the in-process engine does the same); a leak keeps growing.
    """
    rss, seconds = [psutil.Process().memory_info().rss / 2**20], 0.0
    while seconds < 90:
        await load(engine, url, counter, clients, 10.0)
        seconds += 10
        rss.append(psutil.Process().memory_info().rss / 2**20)
        if rss[-1] - rss[-2] < 10:
            break
    return {"rss": rss, "seconds": seconds}


async def fuzz(server: ServerHandle) -> dict:
    rng = random.Random(7)
    answered = sent = 0
    async with websockets.connect(server.ws_url, compression=None) as ws:
        await ws.recv()
        for case in protocol_fuzz.ws_cases(rng, 250):
            sent += 1
            await ws.send(case)
            answered += parse_server_message(await ws.recv()).type == "error"
    async with httpx.AsyncClient(base_url=server.url) as http:
        for method, path, body in protocol_fuzz.http_cases(rng, 150):
            sent += 1
            r = await http.request(method, path, content=body)
            answered += 400 <= r.status_code < 500
        healthy = (await http.get("/health")).status_code == 200
    return {"sent": sent, "answered": answered, "healthy": healthy}


async def main(args: argparse.Namespace) -> str:
    checkpoint = build_demo_checkpoint("spark-tiny")
    config = EngineConfig(checkpoint=checkpoint)
    layout = detect_layout(checkpoint)
    counter = SemanticCounter(
        VllmGenerator(layout.llm_dir, max_model_len=config.max_model_len,
                      max_num_seqs=config.max_num_seqs)
    )  # fmt: skip
    engine = VeenaEngine(config, generator=counter)
    server = None
    try:
        await engine.start()
        ids = engine._format.ids
        counter.semantic = range(ids.semantic_base, ids.semantic_base + ids.num_semantic_codes)
        server = await ServerHandle(create_app(engine, owns_engine=False)).start()
        await server.state.wait_started()
        async with RemoteVeenaEngine(server.url) as remote:
            ttfa = await ttfa_rounds(engine, remote, args.rounds)
        cancels = await cancel_rounds(engine, server.ws_url, args.rounds)
        warm = await warm_up(engine, server.ws_url, counter, args.clients)
        loaded = await load(engine, server.ws_url, counter, args.clients, args.duration, trace=True)
        fuzzed = await fuzz(server)
    finally:
        if server is not None:
            await server.stop()
        await engine.shutdown()
        await counter.shutdown()
    body = "\n".join(
        [
            "| figure | measured | target |",
            "|---|---|---|",
            f"| time to first audio, in-process p50 | {ttfa['local_p50']:.1f} ms | |",
            f"| time to first audio, through the server p50 | {ttfa['served_p50']:.1f} ms | |",
            f"| added by the server, paired p50 / p95 ({args.rounds} rounds, same text and seed) "
            f"| {ttfa['added_p50']:.1f} / {ttfa['added_p95']:.1f} ms | p50 <= 5 ms |",
            f"| cancel -> vLLM request gone, p50 / p95 ({cancels['n']} cancels) "
            f"| {cancels['p50']:.1f} / {cancels['p95']:.1f} ms | p95 <= 50 ms |",
            f"| {args.clients} clients x {args.duration:g} s, random cancels: utterances "
            f"completed / cancelled | {loaded.get('completed', 0)} / "
            f"{loaded.get('cancelled', 0)} ({loaded.get('audio_s', 0):.0f} s of audio) | |",
            f"| ... errors | {loaded.get('errors', 0)}{_codes(loaded)} | 0 |",
            f"| ... unfinished vLLM requests at the end | {loaded['unfinished']} | 0 |",
            f"| ... completed utterances whose audio is not the length its tokens say "
            f"| {loaded.get('length_mismatches', 0)} | 0 |",
            f"| ... server process RSS growth over the run | "
            f"{loaded['rss'][-1] - loaded['rss'][0]:+.1f} MB (samples: "
            f"{', '.join(f'{r:.0f}' for r in loaded['rss'])} MB) | < 50 MB |",
            f"| ... Python heap growth over the run (tracemalloc: the server layer, the clients, "
            f"the engine's Python side) | {loaded['heap_mb']:+.2f} MB | |",
            f"| ... before it, the same load as warm-up ({warm['seconds']:g} s: until a 10 s round "
            f"adds < 10 MB, at most 90 s) | {warm['rss'][0]:.0f} -> {loaded['rss'][0]:.0f} MB "
            "| |",
            f"| malformed messages and requests answered with an error | {fuzzed['answered']} / "
            f"{fuzzed['sent']}, server {'healthy' if fuzzed['healthy'] else 'NOT healthy'} "
            "after | all, >= 200 |",
        ]
    )
    if not args.no_write:
        update_section(
            "serve",
            "Speech server on one engine (spark-tiny demo checkpoint, CPU, loopback)",
            f"python -m benchmarks.serve --clients {args.clients} --duration {args.duration:g} "
            f"--rounds {args.rounds}",
            "Server, engine and clients in one process and event loop; the clients' own work "
            "is in the loopback figures. RSS grows while the engine warms up under concurrent "
            "load (the codec meets new batch shapes; the in-process engine does the same "
            "without the server), hence the warm-up before the measured run.\n\n" + body,
        )
    return body


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--no-write", action="store_true")
    print(asyncio.run(main(parser.parse_args())))
