"""A voices file with many enrolled voices: what reading and changing it costs, and how long the
event loop stalls while a server does it (issue 37: 20,000 voices stalled the loop about 1 s).

The engine reads the file on a worker thread (``VoicesFile.refresh``) and changes it on one
(``enroll_voice``, ``DELETE``); the loop only waits for them. A 1 ms ticker on the loop records
its longest stall meanwhile (what a speech request in flight would feel: the GIL is shared, so
a C-level JSON parse still holds it for its whole length).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

from loguru import logger

from benchmarks._report import cli, update_section
from pipecat_veena.engine.voices import PRINTS_FORMAT, Voice, VoiceBook
from pipecat_veena.engine.voices_file import VoicesFile

COUNTS = (1000, 20000)


def _book() -> VoiceBook:
    voices = {g: Voice(name=g, gender=i) for i, g in enumerate(("female", "male"))}
    return VoiceBook(voices, "female", controllable=True)


def _write(path: Path, count: int) -> None:
    enrolled = {
        f"voice-{i}": {"globals": [(i + j) % 4096 for j in range(32)], "owner": f"sha256:{i:016x}"}
        for i in range(count)
    }
    path.write_text(json.dumps({"format": PRINTS_FORMAT, "voices": {}, "enrolled": enrolled}))


async def _stall_s(work) -> tuple[float, float]:
    """(seconds ``work`` took, the loop's longest stall meanwhile)."""
    worst, done = 0.0, False

    async def ticker() -> None:
        nonlocal worst
        while not done:
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            worst = max(worst, time.perf_counter() - before - 0.001)

    tick = asyncio.ensure_future(ticker())
    await asyncio.sleep(0.01)
    start = time.perf_counter()
    await work()
    took = time.perf_counter() - start
    done = True
    await tick
    return took, worst


async def _measure(count: int) -> dict[str, float]:
    path = Path(tempfile.mkdtemp()) / "voices.json"
    _write(path, count)
    store = VoicesFile(path, "bench", lambda prefix: ())
    book = _book()
    figures = {"mb": path.stat().st_size / 1e6}
    start = time.perf_counter()
    store.reload(book)  # what the old engine did on its event loop, first read
    figures["first_read_s"] = time.perf_counter() - start
    start = time.perf_counter()  # the old engine's write, on its loop: indented JSON
    path.with_name("old.json").write_text(json.dumps(book.export_prints("bench"), indent=1))
    figures["old_write_s"] = time.perf_counter() - start

    async def reload() -> None:  # a replica's change seen: the file is read again
        path.touch()
        store._seen = None
        store.refresh(book, now=True)
        await store._reloading

    async def change() -> None:  # an enrolment: lock, read, merge, write
        name = f"new-{time.perf_counter_ns()}"
        await asyncio.to_thread(store.change, book, lambda b: b.enrol(name, [1] * 32, owner="x"))

    figures["reload_s"], figures["reload_stall_s"] = await _stall_s(reload)
    figures["change_s"], figures["change_stall_s"] = await _stall_s(change)
    return figures


def main(write: bool) -> str:
    """Measure each size; write the BENCHMARKS.md section."""
    logger.remove()
    lines = [
        "Enrolled voices with owners in one voices file. First read: the whole file parsed into "
        "the voices (blocking; the old engine did this, and each write, on its event loop). "
        "Reload: the file changed by another writer, read again on a worker thread (unchanged "
        "entries are not checked again). Change: one enrolment (lock, read, merge, atomic "
        "write) on a worker thread. Stall: the event loop's longest pause meanwhile. Old write: "
        "the old engine's indented write, on its loop (a stall that long). What stalls the "
        "loop now is the C JSON parser and encoder holding the GIL (5 MB at 20,000 voices); "
        "the default cap (`--max-enrolled-voices` 1000) keeps it to milliseconds.",
        "",
        "| voices | file MB | first read s | old write s | reload s | loop stall ms | change s "
        "| loop stall ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for count in COUNTS:
        f = asyncio.run(_measure(count))
        lines.append(
            f"| {count} | {f['mb']:.1f} | {f['first_read_s']:.2f} | {f['old_write_s']:.2f} | "
            f"{f['reload_s']:.2f} | "
            f"{1000 * f['reload_stall_s']:.0f} | {f['change_s']:.2f} | "
            f"{1000 * f['change_stall_s']:.0f} |"
        )
    body = "\n".join(lines)
    if write:
        update_section(
            "voices_file",
            "Voices file: reading and changing many enrolled voices off the event loop",
            "python -m benchmarks.voices_file",
            body,
        )
    return body


if __name__ == "__main__":
    cli(__doc__, main)
