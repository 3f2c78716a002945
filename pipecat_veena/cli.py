"""The ``pipecat-veena`` command line: ``build-demo`` and ``say`` (the only module that prints)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _build_demo(args: argparse.Namespace) -> int:
    from pipecat_veena.demo import DEMO_KINDS, build_demo_checkpoint

    kinds = DEMO_KINDS if args.kind == "all" else (args.kind,)
    for kind in kinds:
        path = build_demo_checkpoint(kind, dir=args.dir)
        print(f"{kind}: {path}")
    print(
        "Demo checkpoints have random codec weights and a toy LLM: they make sound, not words. "
        "Use --model with a real checkpoint directory (Spark-TTS-0.5B layout, Veena3, Veena) "
        "for speech."
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``pipecat-veena``."""
    parser = argparse.ArgumentParser(prog="pipecat-veena", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("build-demo", help="build (or reuse) the deterministic demo checkpoints")
    demo.add_argument("--dir", type=Path, default=None, help="where to put them (default: cache)")
    demo.add_argument("--kind", default="all", help="spark, spark-tiny, veena or all")
    demo.set_defaults(func=_build_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
