"""Speak several texts into WAV files, one Pipecat pipeline per "call", over ONE shared engine.

No network, no transport: each call is ``TTSSpeakFrame -> VeenaTTSService -> WavSink``. This is
the pattern every bot follows: start one VeenaEngine per process before any pipeline (loading
vLLM takes longer than Pipecat's 20 s setup window), then give each call its own service.

Run (demo checkpoint: random voice, sound not words):
    .venv/bin/python examples/wav_bot.py --out-dir out/
With a real checkpoint:
    .venv/bin/python examples/wav_bot.py --model /models/Spark-TTS-0.5B --voice female
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from loguru import logger

from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.wav_sink import say_to_wav

TEXTS = [
    "नमस्ते! मैं आपकी कैसे मदद कर सकती हूँ?",
    "Your order has shipped and will arrive on Friday.",
    "Aapka appointment kal subah das baje confirm ho gaya hai. Thank you!",
]


async def main(model: Path, voice: str | None, out_dir: Path, sample_rate: int) -> None:
    """Start one engine, then speak every text concurrently, one pipeline each."""
    engine = VeenaEngine(EngineConfig(checkpoint=model))
    await engine.start()  # once per process
    try:
        results = await asyncio.gather(
            *(
                say_to_wav(
                    engine, text, out_dir / f"call{i}.wav", voice=voice, sample_rate=sample_rate
                )
                for i, text in enumerate(TEXTS)
            )
        )
    finally:
        await engine.shutdown()
    for result in results:
        logger.info(result.summary())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="checkpoint dir (default: demo)")
    parser.add_argument("--voice", default=None)
    parser.add_argument("--out-dir", type=Path, default=Path("out"))
    parser.add_argument("--sample-rate", type=int, default=16000)
    args = parser.parse_args()
    if args.model is None:
        from pipecat_veena.demo import build_demo_checkpoint

        args.model = build_demo_checkpoint("spark")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    asyncio.run(main(args.model, args.voice, args.out_dir, args.sample_rate))
