"""The word-timing method's tuning set: what ``pipecat_veena/timing.py``'s constants are chosen on.

The sentences are ``benchmarks/data/timing_tuning_{hi,en}.txt``, spoken by the voices, rates and
pitches of ``benchmarks.timing.TUNING``; the held-out set (``benchmarks.timing.HELDOUT``) shares
none of them and is never used here. Prints the tuning set's errors beside the baseline, per
language and rate band; writes nothing.

    .venv/bin/python -m benchmarks.timing_tune
"""

from __future__ import annotations

from benchmarks._espeak import Espeak
from benchmarks.timing import TUNING, synthesize, table


def main() -> str:
    """The tuning set's errors, ours beside the baseline, per language and rate band."""
    espeak = Espeak()
    rows, _ = table({"tuning": {lang: synthesize(espeak, TUNING[lang]) for lang in ("hi", "en")}})
    return "\n".join(rows)


if __name__ == "__main__":
    print(main())  # noqa: T201 (a command-line report)
