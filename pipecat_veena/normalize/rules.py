"""The rule layer: a regex tokenizer finds semiotic classes in a sentence, verbalisers speak them.

Rules are tried in priority order (an e-mail before a number, a date before a range, a money
amount before a plain number). All of them run as one compiled alternation, so a sentence is
scanned once; when a verbaliser declines a match (returns None), the later rules get a try at
the same place. Whatever no rule takes is copied byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from loguru import logger

from pipecat_veena.normalize import clock, codes, quantities
from pipecat_veena.normalize import patterns as p
from pipecat_veena.normalize.tables import (
    ABBREVIATIONS,
    CURRENCY_WORDS,
    LONE_CURRENCY,
    NUMBER_ABBREVIATIONS,
    SYMBOLS,
    WORD_CHAR,
    WORDS,
    nfc,
)

Verbaliser = Callable[[re.Match, str], "str | None"]


@dataclass(frozen=True)
class Rule:
    """One semiotic class: its name (outer group ``R_<name>``), its pattern and its verbaliser."""

    name: str
    pattern: str
    speak: Verbaliser

    @property
    def regex(self) -> re.Pattern:
        """The pattern alone, wrapped in its named group (compiled once, cached by ``re``)."""
        return re.compile(f"(?P<R_{self.name}>{self.pattern})")


def _abbreviation(m: re.Match, lang: str) -> str:
    written = nfc(m["ab"])
    en, hi = ABBREVIATIONS.get(written) or ABBREVIATIONS[m["ab"]]
    spoken = en if lang == "en" else hi
    if written.endswith(".") and not m.string[m.end() :].strip():
        spoken += "."  # the abbreviation's dot also ended the sentence
    return spoken


def _number_abbreviation(m: re.Match, lang: str) -> str:
    en, hi = NUMBER_ABBREVIATIONS.get(nfc(m["na"])) or NUMBER_ABBREVIATIONS[m["na"]]
    return en if lang == "en" else hi


def _slash(m: re.Match, lang: str) -> str | None:
    text, i = m.string, m.start()
    if text[i - 1].isdigit() and text[i + 1].isdigit():
        return None  # 3/2/1: not a choice between words
    if lang == "en" and m.string[: m.start()].endswith("and"):
        return " "  # and/or
    return f" {WORDS[lang]['or']} "


def _symbol(m: re.Match, lang: str) -> str:
    return WORDS[lang][SYMBOLS[m["sym"]]]


def _lone_currency(m: re.Match, lang: str) -> str:
    return CURRENCY_WORDS[LONE_CURRENCY[m["lc"]]][lang][1]


def _hash_number(m: re.Match, lang: str) -> str:
    return WORDS[lang]["number"]


B0, B1, NUM, DASH, NEG = p.B0, p.B1, p.NUM, p.DASH, p.NEG
_TO = rf"(?:{DASH}|\s(?:to|से)\s)"
_END = r"(?![\d,.]\d|\d)"
_LATIN_TLD = r"(?:com|in|org|net|co|io|gov|edu|ai|app|dev|info|me|ly)"

RULES: tuple[Rule, ...] = (
    # Each run below starts only where its characters start (the look-behinds), and a possessive
    # run is scanned once: tried from inside a long run instead, each of these is quadratic.
    Rule("email", r"(?<![\w.+%-])(?P<em>[A-Za-z0-9._%+-]++@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)",
         codes.email),
    Rule("url", r"(?<![\w@.-])(?P<url>(?:[A-Za-z][A-Za-z+.-]*://|www\.)[^\s<>\"']+?|"
         rf"[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.{_LATIN_TLD}(?:/[^\s<>\"']*?)?)"
         r"(?=[.,;:!?)\]'\"]*(?:\s|$))", codes.url),
    # Possessive: a long run of X or * must not be re-partitioned (exponential backtracking).
    Rule("masked", rf"{B0}(?<![*•])(?<![Xx*•][ -])(?:[Xx*•]{{2,}}+[ -]?+)++"
         r"(?P<mk_digits>\d{2,6})(?!\d)", codes.masked),
    Rule("phone", r"(?<![\w+])\+(?P<ph>\d[\d -]{7,18}\d|"
         r"\d{1,3}[ -]?\(\d{1,4}\)[ -]?\d[\d -]{4,14}\d)(?!\d)", codes.phone_international),
    Rule("landline", rf"{B0}(?:\((?P<ll_std>0\d{{2,4}})\)[ -]?|(?P<ll_code>0\d{{2,4}})[ -])"
         r"(?P<ll_sub>\d{2,8}(?:[ -]\d{2,8}){0,2})(?![\d-]|\.\d)", codes.landline),
    Rule("date_iso", rf"{B0}(?P<di_y>\d{{4}})-(?P<di_m>\d\d)-(?P<di_d>\d\d)(?![\d-])",
         clock.date_iso),
    Rule("date_numeric", rf"{B0}(?P<dn_a>\d{{1,2}})(?P<dn_sep>[/.-])(?P<dn_b>\d{{1,2}})"
         r"(?P=dn_sep)(?P<dn_y>\d{4}|\d{2})(?!\d|[/.-]\d)", clock.date_numeric),
    Rule("date_day_month", rf"{B0}(?P<dt_d>\d{{1,2}}){p.EN_ORDINAL}?(?:\s+of)?[\s-]+"
         rf"(?P<dt_m>{p.MONTH}){B1}{p.MONTH_DOT}(?:,?[\s-]+(?P<dt_y>\d{{4}})(?!\d))?",
         clock.date_day_month),
    Rule("date_month_day", rf"{B0}(?P<dm_m>{p.MONTH}){B1}{p.MONTH_DOT}\s+(?P<dm_d>\d{{1,2}})"
         rf"(?:{p.EN_ORDINAL})?{B1}(?:(?P<dm_c>,)?\s+(?P<dm_y>\d{{4}})(?!\d))?",
         clock.date_month_day),
    Rule("month_year", rf"{B0}(?P<my_m>{p.MONTH}){B1}{p.MONTH_DOT},?\s+(?P<my_y>\d{{4}})(?!\d)",
         clock.month_year),
    Rule("time", rf"{B0}(?P<t_h>[01]?\d|2[0-3])(?P<t_sep>[:.])(?P<t_m>[0-5]\d)"
         rf"(?::(?P<t_s>[0-5]\d))?(?!\d)(?:\s?(?P<t_ap>{p.AMPM}))?(?:\s?(?P<t_bj>{p.BAJE}))?",
         clock.clock_time),
    Rule("hour_ampm", rf"{B0}(?P<ta_h>1[0-2]|0?[1-9])\s?(?P<ta_ap>{p.AMPM})", clock.hour_ampm),
    Rule("money_prefix", rf"(?:(?P<mp_neg>{NEG})|{B0})(?P<mp_cur>{p.CUR_PREFIX})\s?"
         rf"(?P<mp_sign>[-−])?(?P<mp_a>{NUM})"
         rf"(?:\s?(?P<mp_sa>{p.SCALE})|(?P<mp_ka>{p.MONEY_SCALE}))?{B1}"
         rf"(?:{_TO}(?:{p.CUR_PREFIX}\s?)?(?P<mp_b>{NUM})"
         rf"(?:\s?(?P<mp_sb>{p.SCALE})|(?P<mp_kb>{p.MONEY_SCALE}))?{B1})?"
         rf"(?:/-|{p.per_unit('mp_per')})?",
         quantities.money_prefix),
    Rule("money_suffix", rf"(?:(?P<ms_neg>{NEG})|{B0})(?P<ms_a>{NUM})(?:{_TO}(?P<ms_b>{NUM}))?"
         rf"(?:\s?(?P<ms_s>{p.SCALE}))?\s?(?P<ms_cur>{p.CUR_SUFFIX})(?:{B1}|(?<=\.))(?:/-)?",
         quantities.money_suffix),
    Rule("percent", rf"(?P<p_neg>{NEG})?(?P<p_a>{NUM})(?:\s?%?{DASH}(?P<p_b>{NUM}))?\s?%",
         quantities.percent),
    Rule("measure", rf"(?P<u_neg>{NEG})?(?P<u_a>{NUM})(?:{_TO}(?P<u_b>{NUM}))?\s?"
         rf"(?P<u_unit>{p.UNIT})(?:{p.per_unit('u_per')}|{B1}|(?<=[.°℃℉]))",
         quantities.measure),
    Rule("ordinal_en", rf"{B0}(?P<oe_n>\d+)(?P<oe_s>{p.EN_ORDINAL}){B1}", quantities.ordinal_en),
    Rule("ordinal_hi", rf"{B0}(?P<oh_n>\d+)(?P<oh_s>{p.HI_ORDINAL}){B1}", quantities.ordinal_hi),
    # A list (1,2,3): every item but the last, each with its comma; the last is left to the rules.
    Rule("number_list", rf"{B0}(?<![.,:/])(?!{p.GROUPED})(?P<nl>{p.LIST_ITEM}(?:,{p.LIST_ITEM})*),"
         rf"(?={p.LIST_ITEM}(?!\d|,\d))", quantities.number_list),
    Rule("scaled", rf"(?P<sc_neg>{NEG})?(?P<sc_a>{NUM})(?:{DASH}(?P<sc_b>{NUM}))?\s?"
         rf"(?P<sc_s>{p.SCALE}){B1}", quantities.scaled_number),
    Rule("dash_code", rf"{B0}(?<!\d-)(?P<dc>\d+(?:-\d+){{2,}}+|\d{{5,}}-\d{{5,}}|"
         r"0\d{2,4}-\d{6,8})(?![\d-])", codes.dash_code),
    Rule("spaced", rf"{B0}(?P<sg>\d{{2,5}}(?: \d{{2,5}}){{1,3}}){_END}", codes.spaced_groups),
    Rule("alnum_id", rf"{B0}(?=[A-Z0-9]*[A-Z])(?=(?:[A-Z]*\d){{3}})(?P<id>[A-Z0-9]{{6,}}){B1}",
         codes.alphanumeric_id),
    Rule("decade", rf"{B0}(?P<dec>(?:1[0-9]|20)?[0-9]0)'?s{B1}", quantities.decade),
    Rule("times", rf"{B0}(?P<x_a>\d{{1,4}})\s?[x×]\s?(?P<x_b>\d{{1,4}}){B1}", quantities.times),
    Rule("version", rf"{B0}(?P<v>\d+(?:\.\d+){{2,}})(?!\.?\d)", quantities.version),
    Rule("range", rf"(?P<r_neg>{NEG})?(?P<r_a>{NUM}){DASH}(?P<r_b>{NUM}){_END}",
         quantities.number_range),
    Rule("fraction", rf"{B0}(?P<f_a>\d{{1,3}})/(?P<f_b>\d{{1,3}})(?![\d/]|\.\d)",
         quantities.fraction),
    Rule("number", rf"(?P<n_neg>{NEG})?(?P<n>{NUM}|(?<![\w.])\.\d+)", quantities.plain_number),
    Rule("number_abbrev", rf"{B0}(?P<na>{p.NUMBER_ABBREV})(?=\s?\d)", _number_abbreviation),
    Rule("abbrev", rf"{B0}(?P<ab>{p.ABBREV})(?:(?<=\.)|{B1})", _abbreviation),
    Rule("slash", rf"(?<={WORD_CHAR})/(?={WORD_CHAR})", _slash),
    Rule("hash_number", r"#(?=\s?\d)", _hash_number),
    Rule("lone_currency", r"(?P<lc>[₹$€£])", _lone_currency),
    Rule("symbol", r"(?P<sym>[&@%+=©])", _symbol),
    Rule("digits", r"(?P<d>\d+)", quantities.bare_digits),
)  # fmt: skip

_COMBINED = re.compile("|".join(f"(?P<R_{r.name}>{r.pattern})" for r in RULES))
_INDEX = {f"R_{r.name}": i for i, r in enumerate(RULES)}
_REGEXES = {r.name: r.regex for r in RULES}
_WORD = re.compile(WORD_CHAR)


def _speak(rule: Rule, m: re.Match, lang: str) -> str | None:
    try:
        return rule.speak(m, lang)
    except Exception as e:  # a rule bug must never lose the text or stop the speech
        logger.debug(f"normalize: rule {rule.name} failed on {m.group(0)!r}: {e!r}")
        return None


def _last_char(out: list[str]) -> str:
    return next((piece[-1] for piece in reversed(out) if piece), "")


def _join(out: list[str], spoken: str, following: str) -> None:
    """Append ``spoken`` with a space against a neighbouring word (5G -> five G)."""
    if _WORD.match(_last_char(out) or " ") and _WORD.match(spoken[:1] or " "):
        out.append(" ")
    out.append(spoken)
    if following and _WORD.match(following) and _WORD.match(spoken[-1:] or " "):
        out.append(" ")


def apply_rules(sentence: str, lang: str) -> str:
    """The spoken form of one sentence whose digits are ASCII, in ``lang`` ("hi" or "en")."""
    out: list[str] = []
    pos = 0
    while True:
        m = _COMBINED.search(sentence, pos)
        if m is None:
            break
        start = m.start()
        spoken, end = None, start
        for rule in RULES[_INDEX[m.lastgroup] :]:
            first = f"R_{rule.name}" == m.lastgroup
            mm = m if first else _REGEXES[rule.name].match(sentence, start)
            if mm is None or mm.end() == start:
                continue
            spoken = _speak(rule, mm, lang)
            if spoken is not None:
                end = mm.end()
                break
        if spoken is None:  # nothing took it: keep the character, go on after it
            out.append(sentence[pos : start + 1])
            pos = start + 1
            continue
        out.append(sentence[pos:start])
        _join(out, nfc(spoken), sentence[end : end + 1])
        pos = end
    out.append(sentence[pos:])
    return "".join(out)
