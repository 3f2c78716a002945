"""Regex pieces shared by the rules: numbers, boundaries and the alternations of the word tables.

Numbers are matched as written: Indian grouping (1,25,000), Western grouping (125,000) or no
grouping, with an optional decimal part. Devanagari digits are mapped to ASCII before any
pattern runs, so only ASCII digits appear here.
"""

from __future__ import annotations

import re

from pipecat_veena.normalize.tables import (
    ABBREVIATIONS,
    CURRENCY_PREFIX,
    CURRENCY_SUFFIX,
    MONEY_SCALES,
    MONTHS,
    NOT_AFTER_WORD,
    NOT_BEFORE_WORD,
    NUMBER_ABBREVIATIONS,
    PER_UNITS,
    SCALES,
    UNITS,
    WORD_CHAR,
    alternation,
)

# -- context words for digit-by-digit reading ------------------------------------------------
#: Words (any case) after which a number of 3 or more digits is read digit by digit.
DIGIT_CONTEXT = (
    "otp|pin|pincode|passcode|password|code|cvv|phone|ph|mobile|mob|cell|contact|call|dial|"
    "whatsapp|"
    "helpline|tel|telephone|account|acct|a/c|card|number|no|num|id|ref|reference|pnr|awb|"
    "tracking|ticket|txn|transaction|utr|upi|aadhaar|aadhar|extension|ext|"
    "नंबर|नम्बर|ओटीपी|पिन|कोड|खाता|मोबाइल|फ़ोन|फोन|कॉल|डायल|संख्या|आईडी|पासवर्ड"
).split("|")
#: Words that may sit between a context word and its number ("account number is 123").
DIGIT_FILLERS = (
    "is|was|are|number|Number|no|No|num|code|id|ID|details|of|your|my|the|code:|"
    "है|हैं|था|का|की|के|नंबर|नम्बर|कोड"
).split("|")
#: Words that, after a number, make it a code ("482913 is your OTP").
DIGIT_CONTEXT_AFTER = "OTP|otp|PIN|pin|code|Code|ओटीपी|पिन|कोड|passcode|password|पासवर्ड".split("|")
DIGIT_FILLERS_AFTER = "is|your|the|आपका|आपकी|यह|है|हैं".split("|")

#: Words before a 4-digit number that make it a year ("in 1997", "सन 1947").
YEAR_BEFORE = (
    "in|In|since|Since|year|Year|till|until|Until|before|Before|after|After|during|During|"
    "from|From|circa|born|died|FY|batch|class|Copyright|copyright|©|founded|Founded|"
    "established|Established|estd|Estd|season|election|सन|सन्|साल|वर्ष|ईस्वी"
).split("|")
#: Words after a 4-digit number that make it a year in Hindi ("1997 में").
YEAR_AFTER = "में|से|तक|के दौरान|के दशक|ई.|ईस्वी|AD|BC|CE".split("|")

B0 = NOT_AFTER_WORD
B1 = NOT_BEFORE_WORD
#: Indian grouping (last group of three, others of two) or Western (groups of three).
GROUPED = r"(?:\d{1,2}(?:,\d\d)+,\d{3}|\d{1,3}(?:,\d{3})+)(?!\d|,\d)"
INT = rf"(?:{GROUPED}|\d+)"
#: A number as written: grouped or not, with an optional decimal part.
NUM = rf"{INT}(?:\.\d+)?(?!\.\d)"
#: One item of a list written with commas and no spaces ("1,2,3"): no leading zero, at most three
#: digits, so that a run of them that is not GROUPED (groups of 3 after the first) is a list.
LIST_ITEM = r"(?:0|[1-9]\d{0,2})(?:\.\d+)?"
#: A minus sign where it cannot be a hyphen or a range dash.
NEG = r"(?:(?<![\w\d.,/%-])[-−])"
DASH = r"\s?[-–—]\s?"

MONTH = alternation(MONTHS)
#: The dot of an abbreviated month ("Aug."), unless it also ends the sentence (end of text, or a
#: capital or Devanagari letter next): then it stays in the text as the full stop it also is.
MONTH_DOT = r"(?:\.(?!\s*$|\s+[A-Z\u0900-\u097F]))?"
SCALE = alternation(SCALES)
MONEY_SCALE = alternation(MONEY_SCALES)
UNIT = alternation(UNITS)
PER_UNIT = alternation(PER_UNITS)
CUR_PREFIX = alternation(CURRENCY_PREFIX)
CUR_SUFFIX = alternation(CURRENCY_SUFFIX)
ABBREV = alternation(ABBREVIATIONS)
NUMBER_ABBREV = alternation(NUMBER_ABBREVIATIONS)
AMPM = r"(?:[AaPp]\.\s?[Mm]\.|[AaPp][Mm](?![A-Za-z]))"
BAJE = "बजे"

#: Ordinal suffixes: English, and Hindi with the form each gives (m, f, oblique).
EN_ORDINAL = r"(?:st|nd|rd|th|ST|ND|RD|TH)"
HI_ORDINAL_SUFFIXES = {
    "वाँ": "m", "वां": "m", "वीं": "f", "वी": "f", "वें": "o", "वे": "o",
    "ला": "m", "ली": "f", "ले": "o", "रा": "m", "री": "f", "रे": "o",
    "था": "m", "थी": "f", "थे": "o", "ठा": "m", "ठी": "f", "ठे": "o",
}  # fmt: skip
HI_ORDINAL = alternation(HI_ORDINAL_SUFFIXES)
#: Feminine nouns that follow an ordinal in agent speech ("21st सदी" = इक्कीसवीं सदी). An ordinal
#: written without a Hindi suffix (1st, 21st) takes -ी before one of these; any other noun keeps
#: the masculine default. Latin ones are those Hindi speakers make feminine (पहली EMI).
FEMININE_AFTER_ORDINAL = (
    "सदी|शताब्दी|मंज़िल|मंजिल|तारीख़|तारीख|किस्त|क़िस्त|किश्त|बार|दफ़ा|दफा|कक्षा|क्लास|पंक्ति|"
    "कतार|लाइन|रैंक|सीट|तिमाही|छमाही|वर्षगाँठ|सालगिरह|पीढ़ी|डोज़|किताब|गली|ट्रेन|कॉल|बैठक|"
    "मीटिंग|पारी|कोशिश|बेटी|ईएमआई"
).split("|")
FEMININE_AFTER_ORDINAL_LATIN = (
    "EMI|class|century|date|installment|instalment|seat|rank|line|call|train|meeting|dose"
).split("|")
#: Hindi postpositions: a noun (or an ordinal) before one takes its oblique form (एक रुपये का).
POSTPOSITION = r"(?:का|की|के|में|से|को|पर|तक)(?![\u0900-\u097f])"


def per_unit(group: str) -> str:
    """The slash and unit after a unit or an amount ("/kg", "/s": "per kilogram"), in ``group``."""
    return rf"/(?P<{group}>{PER_UNIT}){B1}"


def _words(words: list[str]) -> str:
    return alternation(words)


#: How far the rules look either side of a number for the words that decide its reading.
CONTEXT_CHARS = 40


def text_before(m: re.Match) -> str:
    """The ``CONTEXT_CHARS`` of text just before a match (what DIGIT_CONTEXT_LEFT reads)."""
    return m.string[max(0, m.start() - CONTEXT_CHARS) : m.start()]


def text_after(m: re.Match) -> str:
    """The ``CONTEXT_CHARS`` of text just after a match (what DIGIT_CONTEXT_RIGHT reads)."""
    return m.string[m.end() : m.end() + CONTEXT_CHARS]


#: Left context (ends right before the number) that makes it a code read digit by digit.
DIGIT_CONTEXT_LEFT = re.compile(
    rf"{B0}(?i:{_words(DIGIT_CONTEXT)})\.?(?:[\s:#.\-]+{_words(DIGIT_FILLERS)}{B1})*[\s:#.\-]*$"
)
#: A number (3 digits or more) and a list word before this one: "100 or 112", "100, 101".
_LISTED_BEFORE = re.compile(r"(?<![\d.,])\d{3,}\s*(?:,|/|or|and|या|और)\s*$")
#: How many listed numbers back a context word may be ("call 100, 101, 102 or 112").
MAX_LISTED = 8


def asks_for_digits(m: re.Match) -> bool:
    """A word before the number, or before the list it ends, asks for digits (OTP, call, #).

    "Call 100 or 112": 112 is read like 100, digit by digit, whatever reads 100.
    """
    end = m.start()
    for _ in range(MAX_LISTED):
        before = m.string[max(0, end - CONTEXT_CHARS) : end]
        if before.endswith("#") or DIGIT_CONTEXT_LEFT.search(before):
            return True
        listed = _LISTED_BEFORE.search(before)
        if listed is None:
            return False
        end -= len(before) - listed.start()
    return False


#: Right context (starts right after the number) that makes it a code.
DIGIT_CONTEXT_RIGHT = re.compile(
    rf"^[\s,:]*(?:{_words(DIGIT_FILLERS_AFTER)}\s+){{0,3}}{_words(DIGIT_CONTEXT_AFTER)}{B1}"
)
#: After an ordinal: a feminine noun (the ordinal takes -ी).
FEMININE_NEXT = re.compile(
    rf"\s+(?:{_words(FEMININE_AFTER_ORDINAL)}|(?i:{_words(FEMININE_AFTER_ORDINAL_LATIN)})){B1}"
)
#: After an ordinal: a postposition, or one word then a postposition (the ordinal takes -े).
OBLIQUE_NEXT = re.compile(rf"\s+(?:{WORD_CHAR}+\s+)?{POSTPOSITION}")
YEAR_LEFT = re.compile(rf"{B0}{_words(YEAR_BEFORE)}\s+$")
YEAR_RIGHT = re.compile(rf"^\s*{_words(YEAR_AFTER)}(?!\w)")
MONEY_RIGHT = re.compile(rf"^\s*{CUR_SUFFIX}")


def parse_number(raw: str) -> tuple[str, str | None, bool]:
    """Split a number as written into (integer digits, fraction digits or None, grouped)."""
    int_part, _, frac = raw.partition(".")
    return int_part.replace(",", ""), (frac or None), "," in int_part


def is_indian_grouping(raw: str) -> bool | None:
    """True for 1,25,000-style grouping, False for 125,000-style.

    None when the number is not grouped, or when both read the same (below one lakh).
    """
    int_part = raw.partition(".")[0]
    if "," not in int_part:
        return None
    if re.fullmatch(r"\d{1,2}(?:,\d\d)+,\d{3}", int_part):
        return True
    if len(int_part.replace(",", "")) <= 5:
        return None
    return False
