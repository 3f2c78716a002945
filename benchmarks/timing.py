"""Word-timing accuracy on speech with known word boundaries (espeak-ng), and its cost.

espeak-ng speaks each sentence (numbers and codes in their normalised spoken form, one written
word at a time, so every written word has a known span) and reports the sample where each word
starts. ``pipecat_veena.timing.align_words`` estimates the starts from the audio alone; the
baseline spreads the written characters over the same speech span (what LiveKit does between
annotations).

Two sets per language, Hindi (with code-mixed sentences) and English, in
``benchmarks/data/timing_{tuning,heldout}_{hi,en}.txt``: the tuning set, on which
``benchmarks/timing_tune.py`` chooses the method's constants, and the held-out set, which
nothing is tuned on: other sentences, spoken by voices and variants the tuning set does not use
(``HELDOUT``), at speaking rates and pitches it does not use either, over 120-250 words a
minute. Both are reported, per language and rate band.

    .venv/bin/python -m benchmarks.timing [--no-write]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks._espeak import Espeak, Synthesis
from benchmarks._report import cli, percentile, update_section
from pipecat_veena.normalize import normalize
from pipecat_veena.timing import align_words, find_speech, split_words

DATA = Path(__file__).resolve().parent / "data"
LANGUAGE_NAMES = {"hi": "Hindi", "en": "English"}
#: Rate bands of the report, words a minute: [low, high).
RATE_BANDS = ((120, 160), (160, 200), (200, 251))


@dataclass(frozen=True)
class Condition:
    """How espeak-ng speaks one sentence: voice (with variant), rate, pitch, pitch range."""

    voice: str
    rate: int
    pitch: int = 50
    pitch_range: int = 50


@dataclass(frozen=True)
class SpeechSet:
    """Sentences of one language and the voices, rates and pitches that speak them.

    Each sentence is spoken ``takes`` times, each under another condition drawn in turn from
    the tuples (strides prime to their lengths, so the combinations spread; deterministic).

    Parameters:
        name: "tuning" or "heldout" (the data file's middle word).
        language: "hi" or "en".
        voices: espeak-ng voices, optionally with a variant ("hi+f2").
        rates: words a minute.
        pitches: base pitches, 0-100.
        ranges: pitch ranges, 0-100.
        takes: conditions per sentence.
    """

    name: str
    language: str
    voices: tuple[str, ...]
    rates: tuple[int, ...]
    pitches: tuple[int, ...]
    ranges: tuple[int, ...]
    takes: int = 3

    def sentences(self) -> list[str]:
        """The set's sentences: one a line of its data file, ``#`` lines are comments."""
        path = DATA / f"timing_{self.name}_{self.language}.txt"
        lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
        return [line for line in lines if line and not line.startswith("#")]

    def items(self) -> Iterator[tuple[str, Condition]]:
        """(sentence, condition) pairs, ``takes`` per sentence."""
        for i, text in enumerate(self.sentences()):
            for k in range(self.takes):
                j = i * self.takes + k
                yield (
                    text,
                    Condition(
                        self.voices[j % len(self.voices)],
                        self.rates[(3 * j + i) % len(self.rates)],
                        self.pitches[(5 * j + k) % len(self.pitches)],
                        self.ranges[(7 * j + 2 * i) % len(self.ranges)],
                    ),
                )


#: What the method's constants are chosen on (benchmarks/timing_tune.py).
TUNING = {
    "en": SpeechSet(
        "tuning",
        "en",
        ("en", "en-us", "en-gb-x-rp", "en-029", "en+f2", "en-us+m3", "en-gb-x-rp+f4", "en+klatt"),
        (120, 140, 160, 180, 200, 225, 250),
        (35, 50, 65),
        (30, 50, 80),
    ),
    "hi": SpeechSet(
        "tuning",
        "hi",
        ("hi", "hi+f2", "hi+m3", "hi+f4", "hi+klatt", "hi+m2"),
        (120, 140, 160, 180, 200, 225, 250),
        (35, 50, 65),
        (30, 50, 80),
    ),
}
#: Never tuned on: other sentences, voices/variants, rates and pitches than ``TUNING``.
HELDOUT = {
    "en": SpeechSet(
        "heldout",
        "en",
        ("en-gb-scotland+f5", "en-us-nyc+m6"),
        (130, 150, 170, 190, 215, 240),
        (42, 58),
        (40, 65),
    ),
    "hi": SpeechSet(
        "heldout",
        "hi",
        ("hi+f5", "hi+m6"),
        (130, 150, 170, 190, 215, 240),
        (42, 58),
        (40, 65),
    ),
}


@dataclass
class Sample:
    """One spoken sentence: its audio and the true start (seconds) of each written word."""

    text: str
    language: str
    condition: Condition
    synth: Synthesis
    truth: list[float | None]


@dataclass
class Result:
    """Errors (seconds) of word starts, ours and the baseline's, and our CPU time."""

    ours: list[float] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)
    cpu_seconds: float = 0.0
    audio_seconds: float = 0.0

    def add(self, other: Result) -> None:
        """Fold ``other``'s errors and time into this one."""
        self.ours += other.ours
        self.baseline += other.baseline
        self.cpu_seconds += other.cpu_seconds
        self.audio_seconds += other.audio_seconds


def spoken_text(text: str, language: str) -> tuple[str, list[tuple[int, int]]]:
    """What espeak-ng is given (each written word normalised alone) and each written word's span
    in it."""
    parts, spans, pos = [], [], 0
    for a, b in split_words(text):
        word = text[a:b]
        spoken = normalize(word, language) if any(c.isdigit() or c in "₹%" for c in word) else word
        spans.append((pos, pos + len(spoken)))
        parts.append(spoken)
        pos += len(spoken) + 1
    return " ".join(parts), spans


def baseline_starts(text: str, start: float, end: float) -> list[float]:
    """Word starts spread over [start, end] by written characters (a word and its space)."""
    lengths = np.array([b - a + 1 for a, b in split_words(text)], dtype=float)
    cum = np.concatenate(([0.0], np.cumsum(lengths)))[:-1]
    return list(start + (end - start) * cum / lengths.sum())


def speak(
    espeak: Espeak,
    text: str,
    voice: str,
    rate: int = 175,
    *,
    pitch: int = 50,
    pitch_range: int = 50,
) -> tuple[Synthesis, list[float | None]]:
    """espeak-ng's speech of ``text`` and the true start (seconds) of each written word; None
    for a word espeak-ng reported no event in.

    Args:
        espeak: the library.
        text: the sentence as written.
        voice: an espeak-ng voice ("hi", "en-us+f2"); its language ("hi", "en") reads numbers.
        rate: words a minute.
        pitch: base pitch, 0-100.
        pitch_range: pitch range, 0-100.
    """
    spoken, spans = spoken_text(text, voice[:2])
    synth = espeak.synth(spoken, voice, rate=rate, pitch=pitch, pitch_range=pitch_range)
    truth: list[float | None] = []
    for a, b in spans:
        samples = [s for pos, s in synth.words if a <= pos < b]
        truth.append(min(samples) / synth.sample_rate if samples else None)
    return synth, truth


def synthesize(espeak: Espeak, speech: SpeechSet) -> list[Sample]:
    """Speak every (sentence, condition) of ``speech``."""
    samples = []
    for text, c in speech.items():
        synth, truth = speak(
            espeak, text, c.voice, c.rate, pitch=c.pitch, pitch_range=c.pitch_range
        )
        samples.append(Sample(text, speech.language, c, synth, truth))
    return samples


def evaluate(samples: list[Sample]) -> Result:
    """Compare estimated word starts with espeak-ng's over ``samples``."""
    result = Result()
    for s in samples:
        audio, rate = s.synth.audio, s.synth.sample_rate
        cpu = time.process_time()
        words = align_words(s.text, audio, rate, s.language)
        result.cpu_seconds += time.process_time() - cpu
        result.audio_seconds += len(audio) / rate
        found = find_speech(audio, rate)
        if found is None or len(words) != len(s.truth):
            raise RuntimeError(f"no timing for {s.text!r} ({s.condition})")
        base = baseline_starts(s.text, found[0], found[1])
        for w, b, t in zip(words, base, s.truth, strict=True):
            if t is not None:
                result.ours.append(abs(w.start - t))
                result.baseline.append(abs(b - t))
    return result


def _row(cells: list[str], r: Result) -> str:
    med, p90 = statistics.median(r.ours) * 1e3, percentile(r.ours, 0.9) * 1e3
    bmed, bp90 = statistics.median(r.baseline) * 1e3, percentile(r.baseline, 0.9) * 1e3
    return (
        f"| {' | '.join(cells)} | {len(r.ours)} | **{med:.0f}** | **{p90:.0f}** | "
        f"{bmed:.0f} | {bp90:.0f} |"
    )


TABLE_HEAD = [
    "| set | language | rate (wpm) | words | median ms | p90 ms | median ms (chars) "
    "| p90 ms (chars) |",
    "|---|---|---|---|---|---|---|---|",
]


def table(sets: dict[str, dict[str, list[Sample]]]) -> tuple[list[str], Result]:
    """Rows per set, language and rate band (and all rates), and the whole run's result."""
    rows = list(TABLE_HEAD)
    total = Result()
    for set_name, by_language in sets.items():
        for language, samples in by_language.items():
            every = Result()
            for lo, hi in RATE_BANDS:
                r = evaluate([s for s in samples if lo <= s.condition.rate < hi])
                every.add(r)
                rows.append(_row([set_name, LANGUAGE_NAMES[language], f"{lo}-{hi - 1}"], r))
            rows.append(_row([f"**{set_name}**", f"**{LANGUAGE_NAMES[language]}**", "all"], every))
            total.add(every)
    return rows, total


def _describe(speech: SpeechSet, samples: list[Sample]) -> str:
    return (
        f"{len(speech.sentences())} sentences x {speech.takes} = {len(samples)} recordings, "
        f"voices {', '.join(speech.voices)}; rates {', '.join(map(str, speech.rates))}; "
        f"pitch {'/'.join(map(str, speech.pitches))}, range {'/'.join(map(str, speech.ranges))}"
    )


def main(write: bool) -> str:
    """Run both sets in both languages; returns (and writes) the report's Markdown."""
    espeak = Espeak()
    align_words("warm up", np.zeros(1600, np.float32), 16000)
    sets = {
        "held-out": {lang: synthesize(espeak, HELDOUT[lang]) for lang in ("hi", "en")},
        "tuning": {lang: synthesize(espeak, TUNING[lang]) for lang in ("hi", "en")},
    }
    rows, total = table(sets)
    described = "; ".join(
        f"{kind} {LANGUAGE_NAMES[lang]}: {_describe(speech[lang], sets[label][lang])}"
        for kind, label, speech in (("held-out", "held-out", HELDOUT), ("tuning", "tuning", TUNING))
        for lang in ("hi", "en")
    )
    body = "\n".join(rows) + (
        "\n\nErrors are |estimated - true| word-start times; espeak-ng's C API reports the sample "
        "where each word starts. Sentences with money, times, codes, phone numbers, questions, "
        "lists, short and long ones, Hindi with English words, romanised Hinglish "
        "(benchmarks/data/timing_*.txt). `chars`: the written characters spread over the same "
        "speech span (the baseline). Targets on the held-out set: median <= 30 ms, p90 <= 80 ms "
        "per language. The held-out set shares no sentence, voice variant, rate or pitch with "
        "the tuning set (`python -m benchmarks.timing_tune` prints it alone). The constants "
        "of the valley search inside runs of speech, the closure onsets and the cost of a "
        "pause left inside a word were chosen on this tuning set (one constant at a time); "
        "the others earlier on a smaller set (two voices, 130/180/230 wpm). "
        f"{described}. "
        f"Cost: **{total.cpu_seconds / total.audio_seconds * 1e3:.2f} ms CPU per second of "
        f"audio** ({total.audio_seconds:.0f} s of audio, one core)."
    )
    if write:
        update_section(
            "timing", "Word timing: accuracy and cost", "python -m benchmarks.timing", body
        )
    return body


if __name__ == "__main__":
    cli(__doc__, main)
