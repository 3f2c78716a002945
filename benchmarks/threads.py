"""Threads beside the vLLM CPU engine: first audio and real-time factor, 1 and 4 calls at once.

vLLM's CPU backend binds its OpenMP threads to the cores it picks (``VLLM_CPU_OMP_THREADS_BIND``,
auto: all but one core on a small machine) inside its EngineCore process; the codec decodes in
the bot's process with torch's intra-op threads (torch's default: one per core). Two choices
are measured: the codec's thread count (and whether a stream's first, small windows run on
one thread: ``BiCodecCodec.single_thread_frames``), and how EngineCore's OpenMP threads wait
between steps
(``OMP_WAIT_POLICY``: the generator sets PASSIVE on CPU unless it is set; *spin* is libgomp's
behaviour when it is unset, a 300,000-iteration busy wait, on the core the codec shares). Each
setting runs in a fresh process (``torch.set_num_threads`` before the engine starts; the decode
thread inherits it), with pipelines ``TTSSpeakFrame -> VeenaTTSService -> WavSink`` on one engine.

    .venv/bin/python -m benchmarks.threads [--kind spark] [--repeats 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from loguru import logger

from benchmarks._report import publish

COMMAND = ".venv/bin/python -m benchmarks.threads"
CONCURRENCY = (1, 4)
#: (codec threads, EngineCore wait policy, frames a call may hold and still run on one thread;
#: None: the codec's default): the default first.
SETTINGS = ((2, "passive", None), (2, "passive", 0), (1, "passive", None), (2, "spin", None))
#: Environment of each wait policy (spin: libgomp's default when OMP_WAIT_POLICY is unset).
POLICIES = {
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin": {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "300000"},
}


async def _measure(kind: str, repeats: int) -> list[dict]:
    """In this process: one engine, ``repeats`` rounds at each concurrency; the figures."""
    import torch

    from benchmarks.service import TEXTS
    from pipecat_veena.demo import build_demo_checkpoint
    from pipecat_veena.engine import EngineConfig, VeenaEngine
    from pipecat_veena.wav_sink import say_to_wav

    engine = VeenaEngine(EngineConfig(checkpoint=build_demo_checkpoint(kind)))
    await engine.start()
    rows = []
    try:
        loop = asyncio.get_running_loop()
        decode_threads = await loop.run_in_executor(
            engine._batcher._executor, torch.get_num_threads
        )
        with tempfile.TemporaryDirectory() as tmp:
            for n in CONCURRENCY:
                for r in range(repeats):
                    start = time.process_time()
                    results = await asyncio.gather(
                        *(
                            say_to_wav(
                                engine, TEXTS[i % len(TEXTS)], Path(tmp) / f"{i}.wav", seed=7 + i
                            )  # fmt: skip
                            for i in range(n)
                        )
                    )
                    audio = sum(x.audio_seconds for x in results)
                    rows.append({
                        "calls": n,
                        "round": r,
                        "decode_threads": decode_threads,
                        "ttfa": statistics.median(x.time_to_first_audio for x in results),
                        "rtf": statistics.fmean(x.real_time_factor for x in results),
                        "cpu_per_audio_s": (time.process_time() - start) / audio,
                    })  # fmt: skip
    finally:
        await engine.shutdown()
    return rows


def _child(kind: str, threads: int, small: int | None, repeats: int) -> None:
    import torch

    from pipecat_veena.codecs.bicodec import BiCodecCodec

    torch.set_num_threads(threads)
    if small is not None:
        BiCodecCodec.single_thread_frames = small
    print("ROWS " + json.dumps(asyncio.run(_measure(kind, repeats))), flush=True)


def _run(kind: str, threads: int, policy: str, small: int | None, repeats: int) -> list[dict]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.threads",
            "--child",
            str(threads),
            *([] if small is None else ["--small", str(small)]),
            "--kind",
            kind,
            "--repeats",
            str(repeats),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "LOGURU_LEVEL": "INFO", **POLICIES[policy]},
    )
    line = next(x for x in out.stdout.splitlines() if x.startswith("ROWS "))
    return json.loads(line[5:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="spark")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="settings alternate this often")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--small", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.child is not None:
        _child(args.kind, args.child, args.small, args.repeats)
        return
    results: dict[tuple[int, str, int | None], list[dict]] = {k: [] for k in SETTINGS}
    for _ in range(args.rounds):  # alternate, so that drift in the machine's load hits all alike
        for setting in SETTINGS:
            results[setting] += _run(args.kind, *setting, args.repeats)
            logger.info(f"{setting}: {results[setting][-4:]}")
    lines = [
        f"*{args.kind}* demo checkpoint, codec dtype chosen by the start-up probe, "
        f"{os.cpu_count()} cores; each setting {args.rounds} fresh processes x {args.repeats} "
        "rounds per concurrency, settings alternating; medians over rounds (time to first "
        "audio: each round's median call; real-time factor: each round's mean call). The "
        "first setting is the default.",
        "",
        "| codec torch threads | EngineCore wait | calls at once | time to first audio | "
        "real-time factor | bot-process CPU per audio second |",
        "|---|---|---|---|---|---|",
    ]
    default_small = _default_small()
    for setting in SETTINGS:
        _, policy, small = setting
        small = default_small if small is None else small
        for n in CONCURRENCY:
            rows = [r for r in results[setting] if r["calls"] == n]
            threads = rows[0]["decode_threads"]
            one = f" (calls of <= {small} frames: 1)" if small and threads > 1 else ""
            lines.append(
                f"| {threads}{one} | {policy} | {n} | "
                f"{1000 * statistics.median(r['ttfa'] for r in rows):.0f} ms | "
                f"{statistics.median(r['rtf'] for r in rows):.2f} | "
                f"{statistics.median(r['cpu_per_audio_s'] for r in rows):.2f} s |"
            )
    publish("threads", "Threads beside the vLLM CPU engine", COMMAND, lines, not args.no_write)


def _default_small() -> int:
    from pipecat_veena.codecs.bicodec import BiCodecCodec

    return BiCodecCodec.single_thread_frames


if __name__ == "__main__":
    main()
