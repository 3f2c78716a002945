"""Word timings estimated from speech audio: the words as written, each with start and end seconds.

``align_words(text, audio, sample_rate)`` places the words of ``text`` (the caller's words:
"₹1,250" is one word) on a recording of that text. No acoustic model is involved (pure numpy):

1. Each word gets a spoken length in units: syllables of Latin words by their spelling (vowel
   groups, less a silent final e as in "takes", "lived", more for "create"; unstressed function
   words such as "the", "to" count less), aksharas of Devanagari words, letters of acronyms,
   and the normalised spoken form of numbers and codes (``pipecat_veena.normalize``), plus a
   share for its sounds (letters).
2. An energy detector finds where speech starts and ends and the pauses between (10 ms frames,
   a threshold relative to the recording's own speech and noise levels).
3. A small dynamic programme assigns pauses to boundaries between spoken words (preferring
   punctuation, keeping the speaking rate even between them; a number's spoken words are
   separate, as a speaker may pause inside "twelve thousand, four hundred"); a pause that is
   short for the recording's rate may stay inside a word (a stop closure). The rate is measured
   from the audio itself, never assumed.
4. Between two anchors a Viterbi search places the boundaries near the words' shares of the
   time by units, preferring energy valleys (words meet between syllables, where the level
   dips); a word that starts with a closure (a stop, a sibilant) starts where the level falls
   into its valley, and after a pause a word starting with a voiceless stop starts a closure's
   length before the speech resumes.

The results are estimates: on espeak-ng speech with known word boundaries (held-out set) the
median error of word starts is about 11-14 ms and the p90 about 70-80 ms
(``benchmarks/timing.py``, BENCHMARKS.md; the constants were chosen on a separate set,
``benchmarks/timing_tune.py``).
"""

from __future__ import annotations

import math
import re
import unicodedata

import numpy as np

from pipecat_veena.interface import WordTiming
from pipecat_veena.normalize import LANGUAGES, normalize, sentence_language

__all__ = [
    "SourceWords",
    "WordTiming",
    "align_words",
    "find_speech",
    "split_words",
    "spoken_units",
]

#: Analysis frame of the pause detector.
FRAME_SECONDS = 0.01
#: Shortest silence counted as a pause (stop closures inside words are shorter).
MIN_PAUSE_SECONDS = 0.08
#: A frame is silent below max(noise floor + FLOOR_MARGIN_DB, speech level - SPEECH_RANGE_DB).
FLOOR_MARGIN_DB = 12.0
SPEECH_RANGE_DB = 32.0
#: A word's spoken length in units: a vowel counts 1, a consonant CONSONANT_UNITS, a short
#: Hindi vowel (inherent a, i, u) SHORT_VOWEL_UNITS, a nasal sign NASAL_UNITS...
CONSONANT_UNITS = 0.65
SHORT_VOWEL_UNITS = 0.7
NASAL_UNITS = 0.2
#: ...plus this per spoken word (a number or code is read as several)...
WORD_UNITS = 1.3
#: ...plus this per pause inside its spoken form ("4 8 2, 9 1 3")...
PAUSE_UNITS = 1.0
#: ...and words before a clause or sentence end are this much longer (phrase-final lengthening).
FINAL_LENGTHENING = (1.0, 1.2, 1.2)

_WORD = re.compile(r"\S+")
_LATIN_VOWELS = re.compile(r"[aeiouy]+")
_NEEDS_NORMALIZING = re.compile(r"[0-9०-९@%&+=#/₹$€£°]")
_NASALS = "\u0900\u0901\u0902\u0903"
_SHORT_MATRAS = "\u093f\u0941\u0943"  # i, u, r
_SHORT_VOWELS = "\u0905\u0907\u0909\u090b"  # a, i, u, r
_PIECE_OR_PAUSE = re.compile(r"[\u0900-\u097f]+|[A-Za-z]+|[0-9]|[,;:।](?=\s*\S)")
_ACRONYM = re.compile(r"[A-Z]{2,6}s?")
_STRONG_END = re.compile(r"[.?!।॥…]+[\"')\]]*$")
_WEAK_END = re.compile(r"[,;:—–-]+[\"')\]]*$")
_VIRAMA = "\u094d"
# Punctuation class of a boundary -> cost of leaving it without a pause / bonus for one.
PUNCT_BONUS = (0.0, 3.0, 4.0)
NO_PUNCT_PAUSE_COST = 1.0
#: Cost per second of a pause left inside a word.
SKIP_COST = 10.0
#: A pause shorter than this many units (at the recording's own rate) is cheaper to leave
#: inside a word, in proportion.
CLOSURE_UNITS = 4.0
#: Most pauses one word segment may hold inside it.
MAX_SKIPPED = 6


def split_words(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the written words: non-space runs with a letter or digit.

    Tokens of punctuation or emoji alone are not words (nothing of them is spoken).
    """
    return [
        m.span()
        for m in _WORD.finditer(text)
        if any(unicodedata.category(ch)[0] in "LN" for ch in m.group())
    ]


class SourceWords:
    """Finds the words of a normalised text in the text it came from, in order.

    The engine splits and times ``normalize(text)`` (NFC, white space folded, control strings
    dropped); its callers' offsets point into ``text`` exactly as they passed it. A word of the
    normalised text (a run without white space) is the NFC form of a run of ``text``, or of a
    piece of one (a dropped control string splits a run), so ``find`` looks for it run by run,
    forward from the last word found.

    Args:
        text: the caller's text.
    """

    #: Runs ``find`` looks through past the last word found before it gives up on a word.
    LOOKAHEAD_RUNS = 256

    def __init__(self, text: str) -> None:
        self.text = text
        self._runs = [m.span() for m in _WORD.finditer(text)]
        self._run = 0  # the run the next word is looked for in
        self._within = 0  # characters of that run's NFC form used by words already found

    def find(self, word: str) -> tuple[int, int] | None:
        """The span of ``word`` (normalised) in the caller's text; None when it is not there.

        ``text[a:b]`` is the word as the caller wrote it (its NFC form is ``word``). Where a
        run is not in NFC and holds more than this word (a control string glued to a decomposed
        accent), the span is the whole run.
        """
        for run in range(self._run, min(len(self._runs), self._run + self.LOOKAHEAD_RUNS)):
            a, b = self._runs[run]
            raw = self.text[a:b]
            nfc = unicodedata.normalize("NFC", raw)
            found = nfc.find(word, self._within if run == self._run else 0)
            if found < 0:
                continue
            self._run, self._within = run, found + len(word)
            if nfc == raw:
                return a + found, a + found + len(word)
            return a, b
        return None


def _devanagari_units(word: str) -> float:
    """Sounds of a Devanagari word: its consonants and vowels.

    Vowels are matras, independent vowels and the inherent vowel of a consonant with no matra,
    except at the word's end (schwa deletion).
    """
    units = 0.0
    for i, ch in enumerate(word):
        if "\u0915" <= ch <= "\u0939" or "\u0958" <= ch <= "\u095f":
            units += CONSONANT_UNITS
            j = i + 1 + (word[i + 1 : i + 2] == "\u093c")  # past a nukta
            nxt = word[j : j + 1]
            if (not nxt or nxt in _NASALS) and i > 0:
                continue  # word-final: the inherent vowel is dropped
            if nxt != _VIRAMA and not "\u093e" <= nxt <= "\u094c":
                units += SHORT_VOWEL_UNITS  # inherent vowel
        elif ch in _SHORT_MATRAS or ch in _SHORT_VOWELS:
            units += SHORT_VOWEL_UNITS
        elif "\u093e" <= ch <= "\u094c" or "\u0904" <= ch <= "\u0914" or ch in "\u0960\u0961":
            units += 1.0
        elif ch in _NASALS:
            units += NASAL_UNITS
    return units


_DIGRAPH = re.compile(r"th|sh|ch|ph|ng|ck|wh|qu|(.)\1")
_SILENT = re.compile(r"gh|(?<=[aeiou])r(?![aeiouy])")  # through; or, for (non-rhotic)
#: Silent vowels of English spelling at a word's end: the e of "name", "takes", "lived"
#: (not after t/d: "wanted"; nor after a sibilant: "closes"), "-le" stays a syllable ("table").
_SILENT_END = re.compile(
    r"(?<=[^aeiouy])(?<![^aeiouy]l)e(?=s?$)(?<![sxzgc]e(?=s))|(?<=[^aeiouytd])e(?=d$)"
)
#: Vowel pairs read as two syllables ("create", "period", "science", "video").
_HIATUS = re.compile(r"ea(?=t)|i[ao](?!n)|eo(?!p)|uo|ua|ui(?=t)")


def _latin_syllables(word: str) -> int:
    """Syllables of an English (or romanised) word by its spelling.

    Vowel groups, less a silent final e (name, takes, lived), more for vowel pairs read apart
    (create, video).
    """
    core = _SILENT_END.sub("", word) if len(word) > 3 else word
    if core.startswith("y"):
        core = core[1:]  # you, yes: a consonant
    groups = len(_LATIN_VOWELS.findall(core)) + len(_HIATUS.findall(core))
    return max(1, groups)


#: English function words, spoken unstressed and short ("a", "the", "to"): ``REDUCED`` of
#: their units.
_FUNCTION_WORDS = frozenset(
    "a an the to of in on at by for from with as and or but if so is am are was were be been "
    "has have had do does did will would can could shall should may might must it its i me my "
    "we us our you your he him his she her they them their this that these those there than "
    "then not no".split()
)
REDUCED = 0.55


def _latin_units(word: str) -> float:
    """Sounds of a Latin word: syllables and consonants; an acronym is spelled out.

    Digraphs and doubled letters count once; OTP, EMI are read letter by letter.
    """
    if _ACRONYM.fullmatch(word):
        return (1.0 + CONSONANT_UNITS) * len(word.rstrip("s"))
    lower = word.lower()
    syllables = _latin_syllables(lower)
    sounds = _SILENT.sub("", _DIGRAPH.sub("x", lower))
    consonants = sum(1 for ch in sounds if ch not in "aeiouy")
    units = syllables + CONSONANT_UNITS * consonants
    return units * REDUCED if lower in _FUNCTION_WORDS else units


def spoken_units(word: str, language: str = "en") -> float:
    """The spoken length of one written word in vowel-like units (0 when nothing is spoken).

    Args:
        word: a written word ("नमस्ते", "hello", "OTP", "₹1,250").
        language: "hi" or "en": how its numbers and codes are read.

    Returns:
        A vowel counts 1 (a short Hindi vowel ``SHORT_VOWEL_UNITS``), a consonant
        ``CONSONANT_UNITS``, each spoken word ``WORD_UNITS`` more; numbers and codes count by their
        normalised spoken form.
    """
    return sum(units for units, _ in _spoken_pieces(word, language))


def _spoken_pieces(word: str, language: str) -> list[tuple[float, int]]:
    """The spoken words of one written word: (units, punctuation class after it) each.

    A number or code is several ("₹1,250": "one thousand two hundred fifty rupees"), and a
    speaker may pause between them; any other word is one piece.
    """
    normalised = bool(_NEEDS_NORMALIZING.search(word))
    if normalised:
        try:
            word = normalize(word, language if language in ("hi", "en") else "auto")
        except Exception:  # noqa: BLE001 (a rule's failure must not stop timing)
            pass
    pieces: list[list[float]] = []  # [units, class]
    for m in _PIECE_OR_PAUSE.finditer(word):
        piece = m.group()
        if not piece[0].isalnum() and not "\u0900" <= piece[0] <= "\u097f":  # a pause mark
            if pieces:
                pieces[-1][0] += PAUSE_UNITS
                pieces[-1][1] = 1
            continue
        units = WORD_UNITS
        if "\u0900" <= piece[0] <= "\u097f":
            units += _devanagari_units(piece)
        elif piece.isdigit():  # a digit the normaliser left: about one short word
            units += 1.0 + 2 * CONSONANT_UNITS
        else:
            units += _latin_units(piece)
        pieces.append([units, 0])
    if not pieces:
        if any(unicodedata.category(ch)[0] in "LN" for ch in word):
            return [(1.0 + CONSONANT_UNITS * len(word), 0)]  # another script: a guess
        return [(0.0, 0)]
    if not normalised:  # one written word, one piece
        return [(sum(u for u, _ in pieces), 0)]
    pieces[-1][1] = 0
    return [(u, c) for u, c in pieces]


def _frame_db(audio: np.ndarray, sample_rate: int) -> tuple[np.ndarray, int]:
    hop = max(1, int(round(sample_rate * FRAME_SECONDS)))
    n = len(audio) // hop
    if n == 0:
        return np.zeros(0), hop
    frames = audio[: n * hop].reshape(n, hop)
    power = np.einsum("ij,ij->i", frames, frames) / hop
    return 10.0 * np.log10(power + 1e-10), hop


def find_speech(
    audio: np.ndarray, sample_rate: int
) -> tuple[float, float, list[tuple[float, float]]] | None:
    """Where speech is in a recording: (start, end, pauses) in seconds, or None for silence.

    Args:
        audio: mono samples, float in [-1, 1] (or int16).
        sample_rate: their rate in Hz.

    Returns:
        The first and last voiced instants and the silent runs between them that last at least
        ``MIN_PAUSE_SECONDS``, as (start, end) pairs in order.
    """
    db, hop = _frame_db(_as_float(audio), sample_rate)
    found = _speech(db, hop / sample_rate)
    return None if found is None else found[:3]


def _speech(
    db: np.ndarray, sec: float
) -> tuple[float, float, list[tuple[float, float]], np.ndarray] | None:
    """find_speech on frame levels ``db`` of ``sec`` seconds each; also the voiced mask."""
    if db.size == 0:
        return None
    floor, level = np.percentile(db, [5.0, 98.0])
    if level < -70.0:  # below any speech level: silence
        return None
    voiced = db > max(floor + FLOOR_MARGIN_DB, level - SPEECH_RANGE_DB)
    idx = np.flatnonzero(voiced)
    if idx.size == 0:
        return None
    first, last = int(idx[0]), int(idx[-1]) + 1
    # Silent runs between first and last voiced frames.
    inner = ~voiced[first:last]
    edges = np.flatnonzero(np.diff(np.concatenate(([0], inner.view(np.int8), [0]))))
    min_frames = MIN_PAUSE_SECONDS / sec - 1e-9
    pauses = [
        ((first + a) * sec, (first + b) * sec)
        for a, b in zip(edges[::2], edges[1::2], strict=True)
        if b - a >= min_frames
    ]
    return first * sec, last * sec, pauses, voiced


def _as_float(audio: np.ndarray | bytes) -> np.ndarray:
    if isinstance(audio, bytes | bytearray | memoryview):
        audio = np.frombuffer(audio, dtype="<i2")
    audio = np.asarray(audio)
    if audio.ndim > 1:
        audio = audio.reshape(-1) if 1 in audio.shape else audio.mean(axis=0)
    if audio.dtype == np.int16:
        return audio.astype(np.float32) / 32768.0
    return audio.astype(np.float32, copy=False)


def _punct_class(word: str) -> int:
    """0: no punctuation after the word, 1: a clause mark (, ; :), 2: a sentence end."""
    if _STRONG_END.search(word):
        return 2
    if _WEAK_END.search(word):
        return 1
    return 0


def _place(
    units: np.ndarray,
    punct: list[int],
    start: float,
    end: float,
    pauses: list[tuple[float, float]],
) -> tuple[np.ndarray, np.ndarray, float, list[tuple[int, int, float, float]]]:
    """Word starts and ends from units, punctuation classes, the speech span and its pauses.

    A dynamic programme assigns pauses to word boundaries; between two anchors the words share
    the time by their units.

    Returns:
        The pieces' starts and ends (seconds), the speaking rate (seconds per unit, measured
        from this audio) and the runs of speech between anchors as (first piece, piece after
        the last, start, end), which ``_split_run`` refines.
    """
    n = len(units)
    cum = np.concatenate(([0.0], np.cumsum(units)))
    total = cum[-1]
    # Pause -> candidate boundaries b (1..n-1: between word b-1 and b) near its expected time.
    speech = max(1e-6, end - start - sum(b - a for a, b in pauses))
    rate = speech / total  # seconds per unit, measured from this audio
    # Cost of leaving each pause inside a word: a pause short for this speaking rate is as
    # likely a closure (stops, a geminate) or a breath inside a long number as a word boundary.
    skip = [SKIP_COST * (b - a) * min(1.0, (b - a) / (CLOSURE_UNITS * rate)) for a, b in pauses]
    options: list[list[int]] = []
    for a, _ in pauses:
        # Expected boundary position in units, counting only the speech before the pause.
        spoken_before = (a - start) - sum(min(q1, a) - q0 for q0, q1 in pauses if q0 < a)
        u = spoken_before / rate
        j = int(np.searchsorted(cum, u))
        window = min(6, max(3, int(0.15 * n)))
        options.append([c for c in range(j - window, j + window + 1) if 1 <= c <= n - 1])
    # Anchors in time order: (time the next segment starts, boundary, pause index, time the
    # previous segment ends). The first is the speech start, the last the speech end.
    order: list[tuple[float, int, int, float]] = [(start, 0, -1, start)]
    order += [(b, c, k, a) for k, (a, b) in enumerate(pauses) for c in options[k]]
    order.append((end, n, len(pauses), end))
    by_pause: list[list[int]] = [[] for _ in range(len(pauses) + 1)]
    for i, anchor in enumerate(order[1:], start=1):
        by_pause[anchor[2]].append(i)
    best: dict[int, tuple[float, int]] = {0: (0.0, -1)}  # anchor -> (cost, previous anchor)
    for i in range(1, len(order)):
        _, c, k, t_before = order[i]
        # Predecessors: the start, or an anchor of one of the few pauses before (bounds the
        # work on long audio; skipping more pauses than that costs more than it saves).
        previous = [0] + [j for q in range(max(0, k - MAX_SKIPPED), k) for j in by_pause[q]]
        bonus = 0.0
        if k < len(pauses):  # a pause assigned to boundary c
            bonus = PUNCT_BONUS[punct[c - 1]] - (NO_PUNCT_PAUSE_COST if punct[c - 1] == 0 else 0)
        choice = None
        for j in previous:
            tj, cj, kj, _ = order[j]
            if j not in best or cj >= c:
                continue
            cost_j = best[j][0]
            du = cum[c] - cum[cj]
            dt = max(t_before - tj, 1e-3)
            cost = cost_j + du * math.log(dt / (du * rate)) ** 2 - bonus
            # Pauses skipped between the two anchors: silence inside words.
            cost += sum(skip[kj + 1 : k])
            if choice is None or cost < choice[0]:
                choice = (cost, j)
        if choice is not None:
            best[i] = choice
    chain = [len(order) - 1]
    while chain[-1] != 0:
        chain.append(best[chain[-1]][1])
    chain.reverse()
    starts = np.empty(n)
    ends = np.empty(n)
    segments = []
    for p, q in zip(chain, chain[1:], strict=False):
        t0, c0 = order[p][0], order[p][1]
        c1, t1 = order[q][1], order[q][3]
        seg = cum[c0 : c1 + 1] - cum[c0]
        times = t0 + max(t1 - t0, 0.0) * seg / max(seg[-1], 1e-9)
        starts[c0:c1] = times[:-1]
        ends[c0:c1] = times[1:]
        segments.append((c0, c1, t0, t1))
    return starts, ends, rate, segments


#: Inside a run of speech, word boundaries prefer energy valleys: the cost of a boundary is
#: less by VALLEY_WEIGHT times its valley's depth (in VALLEY_DB, at most 1); a word's length
#: off its share by a factor x costs DURATION_WEIGHT * units * log(x) ** 2.
VALLEY_WEIGHT = 1.0
VALLEY_DB = 5.0
DURATION_WEIGHT = 1.0
#: Half width of a valley's sides (s), and how far a boundary may move from its share (units).
VALLEY_SIDE_SECONDS = 0.08
SEARCH_UNITS = 2.0
#: A word that starts with a closure starts where the level falls to within EDGE_DB of its
#: valley's lowest frame (at most EDGE_FRAMES before it).
EDGE_DB = 3.0
EDGE_FRAMES = 3
_CLOSURE_ONSET = re.compile(
    r"[ptkqbdgjcs]|[\u0915-\u091e\u091f-\u0922\u0924-\u0927\u092a-\u092d\u0936-\u0938]"
)


def _valleys(db: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per frame, how deep it lies below the peaks on both sides, 0-1 (1: VALLEY_DB or more).

    Also the levels smoothed over three frames, which the depths are measured on.
    """
    smooth = np.convolve(db, np.ones(3) / 3, mode="same")
    w = max(1, int(round(VALLEY_SIDE_SECONDS / FRAME_SECONDS)))
    pad = np.concatenate((np.full(w, -np.inf), smooth, np.full(w, -np.inf)))
    win = np.lib.stride_tricks.sliding_window_view(pad, w + 1)
    left = win[: len(smooth)].max(axis=1)
    right = win[w : w + len(smooth)].max(axis=1)
    depth = np.minimum(left, right) - smooth
    return np.clip(depth / VALLEY_DB, 0.0, 1.0), smooth


def _to_closure_starts(
    c0: int,
    c1: int,
    closing: np.ndarray,
    smooth: np.ndarray,
    sec: float,
    starts: np.ndarray,
    ends: np.ndarray,
) -> None:
    """Move the boundaries before words that start with a closure (a stop, a sibilant).

    A valley's lowest frame lies inside the closure; the word starts where the level fell into
    it (``EDGE_DB``, ``EDGE_FRAMES``).
    """
    for i in range(c0 + 1, c1):
        if not closing[i]:
            continue
        f = int(round(starts[i] / sec))
        lo = int(math.floor(starts[i - 1] / sec)) + 1
        if f >= len(smooth) or f <= lo:
            continue
        floor = smooth[f] + EDGE_DB
        g = f
        while g - 1 > lo and smooth[g - 1] < floor and f - g < EDGE_FRAMES:
            g -= 1
        starts[i] = ends[i - 1] = g * sec


def _split_run(
    units: np.ndarray,
    c0: int,
    c1: int,
    t0: float,
    t1: float,
    evidence: np.ndarray,
    sec: float,
    starts: np.ndarray,
    ends: np.ndarray,
) -> None:
    """Place the boundaries between pieces c0..c1-1 of one run of speech (t0..t1) on valleys.

    A Viterbi search over 10 ms frames: each boundary within ``SEARCH_UNITS`` of its share by
    units, a piece's length off its share costing ``DURATION_WEIGHT``, a valley's depth saving
    ``VALLEY_WEIGHT``. Writes ``starts`` and ``ends`` of those pieces.
    """
    if c1 - c0 < 2 or t1 <= t0:
        return
    u = units[c0:c1]
    cum = np.concatenate(([0.0], np.cumsum(u)))
    r = (t1 - t0) / cum[-1]
    reach = max(2, int(round(SEARCH_UNITS * r / sec)))
    f0, f1 = t0 / sec, t1 / sec
    prev_f = np.array([f0])
    prev_c = np.array([0.0])
    back = []
    cand = []
    for b in range(1, c1 - c0 + 1):
        if b < c1 - c0:
            centre = f0 + cum[b] * r / sec
            lo = max(int(math.ceil(f0)) + 1, int(round(centre)) - reach)
            hi = min(int(math.floor(f1)) - 1, int(round(centre)) + reach)
            f = np.arange(lo, hi + 1, dtype=float)
            if f.size == 0:
                f = np.array([min(max(centre, f0), f1)])
            ev = VALLEY_WEIGHT * evidence[np.clip(f.astype(int), 0, len(evidence) - 1)]
        else:
            f = np.array([f1])
            ev = np.zeros(1)
        d = (f[:, None] - prev_f[None, :]) * sec
        ok = d > 0.5 * sec
        x = np.log(np.maximum(d, 1e-4) / (u[b - 1] * r))
        cost = prev_c[None, :] + DURATION_WEIGHT * u[b - 1] * x * x
        cost = np.where(ok, cost, np.inf)
        j = np.argmin(cost, axis=1)
        prev_c = cost[np.arange(len(f)), j] - ev
        back.append(j)
        cand.append(f)
        prev_f = f
    if not np.isfinite(prev_c[0]):
        return
    k = 0
    times = [t1]
    for b in range(len(cand) - 1, 0, -1):
        k = back[b][k]
        times.append(cand[b - 1][k] * sec)
    times.append(t0)
    times.reverse()
    starts[c0:c1] = times[:-1]
    ends[c0:c1] = times[1:]


#: A word starting with a voiceless stop starts with a silent closure this many units long
#: (at the recording's rate) before its burst: after a pause, the word starts that much before
#: the speech resumes.
CLOSURE_ONSET_UNITS = 0.8
_STOP_ONSET = re.compile(
    r"ch|(?:[ptkq]|c(?![eiy]))(?!h)|[\u0915\u0916\u091a\u091b\u091f\u0920\u0924\u0925\u092a]"
)


def _first_sound(word: str, language: str) -> str:
    """The start of ``word``'s spoken form (numbers and codes normalised), lower-cased."""
    if _NEEDS_NORMALIZING.search(word):
        try:
            word = normalize(word, language if language in ("hi", "en") else "auto")
        except Exception:  # noqa: BLE001 (a rule's failure must not stop timing)
            pass
    m = re.search(r"[^\W\d_]", word)
    return word[m.start() : m.start() + 3].lower() if m else ""


def _closures_before(
    words: list[str], language: str, starts: np.ndarray, ends: np.ndarray, rate: float
) -> None:
    """Move the start of a word after a pause (or the first) back over its stop's closure."""
    shift = CLOSURE_ONSET_UNITS * rate
    for i, w in enumerate(words):
        if i > 0 and ends[i - 1] >= starts[i] - 1e-9:
            continue
        if not _STOP_ONSET.match(_first_sound(w, language)):
            continue
        floor = ends[i - 1] if i > 0 else 0.0
        starts[i] = max(floor, starts[i] - shift)


def align_words(
    text: str,
    audio: np.ndarray | bytes,
    sample_rate: int,
    language: str = "auto",
    *,
    assume_speech: bool = False,
) -> list[WordTiming]:
    """Estimate where each written word of ``text`` is spoken in ``audio``.

    Args:
        text: what the audio says, as written (numbers, codes and symbols included).
        audio: mono speech: float samples in [-1, 1], int16 samples, or int16 PCM bytes.
        sample_rate: the audio's rate in Hz.
        language: "auto" (from the script), "hi" or "en": how numbers and codes are read.
        assume_speech: the audio is known to say the text (the engine's own output): where the
            detector finds no speech in it (a level with no pauses or dips, as a synthetic
            model's), the words share the whole audio by their units instead of getting none.

    Returns:
        One ``WordTiming`` per written word, in order, with non-decreasing times inside the audio;
        empty when the text has no words or the audio no speech (or none at all).

    Raises:
        ValueError: an unknown ``language`` or a sample rate that is not positive.
    """
    if language not in LANGUAGES:
        raise ValueError(f"language must be one of {LANGUAGES}, got {language!r}")
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be positive, got {sample_rate}")
    spans = split_words(text or "")
    if not spans:
        return []
    db, hop = _frame_db(_as_float(audio), sample_rate)
    sec = hop / sample_rate
    found = _speech(db, sec)
    if found is None and assume_speech and db.size:
        found = (0.0, db.size * sec, [], None)
    if found is None:
        return []
    start, end, pauses, _ = found
    lang = language if language != "auto" else (sentence_language(text) or "en")
    words = [text[a:b] for a, b in spans]
    # The dynamic programme places spoken pieces (a number is several), then each written
    # word spans its pieces.
    units_list: list[float] = []
    punct: list[int] = []
    first: list[int] = []
    for w in words:
        pieces = _spoken_pieces(w, lang)
        pieces[-1] = (pieces[-1][0], _punct_class(w))
        first.append(len(units_list))
        for u, c in pieces:
            units_list.append(max(u, 0.5 / len(pieces)) * FINAL_LENGTHENING[c])
            punct.append(c)
    units_arr = np.array(units_list)
    piece_starts, piece_ends, rate, segments = _place(units_arr, punct, start, end, pauses)
    if VALLEY_WEIGHT > 0:
        evidence, smooth = _valleys(db)
        closing = np.zeros(len(units_list), bool)
        for w, i in zip(words, first, strict=True):
            closing[i] = bool(_CLOSURE_ONSET.match(_first_sound(w, lang)))
        for c0, c1, t0, t1 in segments:
            _split_run(units_arr, c0, c1, t0, t1, evidence, sec, piece_starts, piece_ends)
            _to_closure_starts(c0, c1, closing, smooth, sec, piece_starts, piece_ends)
    last = [*first[1:], len(units_list)]
    starts = piece_starts[first]
    ends = piece_ends[[i - 1 for i in last]]
    _closures_before(words, lang, starts, ends, rate)
    return [
        WordTiming(w, round(float(s), 4), round(float(e), 4), a)
        for w, s, e, (a, _) in zip(words, starts, ends, spans, strict=True)
    ]
