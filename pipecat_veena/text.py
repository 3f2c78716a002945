"""Text handling before the model: speakability, sentence/clause splitting, length budgets.

Sentences come from ``sentencex`` (Latin and Devanagari ends: ``.!?…`` and the danda ``।`` /
``॥``). It replaced this module's own regex (a break after any ". ") because it keeps
abbreviations and numbers whole: "Rs. 500", "Dr. Rao", "Mr. Smith", "e.g. this", "no. 5",
"10 a.m. sharp" stayed one sentence only with sentencex. Two of its breaks are undone here: one
with no space after a full stop ("कि.मी.", "मि.ली.": sentencex splits inside those) and one
after an abbreviation it does not know ("डॉ. शर्मा", "approx. 500", "-Rs. 500"). Packing
sentences into length-budgeted parts and splitting long ones at clauses and words are unchanged.

sentencex never sees a non-ASCII space (its Rust code panics on one before a full stop: "A\u00a0.
"), and a panic it raises anyway (``PanicException``, a ``BaseException``) falls back to a simple
split with a warning. Streamed text (``complete_sentences``) is cut where the same splitter cuts.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from loguru import logger
from sentencex import segment

#: Longest part sent to the model in one prompt (Veena3 chunks above ~220 characters).
DEFAULT_MAX_PART_CHARS = 220

#: Speaking-rate bounds used for the runaway cap: even very slow speech says about 4 characters
#: a second, so a part gets at most 0.25 s of audio per character (and never less than 3 s).
MAX_SECONDS_PER_CHAR = 0.25
MIN_MAX_SECONDS = 3.0

#: Abbreviations after which sentencex breaks but a sentence rarely ends.
_NO_BREAK_AFTER = re.compile(
    r"(?:(?:^|[\s(\-−])(?:डॉ|डा|प्रो|श्री|नं|रु|approx|Approx|No|no|Rs|Dr|Mr|Mrs|Ms|Prof|Sr|Jr|vs)"
    r"|\.[\u0900-\u097f]{1,3})\.\s*$"  # or a dotted Hindi abbreviation: कि.मी., मि.ली.
)
#: Every non-ASCII space (all lie below U+3001) -> " ", one character for one, so that offsets
#: in the copy sentencex reads are offsets in the text.
_ODD_SPACES = {c: " " for c in range(0x80, 0x3001) if chr(c).isspace()}
#: Where the fallback split cuts: after a sentence end and the white space that follows it.
_SIMPLE_BREAK = re.compile(r"(?<=[.!?…।॥])[\"'”’)\]]*\s+|(?<=[।॥])")
#: Next characters a streamed sentence end must be a break before, whatever comes (a capital, a
#: small letter, a digit, a Devanagari letter), to count as complete before the next text.
_NEXT_PROBES = ("A", "a", "1", "क")
_CLAUSE_END = re.compile(r"(?<=[,;:—–])\s+")
_MARKUP = re.compile(r"<[^<>]{1,40}>|\[[^\[\]]{1,40}\]|[*_#`~|]+")
_SPACES = re.compile(r"\s+")


def normalize(text: str) -> str:
    """NFC-normalize and fold runs of white space into one space."""
    return _SPACES.sub(" ", unicodedata.normalize("NFC", text)).strip()


def utf16_length(text: str) -> int:
    """Length of ``text`` in UTF-16 code units (JavaScript's ``length``).

    A character outside the Basic Multilingual Plane (most emoji) counts 2.
    """
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def is_speakable(text: str) -> bool:
    """True when ``text`` holds something to say: a letter or digit outside markup and tags."""
    stripped = _MARKUP.sub(" ", text)
    return any(unicodedata.category(ch)[0] in "LN" for ch in stripped)


def _split_long(piece: str, max_chars: int) -> list[str]:
    """Split a sentence longer than ``max_chars`` at clause marks, then at spaces."""
    parts: list[str] = []
    for clause in _CLAUSE_END.split(piece):
        while len(clause) > max_chars:
            cut = clause.rfind(" ", 0, max_chars + 1)
            if cut <= 0:  # one enormous word: cut it hard
                cut = max_chars
            parts.append(clause[:cut].strip())
            clause = clause[cut:].strip()
        if clause:
            parts.append(clause)
    return parts


def _simple_split(text: str) -> list[str]:
    """Sentences cut after each ``.!?…।॥`` and its white space (no abbreviations known)."""
    cuts = [0, *(m.end() for m in _SIMPLE_BREAK.finditer(text)), len(text)]
    return [text[a:b] for a, b in zip(cuts, cuts[1:], strict=False) if b > a]


def _segment(text: str) -> list[str]:
    """sentencex's sentences of ``text``, read with its odd spaces as plain ones."""
    plain = text.translate(_ODD_SPACES)
    try:
        pieces = list(segment("hi", plain))  # "hi" knows the English abbreviations too
    except BaseException as e:  # a Rust panic is a BaseException (pyo3's PanicException)
        if type(e).__name__ != "PanicException":
            raise
        logger.warning(f"sentencex panicked ({e}); splitting {len(text)} characters simply")
        return _simple_split(text)
    out, start = [], 0
    for piece in pieces:  # the same spans of the text itself, its own spaces kept
        out.append(text[start : start + len(piece)])
        start += len(piece)
    return out


def split_sentences(text: str) -> list[str]:
    """Split ``text`` into sentences; their concatenation is ``text``, byte for byte.

    Args:
        text: any text (Latin, Devanagari or both).

    Returns:
        The sentences in order, each with the white space that followed it.
    """
    sentences: list[str] = []
    for piece in _segment(text):
        if sentences and (
            not sentences[-1][-1:].isspace()
            and sentences[-1].endswith(".")
            or _NO_BREAK_AFTER.search(sentences[-1])
        ):
            sentences[-1] += piece
        else:
            sentences.append(piece)
    if "".join(sentences) != text:  # never lose text, whatever the splitter did
        return [text]
    return sentences


def complete_sentences(text: str) -> tuple[str, str]:
    """Split text still being written into its complete sentences and the unfinished rest.

    A sentence is complete where ``split_sentences`` ends it before text that has arrived, or
    where it would end it whatever letter or digit came next ("Hello. " is complete at once;
    "Pay Rs. ", "Dr. ", "10 a.m. " wait for the next word). Text appended word by word is thus
    cut where the whole text would be.

    Returns:
        (the complete sentences, the rest); their concatenation is ``text``.
    """
    sentences = split_sentences(text)
    last = sentences[-1] if sentences else ""
    if last[-1:].isspace() and all(
        split_sentences(last + probe)[0] == last for probe in _NEXT_PROBES
    ):
        return text, ""
    cut = len(text) - len(last)
    return text[:cut], text[cut:]


#: How far back from the end of the open text a mark (punctuation, a symbol, a line break) still
#: makes ``add_sentences`` re-split: past it, text the splitter could read as context for the
#: mark (the next word's first letters) has all arrived.
_SETTLED_CHARS = 32


def _plain(text: str) -> bool:
    """True when ``text`` holds only letters, digits, combining marks and plain spaces."""
    return all(c == " " or c.isalnum() or unicodedata.category(c)[0] == "M" for c in text)


def add_sentences(pending: str, text: str) -> tuple[str, str]:
    """``complete_sentences(pending + text)``, re-splitting only when ``text`` may end a sentence.

    For text streamed piece by piece: ``pending`` is the rest this (or ``complete_sentences``)
    returned for the text before. A sentence can only end at a mark (``.`` ``।`` ``?``, a line
    break...), so when ``text`` is plain (letters, digits, marks, spaces) and the last
    ``_SETTLED_CHARS`` characters of ``pending`` are too, nothing can be cut: ``text`` is added
    at once, without a splitter call (the work of that append is its own length). Otherwise the
    open sentence is split again, as ``complete_sentences`` does.

    Returns:
        (the complete sentences, the rest); their concatenation is ``pending + text``.
    """
    if _plain(text) and _plain(pending[-_SETTLED_CHARS:]):
        return "", pending + text
    return complete_sentences(pending + text)


@dataclass(frozen=True)
class Part:
    """One prompt of an utterance and the written text it speaks.

    Attributes:
        spoken: the text given to the model (the spoken form when normalising).
        written: the caller's text whose words end in this part, as written; "" while they
            continue into the next part (a long sentence split at clauses or words, and the
            sentences packed with its pieces, are timed together once its last piece is spoken).
        pause_s: a pause (SSML ``<break>``): that much silence here; ``spoken`` and ``written``
            are then "".
        rate: SSML ``<prosody rate>``: this part's speed (0.5-2.0) instead of the request's.
    """

    spoken: str
    written: str
    pause_s: float = 0.0
    rate: float | None = None


def split_parts(
    text: str,
    max_chars: int = DEFAULT_MAX_PART_CHARS,
    speak: Callable[[str], str] | None = None,
) -> list[Part]:
    """Split text into speakable parts of at most ``max_chars`` spoken characters.

    Sentences of the written text are turned into their spoken form one by one (``speak``), kept
    whole where they fit and packed greedily together; a longer sentence is split at clauses,
    then at word boundaries. Parts with nothing speakable are dropped.

    Args:
        text: the text to say (any script).
        max_chars: the length budget of one part.
        speak: the spoken form of one written sentence (None: as written).

    Returns:
        The parts, in order; empty when nothing is speakable.
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    pieces: list[tuple[str, str]] = []  # (spoken piece, written sentence it ends, or "")
    for sentence in split_sentences(normalize(text)):
        written = sentence.strip()
        if not written:
            continue
        spoken = normalize(speak(written)) if speak is not None else written
        split = _split_long(spoken, max_chars) or [""]
        pieces.extend(
            (piece, written if i == len(split) - 1 else "") for i, piece in enumerate(split)
        )
    packed: list[list[tuple[str, str]]] = []
    for piece in pieces:
        if packed and sum(len(p) + 1 for p, _ in packed[-1]) + len(piece[0]) <= max_chars:
            packed[-1].append(piece)
        else:
            packed.append([piece])
    parts: list[Part] = []
    pending: list[str] = []  # written sentences whose group is not closed yet
    for group in packed:
        pending += [w for _, w in group if w]
        spoken = " ".join(p for p, _ in group if p)
        closed = bool(group[-1][1])
        written = " ".join(pending) if closed else ""
        if closed:
            pending = []
        if is_speakable(spoken):
            parts.append(Part(spoken, written))
        elif written and parts:  # nothing to say: its words (if any) go with the part before
            last = parts[-1]
            parts[-1] = Part(last.spoken, f"{last.written} {written}".strip())
    if pending and parts:
        last = parts[-1]
        parts[-1] = Part(last.spoken, f"{last.written} {' '.join(pending)}".strip())
    return parts


def split_text(text: str, max_chars: int = DEFAULT_MAX_PART_CHARS) -> list[str]:
    """The spoken texts of ``split_parts(text, max_chars)`` (the text as written)."""
    return [part.spoken for part in split_parts(text, max_chars)]


def max_speech_seconds(text: str) -> float:
    """Upper bound on the audio a text may produce before generation counts as a runaway."""
    return max(MIN_MAX_SECONDS, MAX_SECONDS_PER_CHAR * len(text))
