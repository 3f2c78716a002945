"""The ``pipecat-veena`` command line: ``say`` and ``build-demo`` (the only module that prints)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
import warnings
from pathlib import Path

DEMO_NOTE = (
    "Demo checkpoints have random codec weights and a toy LLM: they make sound, not words. "
    "Point --model at a real checkpoint directory (Spark-TTS-0.5B layout or Veena3: LLM/ + "
    "BiCodec/; Veena: the LLM with a snac_24khz/ directory) for speech."
)


def _build_demo(args: argparse.Namespace) -> int:
    from pipecat_veena.demo import DEMO_KINDS, build_demo_checkpoint

    kinds = DEMO_KINDS if args.kind == "all" else (args.kind,)
    for kind in kinds:
        start = time.perf_counter()
        path = build_demo_checkpoint(kind, dir=args.dir)
        print(f"{kind}: {path} ({time.perf_counter() - start:.0f} s)")
    print(DEMO_NOTE)
    return 0


async def _say_async(args: argparse.Namespace, checkpoint: Path) -> int:
    from pipecat_veena.engine import EngineConfig, VeenaEngine
    from pipecat_veena.wav_sink import say_to_wav

    quiet = {} if args.verbose else {"engine_kwargs": {"use_tqdm_on_load": False}}
    engine = VeenaEngine(
        EngineConfig(checkpoint=checkpoint, device=args.device, generator_kwargs=quiet)
    )
    try:
        await engine.start()
        result = await say_to_wav(
            engine,
            args.text,
            args.output,
            voice=args.voice,
            sample_rate=args.sample_rate,
            seed=args.seed,
            language=None if args.language == "auto" else args.language,
            normalize=False if args.no_normalize else None,
        )
    finally:
        await engine.shutdown()
    for error in result.errors:
        print(f"error: {error}", file=sys.stderr)
    if result.audio_seconds == 0:
        print(result.summary(), file=sys.stderr)
        return 1
    print(f"wrote {result.summary()}")
    return 0


def _quiet(verbose: bool) -> None:
    """Keep the output to what the user needs: our warnings and errors, vLLM's errors only.

    vLLM's start-up warnings on CPU (no Triton, no tcmalloc, eager mode, tokenizer-less EOS)
    say nothing a user of this command can act on; ``-v`` shows everything.
    """
    if verbose:
        return
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="WARNING", format="{level}: {message}")
    # inherited by vLLM's engine process too
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    os.environ.setdefault("TORCH_LOGS", "-all")  # torch's own loggers: errors only
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("torch").setLevel(logging.ERROR)


def _say(args: argparse.Namespace) -> int:
    if args.model is None:
        from pipecat_veena.demo import build_demo_checkpoint

        checkpoint = build_demo_checkpoint("spark")
        print(f"using the demo checkpoint {checkpoint}")
        print(DEMO_NOTE)
    else:
        checkpoint = args.model
    _quiet(args.verbose)
    _check_voice(checkpoint, args.voice)  # before the engine loads (tens of seconds)
    return asyncio.run(_say_async(args, checkpoint))


def _check_voice(checkpoint: Path, voice: str | None) -> None:
    """Raise CheckpointError / UnknownVoiceError now rather than after loading the engine."""
    from pipecat_veena.checkpoint import detect_layout
    from pipecat_veena.voices import spark_voices, veena_voices

    layout = detect_layout(checkpoint)
    if layout.family == "bicodec":
        spark_voices(layout.root, 32).resolve(voice)
    else:
        veena_voices(layout.root).resolve(voice)


def _calibrate(args: argparse.Namespace) -> int:
    from pipecat_veena.calibrate import lookahead_curve, pick_lookahead
    from pipecat_veena.checkpoint import detect_layout
    from pipecat_veena.engine import EngineConfig, load_codec
    from pipecat_veena.streaming import StreamConfig

    if args.model is None:
        from pipecat_veena.demo import build_demo_checkpoint

        args.model = build_demo_checkpoint("spark")
        print(f"using the demo checkpoint {args.model} (random weights)")
    codec = load_codec(detect_layout(args.model), EngineConfig(checkpoint=args.model))
    base = StreamConfig.for_codec(codec)
    candidates = sorted({0, 2, 4, 8, 12, 16, 24, 32, codec.context_frames})
    curve = lookahead_curve(codec, candidates, base, frames=args.frames)
    print(f"{type(codec).__name__}: receptive field {codec.context_frames} frames")
    print("lookahead R (frames) | first audio (frames) | seam SNR vs offline decode")
    for r, snr in curve:
        print(f"{r:20d} | {base.first_frames + r:20d} | {snr:7.1f} dB")
    chosen = pick_lookahead(curve, args.target_db)
    print(
        f"smallest lookahead reaching {args.target_db} dB: {chosen} frames; use "
        f"EngineConfig(stream=StreamConfig(lookahead_frames={chosen}, ...)) or "
        f"EngineConfig(calibrate_seams_db={args.target_db})"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``pipecat-veena``."""
    parser = argparse.ArgumentParser(prog="pipecat-veena", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    say = sub.add_parser("say", help="speak text into a WAV file through a Pipecat pipeline")
    say.add_argument("text", help="what to say (Hindi, English or code-mixed)")
    say.add_argument("-o", "--output", type=Path, default=Path("out.wav"), help="WAV file")
    say.add_argument("--model", type=Path, default=None, help="checkpoint dir (default: demo)")
    say.add_argument("--voice", default=None, help="voice name (default: the model's)")
    say.add_argument("--sample-rate", type=int, default=None, help="WAV rate (default: codec's)")
    say.add_argument("--seed", type=int, default=None, help="sampling seed")
    say.add_argument(
        "--language",
        choices=("auto", "hi", "en"),
        default="auto",
        help="language of spoken numbers and dates (auto: per sentence, from its script)",
    )
    say.add_argument(
        "--no-normalize", action="store_true", help="pass digits and symbols to the model as is"
    )
    say.add_argument("--device", default="auto", help="codec device: auto, cpu, cuda")
    say.add_argument("-v", "--verbose", action="store_true", help="show debug logs")
    say.set_defaults(func=_say)

    cal = sub.add_parser("calibrate", help="measure the lookahead a checkpoint's codec needs")
    cal.add_argument("--model", type=Path, default=None, help="checkpoint dir (default: demo)")
    cal.add_argument("--target-db", type=float, default=80.0, help="seam SNR to reach")
    cal.add_argument("--frames", type=int, default=200, help="length of the random probe")
    cal.set_defaults(func=_calibrate)

    demo = sub.add_parser("build-demo", help="build (or reuse) the deterministic demo checkpoints")
    demo.add_argument("--dir", type=Path, default=None, help="where to put them (default: cache)")
    demo.add_argument("--kind", default="all", help="spark, spark-tiny, veena or all")
    demo.set_defaults(func=_build_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (2: bad input, named in one line)."""
    from pipecat_veena.errors import VeenaError

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (VeenaError, ValueError, FileNotFoundError) as e:
        print(f"pipecat-veena {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
