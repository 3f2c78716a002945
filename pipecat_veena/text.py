"""Text handling before the model: speakability, sentence/clause splitting, length budgets.

Latin and Devanagari punctuation are both sentence ends (``.!?`` and the danda ``।`` / ``॥``).
"""

from __future__ import annotations

import re
import unicodedata

#: Longest part sent to the model in one prompt (Veena3 chunks above ~220 characters).
DEFAULT_MAX_PART_CHARS = 220

#: Speaking-rate bounds used for the runaway cap: even very slow speech says about 4 characters
#: a second, so a part gets at most 0.25 s of audio per character (and never less than 3 s).
MAX_SECONDS_PER_CHAR = 0.25
MIN_MAX_SECONDS = 3.0

_SENTENCE_END = re.compile(r"(?<=[.!?।॥…])[\"'”’)\]]*\s+|(?<=[।॥])")
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
    for sentence in _SENTENCE_END.split(normalize(text)):
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
