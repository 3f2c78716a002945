"""A new user's first ``make demo`` against later ones: build time, first audio, real-time factor.

Runs ``pipecat-veena say`` (what ``make demo`` runs) in fresh processes as a new user would meet
it: an empty demo cache (``PIPECAT_VEENA_HOME``) and empty library caches (``XDG_CACHE_HOME``:
vLLM's model-inspection cache and the like), so the first run builds the demo checkpoints.
Then it runs again warm, and once more after dropping the page cache (as after a reboot: every
library and weight file read from disk again; needs root, skipped otherwise).

    .venv/bin/python -m benchmarks.first_run [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from loguru import logger

from benchmarks._report import publish

ROOT = Path(__file__).resolve().parent.parent
COMMAND = ".venv/bin/python -m benchmarks.first_run"
TEXT = "नमस्ते! Welcome to the pipecat-veena demo."
_RESULT = re.compile(
    r"wrote .*: (?P<audio>[\d.]+) s at \d+ Hz, first audio after (?P<ttfa>\d+) ms, "
    r"real-time factor (?P<rtf>[\d.]+)"
)


def _drop_page_cache() -> bool:
    """Write back and drop the page cache (root only); True when it was dropped."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def _say(env: dict[str, str], out: Path) -> dict:
    start = time.perf_counter()
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/pipecat-veena"), "say", TEXT, "-o", str(out)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - start
    match = _RESULT.search(proc.stdout + proc.stderr)
    if match is None:
        raise RuntimeError(f"pipecat-veena say printed no result:\n{proc.stdout[-2000:]}")
    build = re.search(r"demo LLMs built: .*train ([\d.]+) s", proc.stderr)
    return {
        "wall": wall,
        "train": float(build.group(1)) if build else None,
        **{k: float(v) for k, v in match.groupdict().items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "PIPECAT_VEENA_HOME": str(Path(tmp) / "home"),
            "XDG_CACHE_HOME": str(Path(tmp) / "cache"),
            "LOGURU_LEVEL": "INFO",
        }
        env.pop("PYTHONPATH", None)
        runs = [("first (builds the demo; empty caches)", _say(env, Path(tmp) / "1.wav"))]
        logger.info(f"first run: {runs[-1]}")
        runs.append(("second (warm)", _say(env, Path(tmp) / "2.wav")))
        logger.info(f"second run: {runs[-1]}")
        if _drop_page_cache():
            runs.append(("third (page cache dropped)", _say(env, Path(tmp) / "3.wav")))
            logger.info(f"third run: {runs[-1]}")
    lines = [
        f'`pipecat-veena say "{TEXT}"` (what `make demo` runs, set-up already done) in fresh '
        "processes, 2 cores; the first with an empty demo cache and empty library caches.",
        "",
        "| run | wall (whole command) | of it, training the demo LLMs | first audio | "
        "real-time factor |",
        "|---|---|---|---|---|",
    ]
    for name, r in runs:
        train = "–" if r["train"] is None else f"{r['train']:.0f} s"
        lines.append(
            f"| {name} | {r['wall']:.0f} s | {train} | {r['ttfa']:.0f} ms | {r['rtf']:.2f} |"
        )
    publish("first_run", "First run of the demo against later runs", COMMAND, lines,
            not args.no_write)  # fmt: skip


if __name__ == "__main__":
    main()
