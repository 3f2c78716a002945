"""Provisional word times (``pipecat_veena.word_stream``): accuracy, share released early, cost.

Each held-out voice of ``benchmarks.timing`` reads the held-out sentences in a row at three
rates (an answer of 20 sentences), fed to a ``WordStream`` in 80 ms pieces as the engine
decodes them; each sentence gets the rate measured on the ones before (as the engine does per
voice). Reported per language: the error of word starts released provisionally (a voice's
first sentence, which has only the default rate, apart), of those ``finish()`` gives after
them, the share of words released before their sentence's audio was complete, how far into the
audio a word is released after its true start, and what one ``feed`` costs.

    .venv/bin/python -m benchmarks.word_stream [--no-write]
"""

from __future__ import annotations

import time

from benchmarks._espeak import Espeak
from benchmarks._report import cli, percentile, update_section
from benchmarks.timing import HELDOUT, LANGUAGE_NAMES, speak
from pipecat_veena.engine.utterance import RATE_MEMORY
from pipecat_veena.word_stream import WordStream

#: Seconds of audio per ``feed`` (about one decoded chunk).
PIECE_S = 0.08
#: Sentences per voice and rate, and the rates (words a minute).
SENTENCES = 20
RATES = (130, 190, 240)


def measure(espeak: Espeak, language: str) -> dict[str, list[float]]:
    """Errors (s) of first-sentence and later provisional starts, final starts; lags; costs."""
    speech = HELDOUT[language]
    out: dict[str, list[float]] = {k: [] for k in ("first", "later", "final", "lag", "feed")}
    released = total = 0
    for v, rate in enumerate(RATES):
        voice = speech.voices[v % len(speech.voices)]
        prior = None
        for k, text in enumerate(speech.sentences()[:SENTENCES]):
            synth, truth = speak(espeak, text, voice, rate)
            sr, audio = synth.sample_rate, synth.audio
            ws = WordStream(text, sr, language, seconds_per_unit=prior)
            hop = round(PIECE_S * sr)
            words = []
            for i in range(0, len(audio), hop):
                t0 = time.perf_counter()
                got = ws.feed(audio[i : i + hop])
                out["feed"].append(time.perf_counter() - t0)
                heard = (i + hop) / sr
                for w in got:
                    t = truth[len(words)]
                    words.append(w)
                    if t is not None:
                        out["lag"].append(heard - t)
                        out["first" if k == 0 else "later"].append(abs(w.start - t))
            provisional = len(words)
            for w, t in zip(ws.finish(), truth[provisional:], strict=True):
                if t is not None:
                    out["final"].append(abs(w.start - t))
            released += provisional
            total += len(truth)
            if ws.seconds_per_unit:
                measured = ws.seconds_per_unit
                prior = measured if prior is None else prior + RATE_MEMORY * (measured - prior)
    out["share"] = [released / total]
    return out


def _ms(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{percentile(values, 0.5) * 1e3:.0f} / {percentile(values, 0.9) * 1e3:.0f}"


def main(write: bool) -> str:
    """Measure both languages; return (and with ``write`` record) the table."""
    espeak = Espeak()
    rows = [
        "| language | provisional, later sentences | provisional, first sentence | final "
        "(after provisional) | released early | release after true start | feed |",
        "|---|---|---|---|---|---|---|",
    ]
    for language in ("hi", "en"):
        m = measure(espeak, language)
        rows.append(
            f"| {LANGUAGE_NAMES[language]} | {_ms(m['later'])} | {_ms(m['first'])} | "
            f"{_ms(m['final'])} | {m['share'][0]:.0%} | {_ms(m['lag'])} | "
            f"{percentile(m['feed'], 0.5) * 1e6:.0f} / {percentile(m['feed'], 0.9) * 1e6:.0f} us |"
        )
    body = "\n".join(rows) + (
        "\n\nWord-start errors, median / p90 ms, against espeak-ng's own word starts (held-out "
        f"sentences and voices of `benchmarks.timing`, {SENTENCES} sentences a voice at "
        f"{', '.join(map(str, RATES))} wpm, fed in {PIECE_S * 1e3:.0f} ms pieces). "
        "`first sentence`: a voice's first, on the default rate; later ones start from the "
        "rate measured on those before. `final`: the words `finish()` places after the "
        "provisional ones (forward only, so they inherit a provisional overshoot). "
        "`release after true start`: audio seconds decoded past a word's true start when it "
        "is released (its estimated end plus the 0.12 s margin). `feed`: median / p90 time "
        "of one call."
    )
    if write:
        update_section(
            "word_stream", "Provisional word times", "python -m benchmarks.word_stream", body
        )
    return body


if __name__ == "__main__":
    cli(__doc__, main)
