"""Threads beside the vLLM CPU engine: first audio and real-time factor, 1 and 4 calls at once.

vLLM's CPU backend runs OpenMP threads inside its EngineCore process; the codec decodes in the
bot's process with torch's intra-op threads (torch's default: one per core). Three choices are
measured: the codec's thread count (and whether a stream's first, small windows run on one
thread: ``BiCodecCodec.single_thread_frames``); the OpenMP wait policy; and whether EngineCore's
threads are pinned. Settings of the OpenMP environment:

- *default*: nothing set, as a user runs it. The generator starts EngineCore with
  ``OMP_WAIT_POLICY=PASSIVE``, ``VLLM_CPU_OMP_THREADS_BIND=nobind`` and cores - 1 threads; the
  bot's own torch threads keep libgomp's default (a 300,000-iteration busy wait, then sleep).
- *PASSIVE everywhere*: ``OMP_WAIT_POLICY=PASSIVE`` for the bot's process too (its torch
  threads then sleep at once between parallel regions). Before 2026-12-02 this script set the
  policy for the whole process, so its "passive" rows were this setting, not the default.
- *pinned*: ``VLLM_CPU_OMP_THREADS_BIND=auto``, vLLM's own binding (the same thread count,
  bound to those cores, with EngineCore's Python helper threads inheriting the binding): the
  engine as it started before 2026-12-02.

Each setting runs in a fresh process (``torch.set_num_threads`` before the engine starts; the
decode thread inherits it), with pipelines ``TTSSpeakFrame -> VeenaTTSService -> WavSink`` on
one engine.

    .venv/bin/python -m benchmarks.threads [--kind spark] [--repeats 2] [--rounds 3]
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
#: (codec threads, OpenMP environment, frames a call may hold and still run on one thread;
#: None: the codec's default): the default first.
SETTINGS = (
    (2, "default", None),
    (2, "default", 0),
    (1, "default", None),
    (2, "PASSIVE everywhere", None),
    (2, "pinned", None),
)
#: Environment of each OpenMP setting (the module docstring says what each means).
POLICIES = {
    "default": {},
    "PASSIVE everywhere": {"OMP_WAIT_POLICY": "PASSIVE"},
    "pinned": {"VLLM_CPU_OMP_THREADS_BIND": "auto"},
}
#: What the parent's environment must not pass on (each setting sets its own).
_OMP_VARIABLES = (
    "OMP_WAIT_POLICY",
    "GOMP_SPINCOUNT",
    "OMP_NUM_THREADS",
    "VLLM_CPU_OMP_THREADS_BIND",
)


def _engine_cpu() -> float:
    """CPU seconds used so far by this process's vLLM engine processes (EngineCore)."""
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            if "VLLM" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                times = child.cpu_times()
                total += times.user + times.system
        except psutil.Error:
            continue
    return total


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
                    start, engine_start = time.process_time(), _engine_cpu()
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
                        "engine_cpu_per_audio_s": (_engine_cpu() - engine_start) / audio,
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
        env={
            **{k: v for k, v in os.environ.items() if k not in _OMP_VARIABLES},
            "LOGURU_LEVEL": "INFO",
            **POLICIES[policy],
        },
    )
    line = next(x for x in out.stdout.splitlines() if x.startswith("ROWS "))
    return json.loads(line[5:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="spark")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="settings alternate this often")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--small", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if args.child is not None:
        _child(args.kind, args.child, args.small, args.repeats)
        return
    results: dict[tuple[int, str, int | None], list[dict]] = {k: [] for k in SETTINGS}
    # The first engine process after a build or a quiet spell ran 1.3-2x slower than the later
    # ones (checkpoint not in the page cache, cold CPU caches): one run of the default first,
    # not counted.
    _run(args.kind, *SETTINGS[0], 1)
    for _ in range(args.rounds):  # alternate, so that drift in the machine's load hits all alike
        for setting in SETTINGS:
            results[setting] += _run(args.kind, *setting, args.repeats)
            logger.info(f"{setting}: {results[setting][-4:]}")
    lines = [
        f"*{args.kind}* demo checkpoint, codec dtype chosen by the start-up probe, "
        f"{os.cpu_count()} cores; each setting {args.rounds} fresh processes x {args.repeats} "
        "rounds per concurrency, settings alternating, after one uncounted warm-up process; "
        "medians over rounds (time to first "
        "audio: each round's median call; real-time factor: each round's mean call). The "
        "first setting is the default.",
        "",
        "| codec torch threads | OpenMP | calls at once | "
        "time to first audio | real-time factor | CPU per audio second: bot process; "
        "EngineCore |",
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
                f"{statistics.median(r['cpu_per_audio_s'] for r in rows):.2f} s; "
                f"{statistics.median(r['engine_cpu_per_audio_s'] for r in rows):.2f} s |"
            )
    publish("threads", "Threads beside the vLLM CPU engine", COMMAND, lines, not args.no_write)


def _default_small() -> int:
    from pipecat_veena.codecs.bicodec import BiCodecCodec

    return BiCodecCodec.single_thread_frames


if __name__ == "__main__":
    main()
