"""pipecat_veena.normalize: the hand-written golden table (tests/data/normalize_golden.tsv), its
properties (idempotence, no digit left, untouched plain text, no crash on random text), the
user lexicon, language choice and the sentence splitting it shares with the engine."""

from __future__ import annotations

import json
import random
import re
import time
import unicodedata
from pathlib import Path

import pytest

from pipecat_veena.normalize import Lexicon, normalize, sentence_language
from pipecat_veena.text import split_sentences

GOLDEN = Path(__file__).parent / "data" / "normalize_golden.tsv"
_DIGIT = re.compile(r"[0-9०-९]")


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def _golden() -> list[tuple[str, str, str]]:
    cases = []
    for line in GOLDEN.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            lang, text, spoken = line.split("\t")
            cases.append((lang, text, spoken))
    return cases


CASES = _golden()


def test_the_golden_table_is_big_and_covers_both_languages():
    assert len(CASES) >= 300
    langs = [lang for lang, _, _ in CASES]
    assert langs.count("en") >= 100 and langs.count("hi") + langs.count("auto") >= 100
    assert len({text for _, text, _ in CASES}) > 0.9 * len(CASES)


@pytest.mark.parametrize(("lang", "text", "spoken"), CASES, ids=[c[1][:40] for c in CASES])
def test_golden(lang, text, spoken):
    assert _nfc(normalize(text, lang)) == _nfc(spoken)


def test_golden_properties_idempotent_and_no_digits_left():
    """Normalising an output (or an input twice) changes nothing; no digit survives."""
    failures = []
    for lang, text, spoken in CASES:
        once = normalize(text, lang)
        if normalize(once, lang) != once:
            failures.append(("input twice", text, once, normalize(once, lang)))
        if normalize(spoken, lang) != spoken:
            failures.append(("golden output", spoken, normalize(spoken, lang)))
        if _DIGIT.search(once):
            failures.append(("digit left", text, once))
    assert not failures, "\n".join(map(repr, failures))


PLAIN = [
    "Hello, how are you?",
    "नमस्ते, आप कैसे हैं?",
    "आपका order ship हो गया है।",
    "We will call you back soon!",
    "कृपया थोड़ा इंतज़ार करें… धन्यवाद।",
    "Thank you, Priya; see you tomorrow",
    "  spaces   stay\tas\nthey are  ",
    "<laugh> That's funny. <sigh>",
    "Kya aap mujhe sun sakte hain?",
    "",
]


@pytest.mark.parametrize("text", PLAIN)
def test_text_without_numbers_or_symbols_comes_back_unchanged(text):
    assert normalize(text) is text or normalize(text) == text
    assert normalize(text, "hi") == text and normalize(text, "en") == text


def test_random_words_come_back_byte_for_byte():
    rng = random.Random(7)
    words = "order payment आपका बिल है नमस्ते delivery कल आज ship होगा hello world की का".split()
    for _ in range(500):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 12)))
        text += rng.choice(["", ".", "?", "!", "।"])
        assert normalize(text) == text


_ALPHABET = (
    list("0123456789०१२३४५६७८९") * 4
    + list(" .,:;-–/+%&@#₹$€£°*Xx()'\"\n\t")
    + list("abcdeKMGmslhpAPOT")
    + ["नमस्ते", "रुपये", "बजे", "वाँ", "करोड़", "लाख", "OTP", "Rs.", "Dr.", "km", "am", "www.", ".com"]
    + ["अगस्त", "Aug", "XXXX", "+91", "।", "कि.मी.", "डॉ.", "no.", "1,25,000", "12.5", "10:30"]
)


def test_no_crash_and_no_digit_left_on_random_mixed_text():
    rng = random.Random(2024)
    for _ in range(5000):
        text = "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 30)))
        out = normalize(text)
        assert isinstance(out, str)
        assert not _DIGIT.search(out), (text, out)


def test_language_per_sentence_from_its_script():
    assert sentence_language("आपका order 3 दिन में deliver होगा") == "hi"
    assert sentence_language("Your OTP is 482913") == "en"
    assert sentence_language("१२३") == "hi"
    assert sentence_language("12:30") is None
    # A sentence with no words takes the language of the text around it.
    assert normalize("आपका बिल है: ₹500.") == "आपका बिल है: पाँच सौ रुपये."
    assert normalize("नमस्ते। 10:30.") == "नमस्ते। साढ़े दस बजे."


def test_bad_language_is_an_error():
    with pytest.raises(ValueError, match="language"):
        normalize("5", "fr")


def test_lexicon_from_a_dict_applies_before_the_rules_per_language():
    lexicon = {
        "*": {"Zomato": "ज़ोमैटो"},
        "en": {"EMI": "E M I", "SBI": "S B I"},
        "hi": {"EMI": "ई एम आई"},
    }
    assert normalize("Your EMI is ₹500.", lexicon=lexicon) == ("Your E M I is five hundred rupees.")
    assert normalize("आपकी EMI ₹500 है।", lexicon=lexicon) == "आपकी ई एम आई पाँच सौ रुपये है।"
    assert normalize("zomato order", lexicon=lexicon) == "ज़ोमैटो order"  # any case: not an acronym
    assert normalize("emi and SBIN", lexicon=lexicon) == "emi and SBIN"  # acronyms: exact, whole
    assert normalize("SBI.", lexicon=lexicon) == "S B I."


def test_lexicon_from_a_json_file_flat_and_reused(tmp_path):
    path = tmp_path / "lexicon.json"
    path.write_text(json.dumps({"Veena": "वीणा", "KYC": "के वाई सी"}), encoding="utf-8")
    lex = Lexicon.load(path)
    assert len(lex) == 2
    assert normalize("Veena: KYC pending", lexicon=lex) == "वीणा: के वाई सी pending"
    assert normalize("Veena: KYC pending", lexicon=str(path)) == "वीणा: के वाई सी pending"
    once = normalize("KYC 2 दिन में", lexicon=lex)
    assert once == "के वाई सी दो दिन में" and normalize(once, lexicon=lex) == once


@pytest.mark.parametrize(
    "bad", [{"fr": {"a": "b"}}, {"a": 5}, {"en": {"a": 5}}, "/no/such/lexicon.json"]
)
def test_bad_lexicons_are_errors(bad):
    with pytest.raises(ValueError):
        Lexicon.load(bad)


def test_split_sentences_keeps_every_byte_and_abbreviations_whole():
    text = "Rs. 500 भेजें। Dr. Rao 10 a.m. पर आएँगे। डॉ. शर्मा 5 कि.मी. दूर हैं।  OK?"
    parts = split_sentences(text)
    assert "".join(parts) == text
    assert parts == [
        "Rs. 500 भेजें। ",
        "Dr. Rao 10 a.m. पर आएँगे। ",
        "डॉ. शर्मा 5 कि.मी. दूर हैं।  ",
        "OK?",
    ]


def test_the_guides_examples_are_what_the_normaliser_says():
    guide = Path(__file__).parent.parent / "docs" / "guides" / "numbers.md"
    section = guide.read_text(encoding="utf-8").split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|$", section, re.M)
    assert len(rows) >= 12
    for text, spoken in rows:
        assert _nfc(normalize(text)) == _nfc(spoken)
        assert any(text == t and _nfc(spoken) == _nfc(s) for _, t, s in CASES), text
    assert normalize("₹1,25,000", "en") == "one lakh twenty-five thousand rupees"


@pytest.mark.parametrize(
    "text",
    ["X" * 3000 + "1", "XX-" * 2000 + "1", "*" * 3000 + " 12", "1," * 2000, "a1-" * 3000,
     "1,2" * 2000, "(022) " * 2000, "-₹" * 2000 + "5", "+91 (22) " * 1000, "1st " * 2000],
    ids=["x-run", "x-dash-run", "star-run", "comma-run", "dash-run", "list-run", "std-run",
         "minus-money-run", "phone-bracket-run", "ordinal-run"],
)  # fmt: skip
def test_long_runs_finish(text):
    """Long runs of mask characters and separators (these once backtracked exponentially)."""
    assert not _DIGIT.search(normalize(text))


@pytest.mark.parametrize(
    ("text", "spoken"),
    [("2 * 3 * 4 = 24", "two * three * four equals twenty-four"),
     ("Card XXXX1234, ****1234 or **** 5678", "Card ending in one two three four, ending in one "
      "two three four or ending in five six seven eight"),
     ("snake_case_name: 5*3", "snake_case_name: five*three"),
     ("-5 degrees at 10 a.m.", "minus five degrees at ten a m.")],
)  # fmt: skip
def test_markdown_stripping_leaves_masks_products_and_names_alone(text, spoken):
    assert normalize(text, "en") == spoken


#: Every white space character Python knows (sentencex panicked on each non-ASCII one before a
#: full stop: "A\u00a0. ", slicing inside the character in its Rust code).
UNICODE_SPACES = [chr(c) for c in range(0x110000) if chr(c).isspace()]


@pytest.mark.parametrize("space", UNICODE_SPACES, ids=[f"U+{ord(s):04X}" for s in UNICODE_SPACES])
def test_any_space_before_a_full_stop_is_split_and_normalised(space):
    text = f"Plan A{space}. Pay Rs{space}. 500 to Dr{space}. Rao now{space}.{space}Call 112{space}."
    sentences = split_sentences(text)
    assert "".join(sentences) == text and len(sentences) >= 2
    out = normalize(text)
    assert "five hundred" in out and not _DIGIT.search(out)


def test_a_sentencex_panic_falls_back_to_a_simple_split_with_a_warning(monkeypatch):
    """Contained even if a panic is raised some other way: the real PanicException, caught."""
    from loguru import logger

    import pipecat_veena.text as text_module

    real = text_module.segment

    def panicking(lang, text):
        return real(lang, "A\u00a0. B")  # sentencex's own PanicException (a BaseException)

    monkeypatch.setattr(text_module, "segment", panicking)
    warnings: list[str] = []
    sink = logger.add(warnings.append, level="WARNING", format="{message}")
    try:
        text = "Pay Rs. 500 now! Then call 100. ठीक है। Bye"
        assert split_sentences(text) == ["Pay Rs. 500 now! ", "Then call 100. ", "ठीक है। ", "Bye"]
        assert normalize(text) == (
            "Pay five hundred rupees now! Then call one zero zero. ठीक है। Bye"
        )
    finally:
        logger.remove(sink)
    assert warnings and "panicked" in warnings[0]


#: Pieces that, repeated, once made a rule (or the language guess) try again from every
#: character of a run: time grew with the square of the length (1.1 s at 16 KB for "1-"). The
#: rest are runs of what the rules look for, kept linear. ("1," is left out: its one list match
#: costs 10x from 4 KB to 16 KB in the regex engine's memory, then 4x per 4x: linear, 32 ms.)
ADVERSARIAL_UNITS = ("A", "AB", "X", "1-", "a1-", "%", "+9", "(0", "1 ", "**", "Dr. ")


def adversarial(unit: str, size: int) -> str:
    """``unit`` repeated to ``size`` characters, then a digit (so that the rules run at all)."""
    return (unit * (size // len(unit) + 1))[:size] + " 1"


def _fastest(text: str, repeats: int = 3) -> float:
    """The least CPU time (this process's: other processes' load counts less) of a few runs."""
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        normalize(text)
        best = min(best, time.process_time() - start)
    return best


def test_normalising_time_grows_linearly_with_the_text():
    """16 KB of each adversarial run takes under 8x the time of 4 KB (linear: 4x; quadratic: 16x).

    Ratios, not absolute times (the machine is shared); the 4 KB time counts as at least 2 ms.
    """
    slow = {}
    for unit in ADVERSARIAL_UNITS:
        small = _fastest(adversarial(unit, 4096))
        big = _fastest(adversarial(unit, 16384))
        if big > 8 * max(small, 2e-3):
            slow[unit] = f"{small * 1e3:.1f} ms -> {big * 1e3:.1f} ms"
    assert not slow, slow
