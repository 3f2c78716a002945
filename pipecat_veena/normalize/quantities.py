"""Verbalisers of quantities: numbers, ranges, money, percentages, measures, ordinals.

Also numbers with a scale word (2.5 crore), fractions and dotted version numbers.

Each takes the rule's match (``m.string`` is the whole sentence, for context) and the sentence
language, and returns the spoken form, or None when the text is not what the rule assumed (the
next rule then gets a try).
"""

from __future__ import annotations

import re

from pipecat_veena.normalize import numbers as nw
from pipecat_veena.normalize.patterns import (
    DIGIT_CONTEXT_RIGHT,
    FEMININE_NEXT,
    HI_ORDINAL_SUFFIXES,
    OBLIQUE_NEXT,
    POSTPOSITION,
    YEAR_LEFT,
    YEAR_RIGHT,
    asks_for_digits,
    is_indian_grouping,
    parse_number,
    text_after,
    text_before,
)
from pipecat_veena.normalize.tables import (
    CURRENCY_PREFIX,
    CURRENCY_SUFFIX,
    CURRENCY_WORDS,
    MONEY_SCALES,
    PER_UNITS,
    SCALE_WORDS,
    SCALES,
    UNITS,
    WORDS,
    nfc,
)

_POSTPOSITION = re.compile(rf"\s*{POSTPOSITION}")


def _oblique(m: re.Match, lang: str) -> bool:
    return lang == "hi" and bool(_POSTPOSITION.match(m.string, m.end()))


def _minus(words: str, neg: str | None, lang: str) -> str:
    return f"{WORDS[lang]['minus']} {words}" if neg else words


def amount(raw: str, lang: str, *, scaled: bool = False, western: bool = False) -> str:
    """A number that is a quantity (never read digit by digit): cardinal or decimal.

    Args:
        raw: the number as written (grouped or not, with an optional decimal part).
        lang: "hi" or "en".
        scaled: a lakh/crore/thousand word follows (2.5 lakh: ढाई / two and a half).
        western: English ungrouped numbers in millions (grouped ones follow their grouping).
    """
    int_part, frac, _ = parse_number(raw)
    grouping = is_indian_grouping(raw)
    west = lang == "en" and (grouping is False or (grouping is None and western))
    if frac is None:
        return nw.cardinal(int(int_part), lang, western=west)
    if lang == "hi":
        special = nw.hindi_fraction(int_part, frac, before_scale=scaled)
    else:
        special = nw.english_half(int_part, frac) if scaled else None
    return special or nw.decimal(int_part, frac, lang, western=west)


def _is_one(raw: str) -> bool:
    int_part, frac, _ = parse_number(raw)
    return int(int_part) == 1 and not (frac or "").strip("0")


def _scale_word(written: str | None, lang: str) -> str:
    if not written:
        return ""
    key = (SCALES.get(nfc(written)) or SCALES.get(written.lower()) or MONEY_SCALES[written])[0]
    return SCALE_WORDS[lang][key]


def _span(a: str, b: str | None, lang: str, *, scale_a: str = "", scale_b: str = "", **kw) -> str:
    """Say "a [scale] to b [scale]", where a scale written only after b covers both."""
    if b is None:
        scale_a, scale_b = scale_a or scale_b, ""
    scaled_b = bool(scale_b)
    first = amount(a, lang, scaled=bool(scale_a or scale_b), **kw)
    first += f" {scale_a}" if scale_a else ""
    if b is None:
        return first
    second = amount(b, lang, scaled=scaled_b, **kw) + (f" {scale_b}" if scale_b else "")
    return f"{first} {WORDS[lang]['to']} {second}"


def plain_number(m: re.Match, lang: str) -> str | None:
    """A number standing alone: a code (digit by digit), a year, a cardinal or a decimal."""
    raw, neg = m["n"], m["n_neg"]
    int_part, frac, grouped = parse_number(raw)
    if not int_part:  # .5
        return _minus(f"{WORDS[lang]['point']} {nw.digits(frac or '', lang)}", neg, lang)
    if not (grouped or frac or neg):
        n = len(int_part)
        before, after = text_before(m), text_after(m)
        if n >= 3 and (asks_for_digits(m) or DIGIT_CONTEXT_RIGHT.match(after)):
            return nw.digit_groups(nw.group_digits(int_part), lang)
        if n >= 6:
            return nw.digit_groups(nw.group_digits(int_part), lang)
        if n >= 2 and int_part[0] == "0":
            return nw.digits(int_part, lang)
        value = int(int_part)
        if (
            n == 4
            and 1000 <= value <= 2099
            and (YEAR_LEFT.search(before) or YEAR_RIGHT.match(after))
        ):
            return nw.year(value, lang)
    return _minus(amount(raw, lang), neg, lang)


def number_range(m: re.Match, lang: str) -> str | None:
    """10-20, 10–20: "ten to twenty" / "दस से बीस"; year spans are read as years."""
    a, b = m["r_a"], m["r_b"]
    ia, fa, ga = parse_number(a)
    ib, fb, gb = parse_number(b)
    plain = not (fa or fb or ga or gb)
    if plain and (len(ia) >= 5 and len(ib) >= 5 or ia[0] == "0" and len(ia) > 1):
        return None  # a code or a phone number, not a range
    if plain and len(ia) == 4 and 1000 <= int(ia) <= 2099 and len(ib) in (2, 4):
        return f"{nw.year(int(ia), lang)} {WORDS[lang]['to']} " + (
            nw.year(int(ib), lang) if len(ib) == 4 else nw.cardinal(int(ib), lang)
        )
    return _minus(_span(a, b, lang), m["r_neg"], lang)


def number_list(m: re.Match, lang: str) -> str:
    """1,2,3: "one, two, three", a list and not one grouped number.

    The items before the last, each with a comma and a space (a short pause); the rule that
    takes the last item speaks it.
    """
    return "".join(f"{amount(item, lang)}, " for item in m["nl"].split(","))


def scaled_number(m: re.Match, lang: str) -> str:
    """2.5 crore, 1.5 लाख, 3 हज़ार: ढाई करोड़, one and a half lakh."""
    scale = _scale_word(m["sc_s"], lang)
    return _minus(_span(m["sc_a"], m["sc_b"], lang, scale_b=scale), m["sc_neg"], lang)


def per(written: str | None, lang: str) -> str:
    """What a written "/kg" adds: " per kilogram" / " प्रति किलो" ("" for None)."""
    if not written:
        return ""
    en, hi = PER_UNITS.get(nfc(written)) or PER_UNITS[written]
    return f" {WORDS[lang]['per']} {en if lang == 'en' else hi}"


def money_prefix(m: re.Match, lang: str) -> str | None:
    """₹1,25,000, Rs. 500/-, $12.50, ₹2.5 crore, ₹500-1,000, INR 5k, ₹40/kg; -₹500 and ₹-500."""
    key = CURRENCY_PREFIX.get(nfc(m["mp_cur"])) or CURRENCY_PREFIX[m["mp_cur"]]
    scale_a, scale_b = m["mp_sa"] or m["mp_ka"], m["mp_sb"] or m["mp_kb"]
    words = _money(key, m["mp_a"], m["mp_b"], scale_a, scale_b, lang, oblique=_oblique(m, lang))
    return _minus(words, m["mp_neg"] or m["mp_sign"], lang) + per(m["mp_per"], lang)


def money_suffix(m: re.Match, lang: str) -> str | None:
    """500 रुपये, 20 rupees, 500 Rs, -500 Rs: the number in words, the currency as a word."""
    written = nfc(m["ms_cur"])
    key = CURRENCY_SUFFIX.get(written)
    if key is not None:
        words = _money(key, m["ms_a"], m["ms_b"], None, m["ms_s"], lang, oblique=_oblique(m, lang))
    else:
        words = _span(m["ms_a"], m["ms_b"], lang, scale_b=_scale_word(m["ms_s"], lang))
        words = f"{words} {written}"
    return _minus(words, m["ms_neg"], lang)


def _money(
    key: str, a: str, b: str | None, sa: str | None, sb: str | None, lang: str, *, oblique: bool
) -> str:
    one, many, sub_one, sub_many = CURRENCY_WORDS[key][lang]
    if oblique:  # एक रुपये का, एक पैसे में
        one, sub_one = many, sub_many
    western = key != "INR"
    scale_a, scale_b = _scale_word(sa, lang), _scale_word(sb, lang)
    int_part, frac, _ = parse_number(a)
    if b is None and not (scale_a or scale_b) and frac is not None and len(frac) <= 2:
        units = int(int_part)
        cents = int(frac.ljust(2, "0"))
        main = amount(int_part, lang, western=western)
        main = f"{main} {one if units == 1 else many}"
        if cents == 0:
            return main
        sub = f"{nw.cardinal(cents, lang)} {sub_one if cents == 1 else sub_many}"
        if units == 0:
            return sub
        return f"{main} {WORDS[lang]['and']} {sub}" if lang == "en" else f"{main} {sub}"
    words = _span(a, b, lang, scale_a=scale_a, scale_b=scale_b, western=western)
    single = b is None and not (scale_a or scale_b) and _is_one(a)
    return f"{words} {one if single else many}"


def percent(m: re.Match, lang: str) -> str:
    """7.5% = seven point five percent / साढ़े सात प्रतिशत; 10-20% a range."""
    return _minus(_span(m["p_a"], m["p_b"], lang), m["p_neg"], lang) + f" {WORDS[lang]['percent']}"


def measure(m: re.Match, lang: str) -> str | None:
    """5 km, 2.5 kg, -5°C, 10-20 GB, 5 m/s: the number in words and the unit spelled out."""
    unit = UNITS.get(nfc(m["u_unit"]))
    if unit is None:
        return None
    a, b = m["u_a"], m["u_b"]
    single = b is None and _is_one(a) and not m["u_neg"] and not _oblique(m, lang)
    en1, en2, hi1, hi2 = unit
    word = (en1 if single else en2) if lang == "en" else (hi1 if single else hi2)
    return _minus(_span(a, b, lang), m["u_neg"], lang) + f" {word}" + per(m["u_per"], lang)


def _hi_ordinal_form(m: re.Match) -> str:
    """The form ("m", "f" or "o") a Hindi ordinal takes from the words after it.

    Feminine before a feminine noun (पहली मंज़िल); oblique before a postposition, or before a
    noun and a postposition (पहले दिन से, दूसरे floor पर); masculine otherwise.
    """
    if FEMININE_NEXT.match(m.string, m.end()):
        return "f"
    if OBLIQUE_NEXT.match(m.string, m.end()):
        return "o"
    return "m"


def ordinal_en(m: re.Match, lang: str) -> str:
    """1st, 22nd, 103rd: first / पहला, पहली, पहले (a Hindi sentence: agreeing with its noun)."""
    n = int(m["oe_n"])
    return nw.ordinal_hi(n, _hi_ordinal_form(m)) if lang == "hi" and n > 0 else nw.ordinal_en(n)


def ordinal_hi(m: re.Match, lang: str) -> str | None:
    """21वाँ, 1ली, 2रे, 5वीं: gender and case from the suffix as written."""
    n = int(m["oh_n"])
    if n < 1:
        return None
    suffix = nfc(m["oh_s"])
    form = HI_ORDINAL_SUFFIXES.get(suffix) or HI_ORDINAL_SUFFIXES[m["oh_s"]]
    return nw.ordinal_hi(n, form, anusvara=suffix == "वां")


_FRACTIONS = {
    (1, 2): ("half", "आधा"),
    (1, 4): ("one fourth", "एक चौथाई"),
    (3, 4): ("three fourths", "तीन चौथाई"),
    (1, 3): ("one third", "एक तिहाई"),
    (2, 3): ("two thirds", "दो तिहाई"),
}


def fraction(m: re.Match, lang: str) -> str | None:
    """3/4 = three fourths / तीन चौथाई; 24/7 = twenty-four by seven / चौबीस बटा सात."""
    a, b = int(m["f_a"]), int(m["f_b"])
    if b == 0:
        return None
    named = _FRACTIONS.get((a, b))
    if named:
        return named[0] if lang == "en" else named[1]
    return f"{nw.cardinal(a, lang)} {WORDS[lang]['by']} {nw.cardinal(b, lang)}"


def decade(m: re.Match, lang: str) -> str:
    """1990s = nineteen nineties, 90s = nineties, 2000s = two thousands (Hindi: the year)."""
    written = m["dec"]
    value = int(written)
    words = nw.year(value, lang) if len(written) == 4 else nw.cardinal(value, lang)
    if lang == "hi":
        return words
    return words[:-1] + "ies" if words.endswith("y") else words + "s"


def times(m: re.Match, lang: str) -> str:
    """24x7, 3 x 4, 1920×1080: "by" / "बाई"."""
    a, b = int(m["x_a"]), int(m["x_b"])
    return f"{nw.cardinal(a, lang)} {WORDS[lang]['times']} {nw.cardinal(b, lang)}"


def version(m: re.Match, lang: str) -> str:
    """1.2.3, 192.168.1.1: each part a cardinal, "point" between them."""
    point = "point" if lang == "en" else "पॉइंट"
    return f" {point} ".join(
        nw.digits(p, lang) if len(p) > 1 and p[0] == "0" else nw.cardinal(int(p), lang)
        for p in m["v"].split(".")
    )


def bare_digits(m: re.Match, lang: str) -> str:
    """Any digit run no other rule took: a cardinal, or digit by digit from six digits."""
    run = m["d"]
    if len(run) >= 6 or (len(run) > 1 and run[0] == "0"):
        return nw.digit_groups(nw.group_digits(run), lang)
    return nw.cardinal(int(run), lang)
