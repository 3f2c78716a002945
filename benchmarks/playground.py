"""The playground page on a demo checkpoint, in headless Chromium: does playback keep up?

Starts ``pipecat-veena serve`` on the demo checkpoint (``--kind``, default ``spark``: the real-size
codec, what ``pipecat-veena serve`` uses without ``--model``), opens ``/`` in Debian's Chromium
(the browser tests' launcher, ``tests/browser.py``), speaks each of the page's own examples in
turn and reads the page's figures (``window.playground.utterance``): first sound, real-time factor,
underruns (the player running dry after it started), samples played, and the words it
highlighted while they played.

    .venv/bin/python -m benchmarks.playground [--kind spark] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import tempfile
from pathlib import Path

from loguru import logger

from benchmarks._report import publish
from pipecat_veena.demo import build_demo_checkpoint

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the browser tests' Chromium launcher and server runner

COMMAND = ".venv/bin/python -m benchmarks.playground"
END = (
    "() => { const u = window.playground.utterance; return u && "
    "['completed', 'cancelled', 'failed'].includes(u.state) && "
    "['drained', 'stopped'].includes(u.playback); }"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _speak_examples(url: str, rounds: int) -> list[dict]:
    from browser import launch_chromium, open_page

    rows = []
    async for chromium in launch_chromium():
        async with open_page(chromium) as browser_page:
            page = browser_page.page
            await page.goto(url + "/")
            await page.wait_for_function("() => window.playground.ready !== null", timeout=120_000)
            labels = await page.eval_on_selector_all(
                "#examples option", "options => options.map(o => o.text)"
            )
            for round_ in range(rounds):
                for i, label in enumerate(labels):
                    await page.select_option("#examples", str(i))
                    await page.click("#speak")
                    await page.wait_for_function(END, timeout=300_000)
                    u = await page.evaluate("() => window.playground.utterance")
                    rows.append({"round": round_, "label": label, **u})
                    logger.info(
                        f"playground: {label!r}: {u['state']}, "
                        f"{u['samples'] / u['sampleRate']:.2f} s, "
                        f"first sound {u['firstSoundMs']} ms, rtf {u['rtf']}, "
                        f"underruns {u['underruns']} at {u['underrunsAt']}"
                    )
    return rows


def _highlights(row: dict) -> tuple[int, list[float]]:
    """(words the page highlighted, each one's lag in ms after its start played)."""
    words = row["words"]
    seen = {h["index"]: h["heard"] for h in row["highlights"] if h["index"] >= 0}
    lags = [1000 * (heard - words[i]["start"]) for i, heard in sorted(seen.items())]
    return len(seen), lags


def _p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))] if values else 0.0


def _section(kind: str, rows: list[dict]) -> str:
    lines = [
        f"`pipecat-veena serve` on the *{kind}* demo checkpoint (codec dtype chosen by the "
        "start-up probe), the page in headless Chromium on the same 2 cores, each of the page's "
        "examples "
        f"spoken in turn, {max(r['round'] for r in rows) + 1} rounds (the first utterance of the "
        "first round is the server's first). Figures are the page's own: first sound (Speak to "
        "the first sample that is not silence leaving the player), real-time factor (time "
        "taken over audio received), prebuffer (the audio the player waited for before it "
        "started: the page keeps what earlier answers taught it) and underruns (the player ran "
        "dry after it started). Words: those the page highlighted while they played, of all "
        "the answer's words (a word whose time reaches the page after its start played is "
        "skipped), and how long after its start played each highlighted word lit up "
        "(p50 / max).",
        "",
        "| round | example | audio | first sound | real-time factor | prebuffer | underruns | "
        "at seconds of audio played | words highlighted | highlight lag |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        sound = "–" if r["firstSoundMs"] is None else f"{r['firstSoundMs']:.0f} ms"
        rtf = "–" if r["rtf"] is None else f"{r['rtf']:.2f}"
        audio = r["samples"] / r["sampleRate"]
        at = ", ".join(f"{t:.2f}" for t in r["underrunsAt"]) or "–"
        shown, lags = _highlights(r)
        lag = f"{statistics.median(lags):.0f} / {max(lags):.0f} ms" if lags else "–"
        lines.append(
            f"| {r['round'] + 1} | {r['label']} | {audio:.2f} s | {sound} | {rtf} | "
            f"{1000 * r['prebuffer']:.0f} ms | {r['underruns']} | {at} | "
            f"{shown}/{len(r['words'])} | {lag} |"
        )
    rtfs = [r["rtf"] for r in rows if r["rtf"] is not None]
    runs = sum(r["underruns"] for r in rows)
    late = sum(1 for r in rows for t in r["underrunsAt"] if t > 1.0)
    shown = [_highlights(r) for r in rows]
    missed = [len(r["words"]) - n for r, (n, _) in zip(rows, shown, strict=True)]
    lags = [lag for _, row_lags in shown for lag in row_lags]
    lines += [
        "",
        f"{len(rows)} utterances: {runs} underruns in all, {late} of them after the first second "
        f"of audio; real-time factor median {statistics.median(rtfs):.2f}, worst "
        f"{max(rtfs):.2f}. Words highlighted: {sum(n for n, _ in shown)} of "
        f"{sum(len(r['words']) for r in rows)}; {sum(1 for m in missed if m)} answers skipped "
        f"any (at most {max(missed)} words in one); highlight lag median "
        f"{statistics.median(lags) if lags else 0:.0f} ms, p90 {_p90(lags):.0f} ms.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="spark", help="demo checkpoint (spark, spark-tiny)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()

    from browser import serve

    checkpoint = build_demo_checkpoint(args.kind)
    port = _free_port()
    command = [str(ROOT / ".venv/bin/pipecat-veena"), "serve", "--model", str(checkpoint)]
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "serve.log"
        with serve([*command, "--port", str(port)], port=port, log=log, ready_path="/ready"):
            rows = asyncio.run(_speak_examples(f"http://127.0.0.1:{port}", args.rounds))
    body = _section(args.kind, rows)
    title = "Playground page on the demo checkpoint"
    publish("playground", title, COMMAND, body, not args.no_write)


if __name__ == "__main__":
    main()
