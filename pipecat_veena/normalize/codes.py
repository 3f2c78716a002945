"""Verbalisers of what is read character by character: phones, codes, IDs, e-mails, URLs.

Phone numbers, OTPs and other codes, masked numbers, alphanumeric IDs, e-mail addresses, URLs.

Digits are read one by one in the groups the text shows (or the usual ones: mobiles 5-5, OTPs
3-3, cards 4-4-4-4), with a comma, a short pause, between groups. Latin letters stay Latin: the
model reads them, and spaced capitals (A B C) are read as letters.
"""

from __future__ import annotations

import re

from pipecat_veena.normalize import numbers as nw
from pipecat_veena.normalize.patterns import DIGIT_CONTEXT_RIGHT, asks_for_digits, text_after
from pipecat_veena.normalize.tables import WORDS

#: Digits of an Indian landline with its trunk 0: STD code (0 and 2-4 digits) and subscriber
#: number (6-8 digits) make 11.
_LANDLINE_DIGITS = 11

_GROUP_SPLIT = re.compile(r"[\s()-]+")


def _groups(written: str) -> list[str]:
    """The text's own digit groups, each long one split the usual way."""
    out: list[str] = []
    for group in _GROUP_SPLIT.split(written.strip()):
        out.extend(nw.group_digits(group) if len(group) > 5 else [group])
    return [g for g in out if g]


def phone_international(m: re.Match, lang: str) -> str | None:
    """+91 98765 43210 = plus nine one, nine eight seven six five, four three two one zero.

    The country code is the first group when the text separates it, else whatever comes before
    the last ten digits (+919876543210). An area code in brackets is a group: +91 (22) 2345 6789.
    """
    written = _GROUP_SPLIT.split(m["ph"].strip())
    if len(written) > 1 and len(written[0]) <= 3:
        code, rest = written[0], _groups(" ".join(written[1:]))
    else:
        number = "".join(written)
        if not 11 <= len(number) <= 13:
            return None
        code, rest = number[:-10], nw.group_digits(number[-10:])
    return f"{WORDS[lang]['plus']} {nw.digits(code, lang)}, {nw.digit_groups(rest, lang)}"


def landline(m: re.Match, lang: str) -> str | None:
    """(022) 2345 6789, 011 2345 6789, 0124-2345678: STD code, then the number in its groups.

    None unless the code and the number make the 11 digits of an Indian landline (a year in
    brackets, or two numbers side by side, are not one).
    """
    code = m["ll_std"] or m["ll_code"]
    rest = _groups(m["ll_sub"])
    if len(code) + sum(len(g) for g in rest) != _LANDLINE_DIGITS:
        return None
    return nw.digit_groups([code, *rest], lang)


def masked(m: re.Match, lang: str) -> str:
    """XXXX1234, **** 1234 = ending in one two three four / एक दो तीन चार पर खत्म होने वाला."""
    return WORDS[lang]["ending"].format(digits=nw.digits(m["mk_digits"], lang))


def dash_code(m: re.Match, lang: str) -> str:
    """1800-123-4567, 98765-43210, 022-23456789: digit groups as written."""
    return nw.digit_groups(_groups(m["dc"]), lang)


def spaced_groups(m: re.Match, lang: str) -> str | None:
    """98765 43210, 1234 5678 9012 3456, 1800 123 4567, OTP 48 29 13: one number in groups.

    None for two unrelated numbers side by side (2024 1500): at least 8 digits, and three or
    more groups, a leading 0 or two groups of five; or a word before or after them that asks
    for digits (Phone 2345 6789, OTP 48 29 13, 48 29 13 is your OTP), with any 4 digits.
    """
    groups = m["sg"].split()
    total = sum(len(g) for g in groups)
    coded = asks_for_digits(m) or DIGIT_CONTEXT_RIGHT.match(text_after(m))
    if not (
        coded
        and total >= 4
        or total >= 8
        and (len(groups) >= 3 or groups[0][0] == "0" or all(len(g) >= 5 for g in groups))
    ):
        return None
    return nw.digit_groups(groups, lang)


_ID_PART = re.compile(r"[A-Z]+|\d+")


def alphanumeric_id(m: re.Match, lang: str) -> str:
    """ABCDE1234F, SBIN0001234, MH12AB1234: spaced letters, digits one by one.

    Letters are spaced so that they are read as letters; six digits or more go in groups.
    """
    parts = []
    for part in _ID_PART.findall(m["id"]):
        if part[0].isdigit():
            parts.append(nw.digit_groups(nw.group_digits(part), lang))
        else:
            parts.append(" ".join(part))
    return " ".join(parts)


_SEPARATORS = {".": "dot", "/": "slash", "-": "dash", "_": "underscore", ":": "colon",
               "?": "question", "=": "equals", "&": "and", "@": "at", "+": "plus"}  # fmt: skip
_PIECE = re.compile(r"\d+|[^\W\d_]+|.", re.S)


def _spell(address: str, lang: str) -> str:
    words = WORDS[lang]
    out: list[str] = []
    for piece in _PIECE.findall(address):
        if piece[0].isdigit():
            out.append(nw.digits(piece, lang))
        elif piece in _SEPARATORS:
            out.append(words[_SEPARATORS[piece]])
        elif piece == "%":
            out.append(words["percent"])
        elif piece.strip() and (piece.isalpha() or piece.isalnum()):
            out.append(piece)
    return " ".join(out)


def email(m: re.Match, lang: str) -> str:
    """support@example.com = support at example dot com; digits are read one by one."""
    return _spell(m["em"], lang)


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z+.-]*://")


def url(m: re.Match, lang: str) -> str:
    """https://www.example.com/help = w w w dot example dot com slash help (no scheme)."""
    address = _SCHEME.sub("", m["url"]).rstrip("/")
    if address.lower().startswith("www."):
        return f"w w w {WORDS[lang]['dot']} " + _spell(address[4:], lang)
    return _spell(address, lang)
