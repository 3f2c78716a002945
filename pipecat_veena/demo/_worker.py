"""Trains and writes the demo LLMs in a child process: ``python -m pipecat_veena.demo._worker``.

The parent (``build.py``) sets OpenMP's waiting in its environment, which OpenMP reads only at
start-up: a short spin on a quiet machine, passive waiting on a busy one, where the default
(long) spin makes two torch threads on 2 cores run several times slower than one.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    """Arguments: the output directory and the training steps."""
    from pipecat_veena.demo.build import train_llms

    directory, steps = Path(argv[0]), int(argv[1])
    train_llms(directory, steps)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
