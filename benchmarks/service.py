"""Time to first audio and real-time factor through real Pipecat pipelines, 1 to N at once.

Each "call" is a pipeline ``TTSSpeakFrame -> VeenaTTSService -> WavSink`` (pipecat_veena.wav_sink)
over ONE shared engine on a demo checkpoint. Time to first audio is measured from queuing the
text to the first audio frame reaching the sink; the real-time factor is the time to the last
audio frame over the seconds of audio produced.

    .venv/bin/python -m benchmarks.service [--kind spark] [--concurrency 1 4 16] \
        [--rates 16000 8000]

Each concurrency runs at every output rate in ``--rates`` (the codec's rate and 8 kHz, the
phone rate, by default), so the cost of resampling shows next to the codec-rate figures.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

from loguru import logger

from benchmarks._report import percentile, update_section
from pipecat_veena.demo import build_demo_checkpoint
from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.wav_sink import say_to_wav

TEXTS = [
    "नमस्ते! आपका order आज शाम तक deliver हो जाएगा।",
    "Your appointment is confirmed for Monday at ten in the morning.",
    "Kya aap apna account number bata sakte hain, please?",
    "मैं आपकी और क्या मदद कर सकती हूँ? Thank you for calling.",
]


async def _round(engine: VeenaEngine, n: int, rate: int, out: Path, seed: int) -> dict:
    before = engine._batcher.stats()
    results = await asyncio.gather(
        *(
            say_to_wav(
                engine,
                TEXTS[i % len(TEXTS)],
                out / f"{n}_{rate}_{i}.wav",
                seed=seed + i,
                sample_rate=rate,
            )
            for i in range(n)
        )
    )
    after = engine._batcher.stats()
    batches = after["batches"] - before["batches"]
    ttfa = [r.time_to_first_audio for r in results if r.time_to_first_audio is not None]
    rtf = [r.real_time_factor for r in results if r.real_time_factor is not None]
    return {
        "n": n,
        "rate": rate,
        "ok": sum(1 for r in results if r.audio_seconds > 0 and not r.errors),
        "ttfa_p50": percentile(ttfa, 0.5) * 1000,
        "ttfa_p95": percentile(ttfa, 0.95) * 1000,
        "rtf_mean": statistics.fmean(rtf),
        "rtf_max": max(rtf),
        "audio": sum(r.audio_seconds for r in results),
        "batch_mean": (after["windows"] - before["windows"]) / batches if batches else 0.0,
    }


async def main(kind: str, concurrency: list[int], rates: list[int], write: bool) -> str:
    checkpoint = build_demo_checkpoint(kind)
    engine = VeenaEngine(EngineConfig(checkpoint=checkpoint))
    await engine.start()
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for n in concurrency:
                for rate in rates or [engine.sample_rate]:
                    rows.append(await _round(engine, n, rate, Path(tmp), seed=100 * n))
                    logger.info(f"benchmark service: {rows[-1]}")
    finally:
        await engine.shutdown()
    lines = [
        f"Demo checkpoint `{kind}` ({engine.sample_rate} Hz codec); pipelines at the output "
        "rate given (8000: a phone call, resampled as it streams).",
        "",
        "| concurrent pipelines | output Hz | completed | TTFA p50 ms | TTFA p95 ms | RTF mean "
        "| RTF worst | audio s | mean decode batch |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['n']} | {r['rate']} | {r['ok']}/{r['n']} | {r['ttfa_p50']:.0f} | "
            f"{r['ttfa_p95']:.0f} | "
            f"{r['rtf_mean']:.2f} | {r['rtf_max']:.2f} | {r['audio']:.1f} | "
            f"{r['batch_mean']:.2f} |"
        )
    body = "\n".join(lines)
    if write:
        update_section(
            f"service_{kind}",
            f"Pipecat pipelines on one engine ({kind} demo checkpoint, CPU)",
            f"python -m benchmarks.service --kind {kind} --concurrency "
            + " ".join(map(str, concurrency))
            + " --rates "
            + " ".join(map(str, rates)),
            body,
        )
    return body


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", default="spark")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--rates", type=int, nargs="+", default=[16000, 8000])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    print(asyncio.run(main(args.kind, args.concurrency, args.rates, not args.no_write)))
