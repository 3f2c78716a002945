"""Numbers as words: cardinals, decimals, digit groups, ordinals, years, Hindi fractions.

Hindi cardinals come from ``indic-numtowords`` (correct spellings, lakh/crore) with a few
spellings fixed and numbers of ten digits and more built here (the library spells those digit
by digit, or crashes on an int). Indian English cardinals come from ``num2words`` (``en_IN``
for lakh/crore, ``en`` for Western grouping) with its commas and "and" removed: each would
be a pause in the middle of a number.
"""

from __future__ import annotations

from functools import lru_cache

from indic_numtowords import num2words as _hi_num2words
from num2words import num2words as _en_num2words

from pipecat_veena.normalize.tables import nfc

__all__ = [
    "cardinal",
    "decimal",
    "digits",
    "group_digits",
    "hindi_fraction",
    "ordinal_en",
    "ordinal_hi",
    "year",
]

_CRORE = 10**7
DIGIT_WORDS: dict[str, list[str]] = {
    "en": "zero one two three four five six seven eight nine".split(),
    "hi": [nfc(w) for w in "शून्य एक दो तीन चार पाँच छह सात आठ नौ".split()],
}
#: indic-numtowords spellings replaced by the standard ones (Kendriya Hindi Nideshalay).
_HI_FIXES = {nfc(k): nfc(v) for k, v in {
    "छः": "छह", "अट्ठारह": "अठारह", "चौंतालीस": "चवालीस", "छयासठ": "छियासठ", "सरसठ": "सड़सठ",
}.items()}  # fmt: skip


@lru_cache(maxsize=4096)
def _hi(n: int) -> str:
    if n >= 10**9:  # the library spells these digit by digit: count in crores instead
        high, rest = divmod(n, _CRORE)
        return f"{_hi(high)} करोड़" + (f" {_hi(rest)}" if rest else "")
    words = nfc(_hi_num2words(n, lang="hi"))
    return " ".join(_HI_FIXES.get(w, w) for w in words.split())


def _clean_en(words: str) -> str:
    return words.replace(",", "").replace(" and ", " ")


@lru_cache(maxsize=4096)
def _en(n: int, western: bool) -> str:
    if western:
        return _clean_en(_en_num2words(n, lang="en"))
    if n >= 10**9:
        high, rest = divmod(n, _CRORE)
        return f"{_en(high, False)} crore" + (f" {_en(rest, False)}" if rest else "")
    return _clean_en(_en_num2words(n, lang="en_IN"))


def cardinal(n: int, lang: str, *, western: bool = False) -> str:
    """``n`` (>= 0) in words, with no comma and no "and".

    Args:
        n: the number.
        lang: "hi" or "en".
        western: English only: millions and billions instead of lakhs and crores.
    """
    if n < 0:
        raise ValueError(f"cardinal() takes n >= 0, got {n}")
    return _hi(n) if lang == "hi" else _en(n, western)


def digits(text: str, lang: str) -> str:
    """Each ASCII digit of ``text`` as a word, separated by spaces."""
    table = DIGIT_WORDS[lang]
    return " ".join(table[int(c)] for c in text if c.isdigit())


def group_digits(number: str) -> list[str]:
    """Split an ungrouped digit string into the groups a person reads it in.

    10-digit mobiles 5-5, OTPs of 6 as 3-3, cards of 16 as 4-4-4-4; a leading 0 or 91 before a
    mobile number is a group of its own.
    """
    n = len(number)
    if n == 11 and number[0] == "0":
        return [number[0], number[1:6], number[6:]]
    if n == 12 and number.startswith("91"):
        return [number[:2], number[2:7], number[7:]]
    sizes = {6: (3, 3), 7: (3, 4), 8: (4, 4), 9: (3, 3, 3), 10: (5, 5), 11: (4, 4, 3)}.get(n)
    if n <= 5:
        return [number]
    if sizes is None:
        sizes = tuple([4] * (n // 4) + ([n % 4] if n % 4 else []))
    out, i = [], 0
    for size in sizes:
        out.append(number[i : i + size])
        i += size
    return out


def digit_groups(groups: list[str], lang: str) -> str:
    """Digit groups read digit by digit, a comma (a short pause) between groups."""
    return ", ".join(digits(g, lang) for g in groups if g)


def decimal(int_part: str, frac: str, lang: str, *, western: bool = False) -> str:
    """A decimal number: the integer part as a cardinal, the fraction digit by digit."""
    point = "दशमलव" if lang == "hi" else "point"
    whole = cardinal(int(int_part or "0"), lang, western=western)
    return f"{whole} {point} {digits(frac, lang)}"


def hindi_fraction(int_part: str, frac: str, *, before_scale: bool = False) -> str | None:
    """डेढ़, ढाई, साढ़े, सवा, पौने for x.5, x.25 and x.75 with 1 <= x <= 99; else None.

    Args:
        int_part: digits before the point.
        frac: digits after it.
        before_scale: the number multiplies लाख/करोड़/हज़ार: 1.25 is then सवा, not सवा एक.
    """
    if not int_part or len(int_part) > 2 or frac.rstrip("0") not in ("5", "25", "75"):
        return None
    n = int(int_part)
    if n < 1:
        return None
    quarter = frac.rstrip("0")
    if quarter == "5":
        return {1: "डेढ़", 2: "ढाई"}.get(n) or f"साढ़े {cardinal(n, 'hi')}"
    if quarter == "25":
        return "सवा" if n == 1 and before_scale else f"सवा {cardinal(n, 'hi')}"
    return f"पौने {cardinal(n + 1, 'hi')}"


def english_half(int_part: str, frac: str) -> str | None:
    """English x.5 as "two and a half" (used before lakh, crore, thousand, million); else None."""
    if not int_part or frac.rstrip("0") != "5" or int(int_part) < 1 or len(int_part) > 3:
        return None
    return f"{cardinal(int(int_part), 'en')} and a half"


def ordinal_en(n: int) -> str:
    """First, twenty-first, one hundred first (no "and")."""
    return _clean_en(_en_num2words(n, lang="en", to="ordinal"))


_HI_ORDINAL_STEMS = {1: "पहल", 2: "दूसर", 3: "तीसर", 4: "चौथ", 6: "छठ"}


def ordinal_hi(n: int, form: str = "m", *, anusvara: bool = False) -> str:
    """A Hindi ordinal: पहला/पहली/पहले, इक्कीसवाँ/इक्कीसवीं/इक्कीसवें.

    Args:
        n: the number (>= 1).
        form: "m" masculine (the default when the text does not say), "f" feminine, "o"
            oblique (before a postposition: "पहले दिन", "21वें साल").
        anusvara: write वां instead of वाँ (as the text did).
    """
    if n in _HI_ORDINAL_STEMS:
        return _HI_ORDINAL_STEMS[n] + {"m": "ा", "f": "ी", "o": "े"}[form]
    if n in (100, 1000, 100000, _CRORE):  # सौवाँ, हज़ारवाँ: no एक before them
        base = cardinal(n, "hi").split(" ", 1)[1]
    else:
        base = cardinal(n, "hi")
    suffix = {"m": "वां" if anusvara else "वाँ", "f": "वीं", "o": "वें"}[form]
    return nfc(base + suffix)


def year(n: int, lang: str) -> str:
    """A year as people say it.

    English: nineteen ninety-seven, twenty twenty-five, two thousand five, nineteen oh five.
    Hindi: उन्नीस सौ सत्तानवे, दो हज़ार पच्चीस (from 2000 a year is its cardinal).
    """
    if lang == "hi":
        if 1100 <= n <= 1999:
            high, low = divmod(n, 100)
            return f"{cardinal(high, 'hi')} सौ" + (f" {cardinal(low, 'hi')}" if low else "")
        return cardinal(n, "hi")
    if not 1000 <= n <= 2099 or 2000 <= n <= 2009 or 1000 <= n <= 1009:
        return cardinal(n, "en")
    high, low = divmod(n, 100)
    if low == 0:
        return f"{cardinal(high, 'en')} hundred"
    if low < 10:
        return f"{cardinal(high, 'en')} oh {cardinal(low, 'en')}"
    return f"{cardinal(high, 'en')} {cardinal(low, 'en')}"
