"""Text streamed to an open WebSocket utterance (``append``) is cut into sentences incrementally.

Each ``append`` used to re-split all the text still open (``complete_sentences(pending +
text)``): a long sentence streamed a word at a time cost work quadratic in its length. Now
``add_sentences`` re-splits only when the new text could end a sentence; the cuts are the same
as before on a corpus streamed in many ways, and the splitter's work is counted (calls and
characters), not timed.
"""

from __future__ import annotations

import random
import re

import pytest

from pipecat_veena import text as text_module
from pipecat_veena.text import add_sentences, complete_sentences

CORPUS = [
    "Hello there. How are you today? I am fine! Thanks for asking.",
    "Please pay Rs. 500 to Dr. Rao by 10 a.m. sharp tomorrow. He said so.",
    "नमस्ते दुनिया। आप कैसे हैं? डॉ. शर्मा कल आएंगे। ठीक है॥ धन्यवाद।",
    'He said "Stop. Now." and left. Then (see p. 4. ok) she came back… Later.',
    "First paragraph without an end\n\nSecond paragraph. Third\nline here.",
    "Pi is 3.14 and e is 2.71. Visit example.com today. U.S.A. is big. e.g. this one.",
    "Emoji 😀 here. And 👩🏽‍🚀 there! Done?! Yes...   Spaces   and\u00a0nbsp.\tTab. End",
    "Aaj weather बहुत अच्छा है! Kal meeting 3 p.m. पर है। Mr. Singh aayenge.",
    " ".join(["word"] * 150) + ". " + " ".join(["more"] * 60) + "! तुरंत। ",
    "Dr. " + " ".join(f"name{i}" for i in range(120)) + ". The end.",
    "   leading spaces. trailing spaces.   ",
    "No sentence end at all in this piece of text that just goes on and on",
    "Quote: «Bonjour. Ça va?» Réponse: «Oui.» Fin. Combining: cafe\u0301. Done.",
    "A list: 1. apples 2. pears 3. plums. And ¿qué? ¡Sí! Ok.",
]


def _chunkings(text: str, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    by_size, i = [], 0
    while i < len(text):
        n = rng.randint(1, 9)
        by_size.append(text[i : i + n])
        i += n
    return [
        list(text),  # a character at a time
        re.findall(r"\s*\S+|\s+$", text) or [text],  # LLM-like tokens: " word"
        re.findall(r"\S+\s*|^\s+", text) or [text],  # "word "
        by_size,
        [text],
    ]


def _stream(pieces: list[str], add) -> tuple[list[str], str]:
    """What ``WsUtterance._add`` does with each piece: the sentences it queues, and the rest."""
    queued, pending = [], ""
    for piece in pieces:
        complete, pending = add(pending, piece)
        if complete.strip():
            queued.append(complete)
        else:  # white space alone stays
            pending = complete + pending
    return queued, pending


def _before(pending: str, text: str) -> tuple[str, str]:
    return complete_sentences(pending + text)  # what each append did before


@pytest.mark.parametrize("index", range(len(CORPUS)))
def test_incremental_cuts_are_the_cuts_of_before(index):
    text = CORPUS[index]
    for seed in range(4):
        for pieces in _chunkings(text, seed):
            assert "".join(pieces) == text
            assert _stream(pieces, add_sentences) == _stream(pieces, _before), pieces[:12]


class _Counting:
    """Counts the splitter's calls and the characters it reads (sentencex's ``segment``)."""

    def __init__(self, monkeypatch) -> None:
        self.calls = self.chars = 0
        real = text_module.segment

        def segment(language, text):
            self.calls += 1
            self.chars += len(text)
            return real(language, text)

        monkeypatch.setattr(text_module, "segment", segment)


def test_plain_text_is_appended_without_splitting(monkeypatch):
    counting = _Counting(monkeypatch)
    pending = ""
    for word in ["Dr.", " Rao", " said"] + [" word"] * 500:
        complete, pending = add_sentences(pending, word)
    # only the first pieces near "Dr." were split (the mark is still within reach of them)
    assert counting.calls <= 3 * 5, counting.calls
    before = counting.calls
    complete, pending = add_sentences(pending, " and")
    assert counting.calls == before and complete == ""  # a plain append: no splitter call


def test_work_per_append_is_bounded_by_the_open_sentence_not_the_text(monkeypatch):
    """A 4000-character text streamed word by word, a sentence end every 20 words: the
    splitter reads each sentence a bounded number of times (before: every word re-read the
    whole open sentence; for one 4000-character sentence, quadratic)."""
    sentence = " ".join(f"word{i}" for i in range(20)) + "."
    text = " ".join([sentence] * 30)
    tokens = re.findall(r"\s*\S+", text)
    counting = _Counting(monkeypatch)
    now = _stream(tokens, add_sentences)
    new_chars = counting.chars
    counting.calls = counting.chars = 0
    assert _stream(tokens, _before) == now
    old_chars = counting.chars
    assert new_chars <= 12 * len(text), (new_chars, len(text))
    assert old_chars > 4 * new_chars, (old_chars, new_chars)
    # one long sentence with no end: no splitter call at all once the first mark is far behind
    counting.calls = counting.chars = 0
    _stream(re.findall(r"\s*\S+", "Hello. " + " ".join(["on"] * 2000)), add_sentences)
    assert counting.chars <= 5 * 200, counting.chars
