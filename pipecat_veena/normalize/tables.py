"""Word tables of the normaliser: months, units, currencies, scale words, abbreviations, symbols.

Every table is keyed by what may appear in the text and gives the spoken form per language
("en": Indian English, "hi": Hindi in Devanagari). Latin-script English words inside Hindi are
left alone by the rules (the Veena family reads them), so the Hindi forms here are only for
things that are not words: symbols, abbreviations, units and numbers.
"""

from __future__ import annotations

import re
import unicodedata

#: One character of a word: Latin letters and digits (``\w``) or any Devanagari letter or sign.
#: Devanagari vowel signs are not ``\w`` in Python, so ``\b`` cannot be trusted on Hindi text.
WORD_CHAR = r"[\w\u0900-\u0963\u0966-\u096f\u0971-\u097f]"
NOT_AFTER_WORD = rf"(?<!{WORD_CHAR})"
NOT_BEFORE_WORD = rf"(?!{WORD_CHAR})"

_NUKTA = "\u093c"
_PRECOMPOSED = {unicodedata.normalize("NFD", chr(c))[0]: chr(c) for c in range(0x0958, 0x0960)}


def nukta_re(word: str) -> str:
    """A regex matching ``word`` whether its nukta letters are precomposed or not."""
    word = unicodedata.normalize("NFC", word)
    out: list[str] = []
    i = 0
    while i < len(word):
        ch = word[i]
        if i + 1 < len(word) and word[i + 1] == _NUKTA and ch in _PRECOMPOSED:
            out.append(f"(?:{re.escape(ch)}{_NUKTA}|{_PRECOMPOSED[ch]})")
            i += 2
            continue
        out.append(re.escape(ch))
        i += 1
    return "".join(out)


def alternation(words: list[str] | tuple[str, ...] | dict[str, object]) -> str:
    """A non-capturing alternation of ``words`` (longest first, nukta-insensitive)."""
    return "(?:" + "|".join(nukta_re(w) for w in sorted(words, key=len, reverse=True)) + ")"


def nfc(text: str) -> str:
    """NFC form of ``text`` (how every Hindi string of this package is compared)."""
    return unicodedata.normalize("NFC", text)


# -- connecting words ------------------------------------------------------------------------
WORDS: dict[str, dict[str, str]] = {
    "en": {
        "point": "point",
        "minus": "minus",
        "plus": "plus",
        "to": "to",
        "and": "and",
        "percent": "percent",
        "ending": "ending in {digits}",
        "by": "by",
        "times": "by",
        "or": "or",
        "at": "at",
        "equals": "equals",
        "copyright": "copyright",
        "number": "number",
        "dot": "dot",
        "slash": "slash",
        "dash": "dash",
        "underscore": "underscore",
        "colon": "colon",
        "question": "question mark",
        "hundred_hours": "hundred hours",
        "per": "per",
    },
    "hi": {
        "point": "दशमलव",
        "minus": "माइनस",
        "plus": "प्लस",
        "to": "से",
        "and": "और",
        "percent": "प्रतिशत",
        "ending": "{digits} पर खत्म होने वाला",
        "by": "बटा",
        "times": "बाई",
        "or": "या",
        "at": "ऐट",
        "equals": "बराबर",
        "copyright": "कॉपीराइट",
        "number": "नंबर",
        "dot": "डॉट",
        "slash": "स्लैश",
        "dash": "डैश",
        "underscore": "अंडरस्कोर",
        "colon": "कोलन",
        "question": "क्वेश्चन मार्क",
        "hundred_hours": "बजे",
        "per": "प्रति",
    },
}

# -- months ----------------------------------------------------------------------------------
_MONTHS_EN = (
    "January February March April May June July August September October November December"
).split()
_MONTHS_HI = "जनवरी फ़रवरी मार्च अप्रैल मई जून जुलाई अगस्त सितंबर अक्टूबर नवंबर दिसंबर".split()
#: Month number (1-12) to its name per language.
MONTH_NAMES: dict[str, list[str]] = {"en": _MONTHS_EN, "hi": [nfc(m) for m in _MONTHS_HI]}

#: Month as written (English full, three-letter, Sept; Hindi with spelling variants) -> 1-12.
MONTHS: dict[str, int] = {}
for _i, _name in enumerate(_MONTHS_EN, start=1):
    MONTHS[_name] = MONTHS[_name.upper()] = MONTHS[_name[:3]] = MONTHS[_name[:3].upper()] = _i
MONTHS["Sept"] = MONTHS["SEPT"] = 9
for _i, _name in enumerate(_MONTHS_HI, start=1):
    MONTHS[nfc(_name)] = _i
for _name, _i in {
    "फरवरी": 2, "अप्रेल": 4, "सितम्बर": 9, "अक्तूबर": 10, "अक्टूबर": 10, "नवम्बर": 11,
    "दिसम्बर": 12, "जुलाइ": 7,
}.items():  # fmt: skip
    MONTHS[nfc(_name)] = _i

# -- scale words -----------------------------------------------------------------------------
#: Scale word as written -> (key, value); the key picks the spoken word per language.
SCALES: dict[str, tuple[str, int]] = {
    "thousand": ("thousand", 10**3),
    "lakh": ("lakh", 10**5),
    "lakhs": ("lakh", 10**5),
    "lac": ("lakh", 10**5),
    "lacs": ("lakh", 10**5),
    "crore": ("crore", 10**7),
    "crores": ("crore", 10**7),
    "cr": ("crore", 10**7),
    "million": ("million", 10**6),
    "billion": ("billion", 10**9),
    "mn": ("million", 10**6),
    "bn": ("billion", 10**9),
    nfc("हज़ार"): ("thousand", 10**3),
    "हजार": ("thousand", 10**3),
    "लाख": ("lakh", 10**5),
    nfc("करोड़"): ("crore", 10**7),
    "अरब": ("arab", 10**9),
}
#: Short scale suffixes that count only right after a currency amount (₹5k, $2M).
MONEY_SCALES: dict[str, tuple[str, int]] = {
    "k": ("thousand", 10**3),
    "K": ("thousand", 10**3),
    "M": ("million", 10**6),
    "B": ("billion", 10**9),
    "m": ("million", 10**6),
    "L": ("lakh", 10**5),
    "Cr": ("crore", 10**7),
}
SCALE_WORDS: dict[str, dict[str, str]] = {
    "en": {
        "thousand": "thousand",
        "lakh": "lakh",
        "crore": "crore",
        "million": "million",
        "billion": "billion",
        "arab": "hundred crore",
    },
    "hi": {
        "thousand": nfc("हज़ार"),
        "lakh": "लाख",
        "crore": nfc("करोड़"),
        "million": "मिलियन",
        "billion": "बिलियन",
        "arab": "अरब",
    },
}

# -- currencies ------------------------------------------------------------------------------
#: Currency key -> language -> (unit singular, unit plural, sub-unit singular, sub-unit plural).
CURRENCY_WORDS: dict[str, dict[str, tuple[str, str, str, str]]] = {
    "INR": {
        "en": ("rupee", "rupees", "paisa", "paise"),
        "hi": ("रुपया", "रुपये", "पैसा", "पैसे"),
    },
    "USD": {"en": ("dollar", "dollars", "cent", "cents"), "hi": (nfc("डॉलर"),) * 2 + ("सेंट",) * 2},
    "EUR": {"en": ("euro", "euros", "cent", "cents"), "hi": ("यूरो", "यूरो", "सेंट", "सेंट")},
    "GBP": {"en": ("pound", "pounds", "penny", "pence"), "hi": ("पाउंड", "पाउंड", "पेंस", "पेंस")},
}
#: Currency written before the amount -> currency key.
CURRENCY_PREFIX: dict[str, str] = {
    "₹": "INR",
    "Rs.": "INR",
    "Rs": "INR",
    "rs.": "INR",
    "RS.": "INR",
    "RS": "INR",
    "INR": "INR",
    "रु.": "INR",
    "रु": "INR",
    "US$": "USD",
    "$": "USD",
    "USD": "USD",
    "€": "EUR",
    "EUR": "EUR",
    "£": "GBP",
    "GBP": "GBP",
}
#: Currency written after the amount (words stay as written; "Rs", "INR" become words).
CURRENCY_SUFFIX: dict[str, str | None] = {
    "Rs.": "INR",
    "Rs": "INR",
    "INR": "INR",
    "रु.": "INR",
    "₹": "INR",
    "rupees": None,
    "rupee": None,
    "रुपये": None,
    "रुपए": None,
    "रुपया": None,
    "रुपयों": None,
    "paise": None,
    "पैसे": None,
    "dollars": None,
    "dollar": None,
    nfc("डॉलर"): None,
}

# -- units -----------------------------------------------------------------------------------
#: Unit as written -> (English singular, English plural, Hindi singular, Hindi plural).
UNITS: dict[str, tuple[str, str, str, str]] = {}


def _unit(names: str, en1: str, en2: str, hi1: str, hi2: str | None = None) -> None:
    for name in names.split("|"):
        UNITS[nfc(name)] = (en1, en2, nfc(hi1), nfc(hi2 or hi1))


_unit("km|kms|Km|KM|किमी|कि.मी.", "kilometre", "kilometres", "किलोमीटर")
_unit("km/h|km/hr|kmph|kmh|Kmph|KMPH", "kilometre per hour", "kilometres per hour",
      "किलोमीटर प्रति घंटा")  # fmt: skip
_unit("kg|kgs|Kg|KG|किग्रा|कि.ग्रा.", "kilogram", "kilograms", "किलो")
_unit("g|gm|gms|gram|grams", "gram", "grams", "ग्राम")
_unit("mg", "milligram", "milligrams", "मिलीग्राम")
_unit("cm", "centimetre", "centimetres", "सेंटीमीटर")
_unit("mm", "millimetre", "millimetres", "मिलीमीटर")
_unit("m", "metre", "metres", "मीटर")
_unit("ml|mL|ML", "millilitre", "millilitres", "मिलीलीटर")
_unit("l|L|ltr|ltrs", "litre", "litres", "लीटर")
_unit("GB|gb", "gigabyte", "gigabytes", "जीबी")
_unit("MB|mb", "megabyte", "megabytes", "एमबी")
_unit("KB|kb", "kilobyte", "kilobytes", "केबी")
_unit("TB", "terabyte", "terabytes", "टीबी")
_unit("Mbps|mbps", "megabit per second", "megabits per second", "एमबीपीएस")
_unit("hrs|hr|Hrs|Hr", "hour", "hours", "घंटा", "घंटे")
_unit("min|mins|Min|Mins", "minute", "minutes", "मिनट")
_unit("sec|secs|Sec|Secs", "second", "seconds", "सेकंड")
_unit("ms", "millisecond", "milliseconds", "मिलीसेकंड")
_unit("°C|° C|℃|°c", "degree Celsius", "degrees Celsius", "डिग्री सेल्सियस")
_unit("°F|° F|℉", "degree Fahrenheit", "degrees Fahrenheit", "डिग्री फ़ारेनहाइट")
_unit("°", "degree", "degrees", "डिग्री")
_unit("kW|KW", "kilowatt", "kilowatts", "किलोवाट")
_unit("kWh|KWh", "kilowatt hour", "kilowatt hours", "किलोवाट घंटा", "किलोवाट घंटे")
_unit("ft", "foot", "feet", "फ़ुट")
_unit("sq ft|sqft", "square foot", "square feet", "वर्ग फ़ुट")

#: What may follow a unit's slash ("5 m/s", "₹40/kg") -> (English, Hindi) singular, said after
#: "per": every unit, and the short time words a unit is divided by.
PER_UNITS: dict[str, tuple[str, str]] = {name: (v[0], v[2]) for name, v in UNITS.items()}
PER_UNITS.update({"s": ("second", "सेकंड"), "h": ("hour", "घंटा"), "day": ("day", "दिन"),
                  "week": ("week", "हफ़्ता"), "month": ("month", "महीना"), "yr": ("year", "साल"),
                  "year": ("year", "साल"), "person": ("person", "व्यक्ति")})  # fmt: skip
PER_UNITS = {nfc(k): (v[0], nfc(v[1])) for k, v in PER_UNITS.items()}

# -- abbreviations ---------------------------------------------------------------------------
#: Abbreviation as written (with its dot) -> (English, Hindi).
ABBREVIATIONS: dict[str, tuple[str, str]] = {
    "Dr.": ("Doctor", "डॉक्टर"),
    "Mr.": ("Mister", "मिस्टर"),
    "Mrs.": ("Missus", "मिसेज़"),
    "Ms.": ("Miss", "मिस"),
    "Prof.": ("Professor", "प्रोफ़ेसर"),
    "Jr.": ("Junior", "जूनियर"),
    "Sr.": ("Senior", "सीनियर"),
    "etc.": ("et cetera", "वगैरह"),
    "vs.": ("versus", "बनाम"),
    "v/s": ("versus", "बनाम"),
    "Rs.": ("rupees", "रुपये"),
    "e.g.": ("for example", "जैसे"),
    "i.e.": ("that is", "यानी"),
    "approx.": ("approximately", "लगभग"),
    "Govt.": ("Government", "सरकार"),
    "Ltd.": ("Limited", "लिमिटेड"),
    "Pvt.": ("Private", "प्राइवेट"),
    "Dept.": ("Department", "डिपार्टमेंट"),
    "a/c": ("account", "अकाउंट"),
    "A/c": ("account", "अकाउंट"),
    "A/C": ("account", "अकाउंट"),
    "डॉ.": ("Doctor", "डॉक्टर"),
    "डा.": ("Doctor", "डॉक्टर"),
    "प्रो.": ("Professor", "प्रोफ़ेसर"),
    "रु.": ("rupees", "रुपये"),
}
ABBREVIATIONS = {nfc(k): (v[0], nfc(v[1])) for k, v in ABBREVIATIONS.items()}
#: Abbreviations that count only before a number ("No. 5", "नं. 12").
NUMBER_ABBREVIATIONS: dict[str, tuple[str, str]] = {
    "No.": ("number", "नंबर"),
    "no.": ("number", "नंबर"),
    "NO.": ("number", "नंबर"),
    "नं.": ("number", "नंबर"),
}

# -- symbols ---------------------------------------------------------------------------------
#: Symbol -> key in WORDS (spelled in the sentence's language).
SYMBOLS: dict[str, str] = {
    "&": "and", "@": "at", "%": "percent", "+": "plus", "=": "equals", "©": "copyright",
}  # fmt: skip
#: A lone currency sign (no amount next to it) -> currency key (its plural word is spoken).
LONE_CURRENCY: dict[str, str] = {"₹": "INR", "$": "USD", "€": "EUR", "£": "GBP"}
