"""Word timings released while a sentence's audio is still arriving.

``align_words`` (``pipecat_veena.timing``) places the words of a sentence on its complete audio,
which exists only once the sentence is generated: words timed that way reach the caller one
sentence late (a barge-in meanwhile cannot say which words were heard, and a page highlighting
the words starts behind the sound). ``WordStream`` times a sentence as its audio arrives:

* ``feed(audio)`` takes the next samples and returns the words the audio so far covers. It
  keeps a *speech clock*: seconds of speech since speech started, pauses left out (the pause
  detector of ``timing``, on 10 ms frames, run incrementally). A word's place on that clock is
  its units (``spoken_units``) before it times the speaking rate: seconds per unit of speech,
  the voice's own from its earlier sentences (``DEFAULT_SECONDS_PER_UNIT`` before any).
  A pause once speech resumes after it is an anchor: it goes to the word boundary nearest its
  clock time (a punctuation mark preferred), the words before it are placed between the anchors
  by their units, and the sentence's own rate so far replaces the prior. A word is released once
  the speech clock is ``RELEASE_MARGIN_S`` past its estimated end (or an anchor closes it), so a
  released word is always audio the listener has been sent. The last word is never provisional.
* ``finish()`` aligns the whole audio once it is complete and returns the words not released
  yet, placed by ``align_words``, corrected only forward: no word starts before the end of a
  word released earlier (if the alignment puts them earlier, they are spread over the time
  left). It also measures the sentence's speaking rate (``seconds_per_unit``), the next
  sentence's prior.

``feed`` then ``finish`` give every written word exactly once, in order, with non-decreasing
times: the same words as ``align_words``. The accuracy of provisional and final times is in
BENCHMARKS.md ("Provisional word times", ``python -m benchmarks.word_stream``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipecat_veena.interface import WordTiming
from pipecat_veena.normalize import LANGUAGES, sentence_language
from pipecat_veena.timing import (
    FLOOR_MARGIN_DB,
    FRAME_SECONDS,
    MIN_PAUSE_SECONDS,
    SPEECH_RANGE_DB,
    align_words,
    split_words,
    spoken_units,
)

__all__ = ["DEFAULT_SECONDS_PER_UNIT", "RELEASE_MARGIN_S", "WordStream"]

#: Seconds of speech per spoken unit before a voice's own rate is known (espeak-ng's Hindi and
#: English at about 175 words a minute; ``benchmarks/word_stream.py`` measures it).
DEFAULT_SECONDS_PER_UNIT = 0.06
#: A provisional word is released once the speech clock is this far past its estimated end.
RELEASE_MARGIN_S = 0.12
#: How many units of the sentence's own speech weigh as much as the prior rate (a rate the
#: voice was measured at / the default one).
PRIOR_UNITS = (12.0, 3.0)
#: A pause prefers a word boundary with punctuation: this many units of mismatch less for a
#: clause mark, a sentence end.
PUNCT_BONUS_UNITS = (0.0, 3.0, 4.0)
#: A frame counts as silent below max(floor + FLOOR_MARGIN_DB, level - SPEECH_RANGE_DB), with
#: the floor taken no higher than this far below the level (audio that is all speech so far).
_FLOOR_BELOW_LEVEL_DB = SPEECH_RANGE_DB + FLOOR_MARGIN_DB
#: A measured rate outside this range (a toy model's noise, a cut sentence) is not kept.
_RATE_RANGE = (0.02, 0.3)
_CLAUSE = ",;:—–-"
_SENTENCE = ".?!।॥…"


@dataclass(frozen=True)
class _Pause:
    """A pause in the speech: where on the speech clock, and its wall-clock span (seconds)."""

    clock: float
    start: float
    end: float


class WordStream:
    """The words of one sentence, timed while its audio arrives.

    Args:
        text: the sentence as written (its words are ``split_words(text)``).
        sample_rate: the audio's rate in Hz.
        language: "auto" (from the script), "hi" or "en": how numbers and codes are read.
        seconds_per_unit: the voice's speaking rate, seconds of speech per unit (None:
            ``DEFAULT_SECONDS_PER_UNIT``), as ``seconds_per_unit`` measured its earlier sentences.

    Raises:
        ValueError: an unknown ``language`` or a sample rate that is not positive.
    """

    def __init__(
        self,
        text: str,
        sample_rate: int,
        language: str = "auto",
        *,
        seconds_per_unit: float | None = None,
    ) -> None:
        if language not in LANGUAGES:
            raise ValueError(f"language must be one of {LANGUAGES}, got {language!r}")
        if sample_rate <= 0:
            raise ValueError(f"sample_rate must be positive, got {sample_rate}")
        self.text = text
        self.sample_rate = sample_rate
        self.language = language
        self._spans = split_words(text)
        lang = language if language != "auto" else (sentence_language(text) or "en")
        units = [max(spoken_units(text[a:b], lang), 0.5) for a, b in self._spans]
        self._cum = np.concatenate(([0.0], np.cumsum(units)))  # units before each word
        self._punct = [_punct_class(text[a:b]) for a, b in self._spans]
        self._prior = seconds_per_unit or DEFAULT_SECONDS_PER_UNIT
        self._prior_units = PRIOR_UNITS[seconds_per_unit is None]
        self._rate = self._prior  # seconds of speech per unit, as far as this sentence tells
        #: The sentence's speaking rate measured by ``finish()`` (None before, or unmeasurable).
        self.seconds_per_unit: float | None = None
        # Audio and its 10 ms frame levels so far.
        self._chunks: list[np.ndarray] = []
        self._samples = 0
        self._hop = max(1, round(sample_rate * FRAME_SECONDS))
        self._tail = np.zeros(0, np.float32)  # samples short of a whole frame
        self._db = np.zeros(256)
        self._frames = 0
        # The speech clock.
        self._lead: float | None = None  # where speech starts, seconds (None: not found yet)
        self._pauses: list[_Pause] = []  # complete pauses after the lead, in order
        self._scanned = 0  # frames before this are in ``_pauses`` or speech
        self._clock = 0.0  # seconds of speech so far
        # Released words and the last anchor: (clock, word boundary).
        self._released = 0
        self._floor = 0.0  # wall end of the last word released
        self._anchor = (0.0, 0)

    @property
    def released(self) -> int:
        """How many words have been released so far."""
        return self._released

    def feed(self, audio: np.ndarray) -> list[WordTiming]:
        """Take the sentence's next samples; the words the audio so far covers, not given yet.

        Args:
            audio: mono samples (float in [-1, 1] or int16) following the ones fed before.

        Returns:
            The words released now, in order, times in seconds from the sentence's first sample.
        """
        if len(audio):
            samples = _as_float(audio)
            self._chunks.append(samples)
            self._samples += len(samples)
            self._add_frames(samples)
        if len(self._spans) < 2 or not self._listen():
            return []
        words: list[WordTiming] = []
        for pause in self._new_pauses():
            words += self._at_pause(pause)
        self._tick()
        # Without an anchor since: word i ends at anchor + its units after it * rate.
        clock, k = self._anchor
        while self._released < len(self._spans) - 1:
            i = self._released
            end = clock + (self._cum[i + 1] - self._cum[k]) * self._rate
            if end + RELEASE_MARGIN_S > self._clock:
                break
            start = clock + (self._cum[i] - self._cum[k]) * self._rate
            words.append(self._word(i, self._wall(start, after=True), self._wall(end)))
        return words

    def finish(self) -> list[WordTiming]:
        """The words not released yet, aligned on the complete audio (call once, at its end)."""
        audio = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.float32)
        self._chunks = [audio]
        if self._listen():
            self._new_pauses()
            self._tick()
        rest = range(self._released, len(self._spans))
        total = self._samples / self.sample_rate
        aligned = align_words(self.text, audio, self.sample_rate, self.language, assume_speech=True)
        if len(aligned) >= 3 and self._lead is not None:
            # The rate up to the last word (a sentence's last word is drawn out).
            rate = self._clock_of(aligned[-1].start) / float(self._cum[-2])
            if _RATE_RANGE[0] <= rate <= _RATE_RANGE[1]:
                self.seconds_per_unit = rate
        if not rest:
            return []
        if len(aligned) == len(self._spans):
            starts = np.array([w.start for w in aligned[self._released :]])
            ends = np.array([w.end for w in aligned[self._released :]])
        else:  # no speech in it at all: the words share what is left by their units
            cum = self._cum[self._released :] - self._cum[self._released]
            scale = (max(total, self._floor) - self._floor) / max(cum[-1], 1e-9)
            starts, ends = self._floor + cum[:-1] * scale, self._floor + cum[1:] * scale
        first = float(starts[0])
        if first < self._floor:  # forward only: spread them over the time after the floor
            top = max(float(ends[-1]), total, self._floor)
            scale = (top - self._floor) / max(top - first, 1e-9)
            starts = self._floor + (starts - first) * scale
            ends = self._floor + (ends - first) * scale
        pairs = zip(rest, starts.tolist(), ends.tolist(), strict=True)
        return [self._word(i, start, end) for i, start, end in pairs]

    # -- the speech clock ------------------------------------------------------------------
    def _add_frames(self, samples: np.ndarray) -> None:
        """Frame levels (dB) of the new samples, 10 ms frames."""
        x = np.concatenate((self._tail, samples)) if len(self._tail) else samples
        n = len(x) // self._hop
        self._tail = x[n * self._hop :]
        if n == 0:
            return
        frames = x[: n * self._hop].reshape(n, self._hop)
        db = 10.0 * np.log10(np.einsum("ij,ij->i", frames, frames) / self._hop + 1e-10)
        if self._frames + n > len(self._db):
            self._db = np.concatenate((self._db, np.zeros(max(n, len(self._db)))))
        self._db[self._frames : self._frames + n] = db
        self._frames += n

    def _voiced(self, since: int) -> np.ndarray:
        """Which frames from ``since`` on are speech, by the levels heard so far."""
        db = self._db[: self._frames]
        floor, level = np.percentile(db, [5.0, 98.0])
        floor = min(floor, level - _FLOOR_BELOW_LEVEL_DB)
        if level < -70.0:  # below any speech level: silence so far
            return np.zeros(self._frames - since, bool)
        return db[since:] > max(floor + FLOOR_MARGIN_DB, level - SPEECH_RANGE_DB)

    def _listen(self) -> bool:
        """Find where speech starts (once).

        Returns:
            Whether speech has started.
        """
        if self._frames == 0:
            return False
        sec = self._hop / self.sample_rate
        if self._lead is None:
            voiced = np.flatnonzero(self._voiced(0))
            if voiced.size == 0:
                return False
            self._lead, self._scanned = float(voiced[0]) * sec, int(voiced[0])
        return True

    def _tick(self) -> None:
        """Bring the speech clock up to the last speech heard (after ``_new_pauses``)."""
        idx = np.flatnonzero(self._voiced(self._scanned))
        if idx.size:
            last = self._scanned + int(idx[-1]) + 1
            paused = sum(p.end - p.start for p in self._pauses)
            self._clock = last * self._hop / self.sample_rate - self._lead - paused

    def _new_pauses(self) -> list[_Pause]:
        """The pauses completed (speech resumed after them) since the last call."""
        sec = self._hop / self.sample_rate
        voiced = self._voiced(self._scanned)
        idx = np.flatnonzero(voiced)
        if idx.size == 0:
            return []
        inner = ~voiced[: int(idx[-1]) + 1]
        edges = np.flatnonzero(np.diff(np.concatenate(([0], inner.view(np.int8), [0]))))
        found = []
        base = self._scanned
        paused = sum(p.end - p.start for p in self._pauses)
        for a, b in zip(edges[::2], edges[1::2], strict=True):
            if (b - a) * sec >= MIN_PAUSE_SECONDS - 1e-9:
                start, end = (base + a) * sec, (base + b) * sec
                pause = _Pause(start - self._lead - paused, start, end)
                paused += end - start
                self._pauses.append(pause)
                found.append(pause)
                self._scanned = base + int(b)
        return found

    def _wall(self, clock: float, *, after: bool = False) -> float:
        """Seconds from the sentence's start of an instant of the speech clock.

        ``after``: an instant where a pause is goes after it (a word's start), else before it.
        """
        wall = (self._lead or 0.0) + clock
        for p in self._pauses:
            if p.clock < clock or (after and p.clock <= clock):
                wall += p.end - p.start
        return wall

    # -- anchors and words -----------------------------------------------------------------
    def _at_pause(self, pause: _Pause) -> list[WordTiming]:
        """A pause heard: anchor it at a word boundary; the words before it are placed."""
        clock, k0 = self._anchor
        first = max(k0 + 1, self._released)
        last = len(self._spans) - 1  # the last word stays after any pause
        if first > last:
            return []
        spoken = (pause.clock - clock) / self._rate  # units since the anchor, by the rate
        cost = [
            abs(self._cum[k] - self._cum[k0] - spoken) - PUNCT_BONUS_UNITS[self._punct[k - 1]]
            for k in range(first, last + 1)
        ]
        k = first + int(np.argmin(cost))
        # The words since the last release share the speech between it and the pause.
        words = []
        floor_clock = max(clock, self._clock_of(self._floor))
        lo = self._cum[self._released]
        span = self._cum[k] - lo
        if span > 0 and pause.clock > floor_clock:
            per_unit = (pause.clock - floor_clock) / span
            for i in range(self._released, k):
                start = floor_clock + (self._cum[i] - lo) * per_unit
                end = floor_clock + (self._cum[i + 1] - lo) * per_unit
                words.append(self._word(i, self._wall(start, after=True), self._wall(end)))
        self._anchor = (pause.clock, k)
        if self._cum[k] > 0:  # the sentence's own rate so far, weighed against the prior
            own = pause.clock / self._cum[k]
            weight = self._cum[k] / (self._cum[k] + self._prior_units)
            self._rate = self._prior + weight * (own - self._prior)
        return words

    def _clock_of(self, wall: float) -> float:
        """The speech clock at a wall instant (pauses before it left out)."""
        clock = wall - (self._lead or 0.0)
        for p in self._pauses:
            if p.end <= wall:
                clock -= p.end - p.start
            elif p.start < wall:
                clock -= wall - p.start
        return max(clock, 0.0)

    def _word(self, i: int, start: float, end: float) -> WordTiming:
        a, b = self._spans[i]
        start = max(start, self._floor)
        end = max(end, start)
        self._released = i + 1
        self._floor = end
        return WordTiming(self.text[a:b], round(start, 4), round(end, 4), a)


def _punct_class(word: str) -> int:
    """0: no punctuation after the word, 1: a clause mark, 2: a sentence end."""
    tail = word.rstrip("\"')]»”’")
    if tail and tail[-1] in _SENTENCE:
        return 2
    return 1 if tail and tail[-1] in _CLAUSE else 0


def _as_float(audio: np.ndarray) -> np.ndarray:
    audio = np.asarray(audio).reshape(-1)
    if audio.dtype == np.int16:
        return audio.astype(np.float32) / 32768.0
    return audio.astype(np.float32, copy=False)
