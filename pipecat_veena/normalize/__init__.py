"""Hindi/English text normalisation: numbers, money, dates, times and codes as they are spoken.

``normalize("आपका बिल ₹1,250 है।")`` gives "आपका बिल एक हज़ार दो सौ पचास रुपये है।". Each sentence
gets the language of its script (Devanagari: Hindi words, Latin: Indian English) unless one is
forced; Latin words inside Hindi stay as they are. Markdown marks go first (``**48**``, headings,
bullets: pipecat_veena.normalize.markdown), then a user lexicon is applied, then the rule layer
(pipecat_veena.normalize.rules). Only what a rule takes is rewritten: text that needs nothing
comes back byte for byte, and normalising twice gives the same text as once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from pipecat_veena.normalize.lexicon import Lexicon
from pipecat_veena.normalize.markdown import strip_markdown
from pipecat_veena.normalize.rules import apply_rules
from pipecat_veena.text import split_sentences

__all__ = ["LANGUAGES", "Lexicon", "normalize", "sentence_language"]

#: Accepted values of ``language``.
LANGUAGES = ("auto", "hi", "en")

_DEVANAGARI_DIGITS = str.maketrans("०१२३४५६७८९", "0123456789")
#: Anything a rule could act on; text without any of these needs no work at all.
_TRIGGER = re.compile(r"[0-9०-९&@%+=©#/₹$€£°℃℉.]")
_DEVANAGARI_WORD = re.compile(r"[\u0900-\u0963\u0971-\u097f]+")
#: Acronyms (OTP, EMI) do not count. A word starts after a non-letter: a run of capitals with no
#: small letter is then tried once, not from each of its letters (quadratic on "AAAA...").
_LATIN_WORD = re.compile(r"(?<![A-Za-z])[A-Z]*+[a-z][A-Za-z]*")


def sentence_language(sentence: str) -> str | None:
    """The language ("hi" or "en") of a sentence from its script; None when it has no words.

    A sentence is Hindi when at least a third of its words are in Devanagari (code-mixed Hindi
    writes its English nouns in Latin), or when it has Devanagari digits and no words. Words in
    capitals (OTP, EMI, PAN) are left out of the count: Hindi sentences use them as much.
    """
    hindi = len(_DEVANAGARI_WORD.findall(sentence))
    latin = len(_LATIN_WORD.findall(sentence))
    if hindi or latin:
        return "hi" if hindi and 2 * hindi >= latin else "en"
    if any("०" <= c <= "९" for c in sentence):
        return "hi"
    return None


def normalize(
    text: str,
    language: str = "auto",
    *,
    lexicon: Lexicon | Mapping | str | Path | None = None,
) -> str:
    """The spoken form of ``text``: numbers, money, dates, times, codes and symbols as words.

    Args:
        text: what to say (Hindi, English or code-mixed).
        language: "auto" (per sentence, from its script), "hi" or "en" (every sentence).
        lexicon: term -> spoken form entries applied first (a Lexicon, a dict, or the path of a
            JSON file; see ``Lexicon``). Build a Lexicon once when normalising often.

    Returns:
        The text to give the model; ``text`` itself when nothing needs saying differently.

    Raises:
        ValueError: an unknown ``language`` or an unreadable lexicon.
    """
    if language not in LANGUAGES:
        raise ValueError(f"language must be one of {LANGUAGES}, got {language!r}")
    lex = Lexicon.load(lexicon)
    text = strip_markdown(text)  # **48** is not a masked number, "# " not "number"
    if not text or (not lex and not _TRIGGER.search(text)):
        return text
    sentences = split_sentences(text)
    if language == "auto":
        default = sentence_language(text) or "en"
        langs = [sentence_language(s) or default for s in sentences]
    else:
        langs = [language] * len(sentences)
    out = []
    for sentence, lang in zip(sentences, langs, strict=True):
        if lex:
            sentence = lex.apply(sentence, lang)
        if _TRIGGER.search(sentence):
            sentence = apply_rules(sentence.translate(_DEVANAGARI_DIGITS), lang)
        out.append(sentence)
    return "".join(out)
