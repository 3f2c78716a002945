"""Text handling before the model: speakability, sentence/clause splitting, length budgets.

Sentences come from ``sentencex`` (Latin and Devanagari ends: ``.!?…`` and the danda ``।`` /
``॥``). It replaced this module's own regex (a break after any ". ") because it keeps
abbreviations and numbers whole: "Rs. 500", "Dr. Rao", "Mr. Smith", "e.g. this", "no. 5",
"10 a.m. sharp" stayed one sentence only with sentencex. Two of its breaks are undone here: one
with no space after a full stop ("कि.मी.", "मि.ली.": sentencex splits inside those) and one
after an abbreviation it does not know ("डॉ. शर्मा", "approx. 500", "-Rs. 500"). Packing
sentences into length-budgeted parts and splitting long ones at clauses and words are unchanged.
"""

from __future__ import annotations

import re
import unicodedata

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
_CLAUSE_END = re.compile(r"(?<=[,;:—–])\s+")
_MARKUP = re.compile(r"<[^<>]{1,40}>|\[[^\[\]]{1,40}\]|[*_#`~|]+")
_SPACES = re.compile(r"\s+")


def normalize(text: str) -> str:
    """NFC-normalize and fold runs of white space into one space."""
    return _SPACES.sub(" ", unicodedata.normalize("NFC", text)).strip()


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


def split_sentences(text: str) -> list[str]:
    """Split ``text`` into sentences; their concatenation is ``text``, byte for byte.

    Args:
        text: any text (Latin, Devanagari or both).

    Returns:
        The sentences in order, each with the white space that followed it.
    """
    sentences: list[str] = []
    for piece in segment("hi", text):  # "hi" knows the English abbreviations too
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


def split_text(text: str, max_chars: int = DEFAULT_MAX_PART_CHARS) -> list[str]:
    """Split text into speakable parts of at most ``max_chars`` characters.

    Sentences are kept whole where they fit and packed greedily together; a longer sentence is
    split at clauses, then at word boundaries. Parts with nothing speakable are dropped.

    Args:
        text: the text to say (any script).
        max_chars: the length budget of one part.

    Returns:
        The parts, in order; empty when nothing is speakable.
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    pieces: list[str] = []
    for sentence in split_sentences(normalize(text)):
        sentence = sentence.strip()
        if sentence:
            pieces.extend(_split_long(sentence, max_chars))
    parts: list[str] = []
    for piece in pieces:
        if parts and len(parts[-1]) + 1 + len(piece) <= max_chars:
            parts[-1] = f"{parts[-1]} {piece}"
        else:
            parts.append(piece)
    return [p for p in parts if is_speakable(p)]


def max_speech_seconds(text: str) -> float:
    """Upper bound on the audio a text may produce before generation counts as a runaway."""
    return max(MIN_MAX_SECONDS, MAX_SECONDS_PER_CHAR * len(text))
