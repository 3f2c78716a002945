"""An SSML subset, parsed only when a request asks for it: markup in, spans and breaks out.

Supported: ``<speak>``, ``<p>``, ``<s>``, ``<break time="300ms"/>`` or ``strength``, ``<sub
alias>``, ``<say-as interpret-as="characters|spell-out|digits|cardinal|ordinal|date|time|
telephone|currency">``, ``<prosody rate>``, ``<lang xml:lang="hi|en">`` and ``<phoneme
alphabet="ipa" ph>``. Anything else (another tag or attribute, a DTD, a comment, CDATA, an entity
other than XML's five and character references) is an error naming its position: nothing is
silently spoken. The tokenizer is hand-written and linear: no entity expansion exists to abuse,
and the size and depth are bounded before any work (``MAX_SSML_CHARS``, ``MAX_DEPTH``).

``parse_ssml`` gives ``Span`` (written words, and the model's text where markup fixed it) and
``Break`` items; ``spoken_text`` turns them into the text the model reads.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from loguru import logger

from pipecat_veena.normalize import Lexicon, normalize, numbers, sentence_language
from pipecat_veena.normalize.tables import nfc
from pipecat_veena.text import DEFAULT_MAX_PART_CHARS, Part, split_parts

__all__ = [
    "MAX_BREAK_S",
    "MAX_DEPTH",
    "MAX_SSML_CHARS",
    "break_markup",
    "Break",
    "Span",
    "SsmlError",
    "escape",
    "ipa_respelling",
    "markup_of_hook",
    "phoneme_markup",
    "respell",
    "model_text",
    "parse_ssml",
    "say_as",
    "speech_parts",
    "ssml_parts",
]

#: Longest document accepted (characters); longer ones are refused before parsing.
MAX_SSML_CHARS = 100_000
#: Deepest nesting of elements accepted.
MAX_DEPTH = 32
#: Longest single break, and all of a document's breaks together (seconds).
MAX_BREAK_S = 10.0
MAX_TOTAL_BREAK_S = 60.0
#: ``<break strength>`` in seconds.
STRENGTHS = {"none": 0.0, "x-weak": 0.1, "weak": 0.25, "medium": 0.4, "strong": 0.75,
             "x-strong": 1.2}  # fmt: skip
#: ``<prosody rate>`` words; numbers and percentages are taken too, 0.5-2.0.
RATES = {"x-slow": 0.5, "slow": 0.75, "medium": 1.0, "default": 1.0, "fast": 1.25, "x-fast": 1.5}
MIN_RATE, MAX_RATE = 0.5, 2.0
#: Whether the engine speaks ``<prosody rate>`` spans at their speed (else the tag is refused).
PROSODY_RATE = True
SAY_AS = ("characters", "spell-out", "digits", "cardinal", "ordinal", "date", "time",
          "telephone", "currency")  # fmt: skip

_ENTITIES = {"lt": "<", "gt": ">", "amp": "&", "quot": '"', "apos": "'"}
_NAME = re.compile(r"[A-Za-z_][\w.:-]*")
_ATTR = re.compile(r"\s+([A-Za-z_][\w.:-]*)\s*=\s*(?:\"([^\"<]*)\"|'([^'<]*)')")
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*")
#: Attributes each tag takes (any other is an error).
_TAGS: dict[str, frozenset[str]] = {
    "speak": frozenset({"version", "xmlns", "xml:lang", "xmlns:xsi", "xsi:schemaLocation"}),
    "p": frozenset(),
    "s": frozenset(),
    "break": frozenset({"time", "strength"}),
    "sub": frozenset({"alias"}),
    "say-as": frozenset({"interpret-as", "format", "detail"}),
    "prosody": frozenset({"rate"}),
    "lang": frozenset({"xml:lang"}),
    "phoneme": frozenset({"alphabet", "ph"}),
}
#: Tags whose content is the one word or phrase they fix: text only, no markup inside.
_LEAF = ("sub", "say-as", "phoneme")


class SsmlError(ValueError):
    """Malformed or unsupported markup; the message names the position (character offset)."""

    def __init__(self, message: str, position: int, text: str = "") -> None:
        line = text.count("\n", 0, position) + 1
        column = position - (text.rfind("\n", 0, position) + 1) + 1
        super().__init__(f"SSML at character {position} (line {line}, column {column}): {message}")
        self.position = position


@dataclass(frozen=True)
class Span:
    """Words of the document as written, and how to say them.

    Attributes:
        written: the words as written (what word timings report).
        spoken: the model's text where markup fixed it (``<sub>``, ``<say-as>``, a mapped
            ``<phoneme>``); None: normalise ``written`` as usual.
        language: "hi" or "en" from ``<lang>`` / ``<speak xml:lang>``; None: the request's.
        rate: ``<prosody rate>`` (0.5-2.0); None: the request's speed.
        interpret_as: ``<say-as interpret-as>``: ``written`` is said that way (``say_as``) in
            the span's language, or the request's (known only when the parts are made).
    """

    written: str
    spoken: str | None = None
    language: str | None = None
    rate: float | None = None
    interpret_as: str | None = None


@dataclass(frozen=True)
class Break:
    """Silence of ``seconds`` between words."""

    seconds: float


@dataclass
class _Open:
    tag: str
    attrs: dict[str, str]
    at: int
    language: str | None
    rate: float | None
    text: list[str]


def parse_ssml(text: str) -> list[Span | Break]:
    """The spans and breaks of an SSML document (``<speak>`` around it is optional).

    Raises:
        SsmlError: malformed markup, an unknown tag or attribute, a DTD, comment, CDATA or
            unknown entity, a bad value, or a document over the size or depth bounds.
    """
    if len(text) > MAX_SSML_CHARS:
        raise SsmlError(
            f"the document has {len(text)} characters; at most {MAX_SSML_CHARS} are accepted "
            "(send long text in several requests)",
            MAX_SSML_CHARS,
        )
    out: list[Span | Break] = []
    stack: list[_Open] = []
    total_break = 0.0
    i, n = 0, len(text)
    if text.startswith("<?xml"):
        end = text.find("?>")
        if end < 0:
            raise SsmlError("the XML declaration '<?xml' is not closed with '?>'", 0, text)
        i = end + 2

    def context() -> tuple[str | None, float | None]:
        return (stack[-1].language, stack[-1].rate) if stack else (None, None)

    gap = False  # a tag came since the last text

    def add_text(raw: str, at: int) -> None:
        nonlocal gap
        words = _unescape(raw, at, text)
        if stack and stack[-1].tag in _LEAF:
            stack[-1].text.append(words)
        elif words.strip():
            language, rate = context()
            _add(out, Span(f" {words}" if gap and out else words, None, language, rate))
        gap = False

    while i < n:
        lt = text.find("<", i)
        if lt < 0:
            add_text(text[i:], i)
            break
        if lt > i:
            add_text(text[i:lt], i)
        if text.startswith("<!", lt) or text.startswith("<?", lt):
            raise SsmlError(
                "DTDs, entity declarations, comments, CDATA and processing instructions are "
                "not accepted (write plain text and the supported tags only)",
                lt,
                text,
            )
        if not text.startswith("</", lt) and not _NAME.match(text, lt + 1):
            raise SsmlError("'<' starts no tag (write &lt; for a literal '<')", lt, text)
        gt = text.find(">", lt)
        if gt < 0:
            raise SsmlError("a tag is not closed with '>'", lt, text)
        if text.startswith("</", lt):
            name = text[lt + 2 : gt].strip()
            if not stack or stack[-1].tag != name:
                expected = f"</{stack[-1].tag}>" if stack else "no closing tag"
                raise SsmlError(f"</{name}> does not close an open tag (expected {expected})",
                                lt, text)  # fmt: skip
            _close(stack.pop(), out, text)
            gap = True  # </s>Next: words on either side of a tag do not run together
            i = gt + 1
            continue
        m = _NAME.match(text, lt + 1)
        tag = m.group(0)
        if tag not in _TAGS:
            raise SsmlError(
                f"unknown tag <{tag}> (supported: {', '.join(sorted(_TAGS))})", lt, text
            )
        body = text[m.end() : gt]
        closed = body.rstrip().endswith("/")
        if closed:
            body = body.rstrip()[:-1]
        attrs = _attributes(tag, body, m.end(), text)
        if stack and stack[-1].tag in _LEAF:
            raise SsmlError(f"<{tag}> inside <{stack[-1].tag}>: it takes text only", lt, text)
        if tag == "break":
            seconds = _break_seconds(attrs, lt, text)
            total_break += seconds
            if total_break > MAX_TOTAL_BREAK_S:
                raise SsmlError(f"the breaks add up to more than {MAX_TOTAL_BREAK_S:g} s", lt, text)
            if seconds > 0:
                if out and isinstance(out[-1], Break):
                    out[-1] = Break(round(out[-1].seconds + seconds, 6))
                else:
                    out.append(Break(seconds))
            if not closed:  # <break></break>
                stack.append(_Open(tag, attrs, lt, *context(), []))
        else:
            language, rate = context()
            if tag in ("lang", "speak") and "xml:lang" in attrs:
                language = _language(attrs["xml:lang"], lt, text)
            if tag == "prosody":
                rate = _rate(attrs.get("rate"), lt, text)
            if tag == "phoneme" and attrs.get("alphabet", "ipa").lower() != "ipa":
                raise SsmlError(
                    f'<phoneme alphabet={attrs["alphabet"]!r}>: only alphabet="ipa" is supported',
                    lt,
                    text,
                )
            if tag == "say-as" and attrs.get("interpret-as") not in SAY_AS:
                raise SsmlError(
                    f"<say-as interpret-as={attrs.get('interpret-as')!r}>: use one of "
                    f"{', '.join(SAY_AS)}",
                    lt,
                    text,
                )
            if tag == "sub" and "alias" not in attrs:
                raise SsmlError('<sub> needs alias="..."', lt, text)
            if tag == "phoneme" and "ph" not in attrs:
                raise SsmlError('<phoneme> needs ph="..."', lt, text)
            if not closed:
                if len(stack) >= MAX_DEPTH:
                    raise SsmlError(f"elements nested deeper than {MAX_DEPTH}", lt, text)
                stack.append(_Open(tag, attrs, lt, language, rate, []))
            elif tag in _LEAF:
                raise SsmlError(f"<{tag}/> is empty: put the words it is for inside it", lt, text)
            gap = True
        i = gt + 1
    if stack:
        raise SsmlError(f"<{stack[-1].tag}> is never closed", stack[-1].at, text)
    return out


def _add(out: list[Span | Break], span: Span) -> None:
    """Append ``span``, joined to the span before when they are said the same way."""
    last = out[-1] if out else None
    if (
        isinstance(last, Span)
        and last.spoken is None
        and last.interpret_as is None
        and span.spoken is None
        and (last.language, last.rate) == (span.language, span.rate)
    ):
        out[-1] = Span(last.written + span.written, None, last.language, last.rate)
    else:
        out.append(span)


def _close(element: _Open, out: list[Span | Break], text: str) -> None:
    if element.tag not in _LEAF:
        return
    written = " ".join("".join(element.text).split())
    if not written:
        raise SsmlError(f"<{element.tag}> is empty: put the words it is for inside it",
                        element.at, text)  # fmt: skip
    attrs = element.attrs
    if element.tag == "sub":
        spoken = " ".join(attrs["alias"].split())
    elif element.tag == "say-as":
        out.append(Span(written, None, element.language, element.rate, attrs["interpret-as"]))
        return
    else:
        spoken = ipa_respelling(attrs["ph"], written)
    out.append(Span(written, spoken, element.language, element.rate))


def _attributes(tag: str, body: str, at: int, text: str) -> dict[str, str]:
    attrs: dict[str, str] = {}
    pos = 0
    for m in _ATTR.finditer(body):
        if m.start() != pos:
            break
        name = m.group(1)
        if name not in _TAGS[tag]:
            raise SsmlError(
                f"<{tag}> has no attribute {name!r}"
                + (f" (it takes {', '.join(sorted(_TAGS[tag]))})" if _TAGS[tag] else ""),
                at + m.start(1),
                text,
            )
        if name in attrs:
            raise SsmlError(f"attribute {name!r} given twice", at + m.start(1), text)
        raw = m.group(2) if m.group(2) is not None else m.group(3)
        attrs[name] = _unescape(raw, at + m.start(), text)
        pos = m.end()
    if body[pos:].strip():
        raise SsmlError(
            f"<{tag}>: cannot read its attributes from {body[pos:].strip()[:40]!r} "
            '(write name="value")',
            at + pos,
            text,
        )
    return attrs


def _unescape(raw: str, at: int, text: str) -> str:
    """Text with XML's five entities and character references replaced; no other entity."""
    if "&" not in raw:
        return raw
    out: list[str] = []
    i = 0
    while True:
        amp = raw.find("&", i)
        if amp < 0:
            out.append(raw[i:])
            return "".join(out)
        out.append(raw[i:amp])
        semi = raw.find(";", amp, amp + 12)
        name = raw[amp + 1 : semi] if semi > 0 else ""
        if name in _ENTITIES:
            out.append(_ENTITIES[name])
        elif re.fullmatch(r"#[0-9]{1,7}|#x[0-9A-Fa-f]{1,6}", name):
            code = int(name[2:], 16) if name[1] == "x" else int(name[1:])
            if not 0 < code <= 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise SsmlError(f"&{name}; is not a character", at + amp, text)
            out.append(chr(code))
        else:
            raise SsmlError(
                "only &lt; &gt; &amp; &quot; &apos; and &#...; are accepted (write &amp; for a "
                "literal '&'; no other entity is defined or expanded)",
                at + amp,
                text,
            )
        i = semi + 1


def _break_seconds(attrs: dict[str, str], at: int, text: str) -> float:
    if "time" in attrs:
        m = _DURATION.fullmatch(attrs["time"])
        if not m:
            raise SsmlError(
                f'<break time={attrs["time"]!r}>: write a duration such as "300ms" or "1.5s"',
                at,
                text,
            )
        seconds = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
        if seconds > MAX_BREAK_S:
            raise SsmlError(f"<break time={attrs['time']!r}>: at most {MAX_BREAK_S:g} s",
                            at, text)  # fmt: skip
        return seconds
    strength = attrs.get("strength", "medium")
    if strength not in STRENGTHS:
        raise SsmlError(f"<break strength={strength!r}>: use one of {', '.join(STRENGTHS)}",
                        at, text)  # fmt: skip
    return STRENGTHS[strength]


def _language(value: str, at: int, text: str) -> str:
    lang = value.split("-")[0].lower()
    if lang not in ("hi", "en"):
        raise SsmlError(f"xml:lang={value!r}: only hi and en (hi-IN, en-IN, ...) are spoken",
                        at, text)  # fmt: skip
    return lang


def _rate(value: str | None, at: int, text: str) -> float:
    if value is None:
        raise SsmlError('<prosody> needs rate="..." (the only prosody supported)', at, text)
    v = value.strip().lower()
    try:
        if v in RATES:
            rate = RATES[v]
        elif v.endswith("%"):
            rate = float(v[:-1]) / 100
        else:
            rate = float(v)
    except ValueError:
        raise SsmlError(
            f"<prosody rate={value!r}>: write x-slow..x-fast, a percentage or a number", at, text
        ) from None
    if not MIN_RATE <= rate <= MAX_RATE:
        raise SsmlError(f"<prosody rate={value!r}>: the rate must be {MIN_RATE}-{MAX_RATE}",
                        at, text)  # fmt: skip
    if not PROSODY_RATE:
        raise SsmlError(
            "<prosody rate> is not supported yet (a speed for one span); send the request's "
            "speed for the whole text instead",
            at,
            text,
        )
    return rate


def ssml_parts(
    items: list[Span | Break],
    speak: Callable[[str, str | None], str] | None = None,
    max_chars: int = DEFAULT_MAX_PART_CHARS,
    language: Callable[[str | None], str] = lambda forced: forced or "en",
) -> list[Part]:
    """The engine's parts for a parsed document: breaks become pauses, spans prompts.

    Args:
        items: ``parse_ssml``'s output.
        speak: the spoken form of one written sentence in a language ("hi", "en" or None: the
            request's); None: as written (normalising off). Spans that markup fixed are not
            passed through it.
        max_chars: the length budget of one part.
        language: the language ("hi" or "en") a ``<say-as>`` span is said in, from its own
            (``<lang>``) or None: the request's.

    Returns:
        Parts in order: a span's words are packed with their neighbours' up to ``max_chars``
        (one prompt, as without markup), a break is a part with only ``pause_s``. Leading and
        trailing breaks are kept (exact silence asked for).
    """
    parts: list[Part] = []
    for item in items:
        if isinstance(item, Break):
            parts.append(Part("", "", pause_s=item.seconds))
            continue
        if item.spoken is not None or item.interpret_as is not None:
            spoken = item.spoken
            if item.interpret_as is not None:
                spoken = say_as(item.written, item.interpret_as, language(item.language))
            spoken = " ".join(spoken.split())
            new = [Part(spoken, " ".join(item.written.split()), rate=item.rate)] if spoken else []
        else:
            lang = item.language

            def said(sentence: str, lang: str | None = lang) -> str:
                return speak(sentence, lang)

            new = split_parts(item.written, max_chars, said if speak is not None else None)
            new = [replace(part, rate=item.rate) for part in new]
            mark = " ".join(item.written.split())
            if not new and mark and parts and not parts[-1].pause_s and parts[-1].rate == item.rate:
                # punctuation after a tag ("</sub>."): it ends the sentence before it (said,
                # not a written word: the word stays "WHO", as in the caller's text)
                last = parts[-1]
                parts[-1] = replace(last, spoken=f"{last.spoken}{mark}")
                continue
        for part in new:
            last = parts[-1] if parts else None
            if (
                last is not None
                and not last.pause_s
                and last.rate == part.rate
                and len(last.spoken) + 1 + len(part.spoken) <= max_chars
            ):
                gap = "" if part.spoken[:1] in _CLOSING else " "  # "₹500</lang>, thanks"
                parts[-1] = Part(
                    f"{last.spoken}{gap}{part.spoken}",
                    f"{last.written} {part.written}".strip(),
                    rate=part.rate,
                )
            else:
                parts.append(part)
    return parts


def speech_parts(
    text: str,
    language: str = "auto",
    *,
    lexicon: Lexicon | None = None,
    ssml: bool = False,
    spoken: bool = True,
    max_chars: int = DEFAULT_MAX_PART_CHARS,
) -> list[Part]:
    """The parts the model is given for one request's text (the engine's one owner of this).

    Args:
        text: the request's text (cleaned of control strings by the engine).
        language: "auto" (per sentence, from its script; a sentence with no words of its own
            is read in the language of the whole text), "hi" or "en".
        lexicon: the lexicon in force for the request (the server's with the request's over it).
        ssml: ``text`` is SSML (``parse_ssml``).
        spoken: normalise (numbers, dates, codes as words); False: the words as written.
        max_chars: the length budget of one part.

    Raises:
        SsmlError: malformed or unsupported markup.
    """
    items = parse_ssml(text) if ssml else None
    plain = text if items is None else " ".join(i.written for i in items if isinstance(i, Span))
    default = sentence_language(plain) or "en"

    def speak(sentence: str, forced: str | None = None) -> str:
        lang = forced or language
        lang = lang if lang != "auto" else sentence_language(sentence) or default
        return normalize(sentence, lang, lexicon=lexicon)

    def say_in(forced: str | None) -> str:
        return forced or (language if language != "auto" else default)

    if items is None:
        return split_parts(text, max_chars, speak if spoken else None)
    return ssml_parts(items, speak if spoken else None, max_chars, say_in)


def model_text(parts: list[Part]) -> str:
    """What the model reads for ``parts``, one prompt a line, a pause as ``[pause 300 ms]``."""
    return "\n".join(
        f"[pause {round(p.pause_s * 1000)} ms]" if p.pause_s else p.spoken for p in parts
    )


# -- say-as --------------------------------------------------------------------------------
def say_as(words: str, interpret_as: str, language: str = "auto") -> str:
    """How ``words`` are said as ``interpret_as`` (one of ``SAY_AS``) in ``language``.

    Characters are spelled one by one (digits as digit words); digits, cardinals and ordinals
    use the normaliser's number words; dates, times, telephone numbers and currency go through
    its rules (a telephone number the rules do not take is read in digit groups).
    """
    lang = language if language in ("hi", "en") else (sentence_language(words) or "en")
    digits_only = "".join(c for c in words.translate(_DEV_DIGITS) if c.isdigit())
    if interpret_as in ("characters", "spell-out"):
        return " ".join(
            numbers.digits(c, lang) if c.isdigit() else c
            for c in words.translate(_DEV_DIGITS)
            if not c.isspace()
        )
    if interpret_as == "digits" and digits_only:
        return numbers.digits(digits_only, lang)
    if interpret_as == "telephone" and digits_only:
        said = normalize(words, lang)
        if any(c.isdigit() for c in said):
            return numbers.digit_groups(numbers.group_digits(digits_only), lang)
        return said
    if interpret_as in ("cardinal", "ordinal"):
        plain = words.translate(_DEV_DIGITS).replace(",", "").strip()
        m = re.fullmatch(r"(\d{1,15})(?:st|nd|rd|th|वाँ|वां|वें|वीं)?\.?", plain)
        if m:
            value = int(m.group(1))
            if interpret_as == "cardinal":
                return numbers.cardinal(value, lang)
            return numbers.ordinal_hi(value) if lang == "hi" else numbers.ordinal_en(value)
    return normalize(words, lang)


_DEV_DIGITS = str.maketrans("०१२३४५६७८९", "0123456789")
_CLOSING = set(",.;:!?।॥)")


# -- phonemes ------------------------------------------------------------------------------
#: IPA -> Latin respelling (English readers), longest symbols first when matching.
IPA_LATIN = {
    "tʃ": "ch", "dʒ": "j", "ʃ": "sh", "ʒ": "zh", "θ": "th", "ð": "th", "ŋ": "ng", "j": "y",
    "p": "p", "b": "b", "t": "t", "d": "d", "k": "k", "g": "g", "ɡ": "g", "f": "f", "v": "v",
    "s": "s", "z": "z", "h": "h", "m": "m", "n": "n", "l": "l", "r": "r", "ɹ": "r", "w": "w",
    "ʈ": "t", "ɖ": "d", "ɳ": "n", "ɾ": "r", "ʋ": "v", "x": "kh", "ɣ": "gh", "ʔ": "",
    "iː": "ee", "i": "i", "ɪ": "i", "eɪ": "ay", "e": "e", "ɛ": "e", "æ": "a", "ɑː": "aa",
    "ɑ": "a", "a": "a", "aː": "aa", "ɒ": "o", "ɔː": "aw", "ɔ": "o", "oʊ": "oh", "əʊ": "oh",
    "o": "o", "oː": "o", "uː": "oo", "u": "u", "ʊ": "u", "ʌ": "u", "ə": "a", "ɜː": "er",
    "ɚ": "er", "ɝ": "er", "aɪ": "eye", "aʊ": "ow", "ɔɪ": "oy", "ɪə": "eer", "eə": "air",
    "ʊə": "oor", "eː": "ay",
}  # fmt: skip
#: IPA -> Devanagari: consonants and vowels (independent form, and the sign after a consonant).
IPA_DEVANAGARI_CONSONANTS = {
    "k": "क", "kʰ": "ख", "g": "ग", "ɡ": "ग", "gʱ": "घ", "ɡʱ": "घ", "ŋ": "ङ", "tʃ": "च",
    "tʃʰ": "छ", "dʒ": "ज", "dʒʱ": "झ", "ɲ": "ञ", "ʈ": "ट", "ʈʰ": "ठ", "ɖ": "ड", "ɖʱ": "ढ",
    "ɳ": "ण", "t̪": "त", "t": "त", "t̪ʰ": "थ", "tʰ": "थ", "d̪": "द", "d": "द", "d̪ʱ": "ध",
    "dʱ": "ध", "n": "न", "p": "प", "pʰ": "फ", "f": "फ़", "b": "ब", "bʱ": "भ", "m": "म",
    "j": "य", "r": "र", "ɾ": "र", "l": "ल", "ʋ": "व", "v": "व", "w": "व", "ʃ": "श", "ʂ": "ष",
    "s": "स", "h": "ह", "ɦ": "ह", "z": "ज़", "x": "ख़", "ɣ": "ग़", "q": "क़", "ɽ": "ड़",
}  # fmt: skip
IPA_DEVANAGARI_VOWELS = {  # ipa: (independent, sign)
    "ə": ("अ", ""), "a": ("अ", ""), "aː": ("आ", "ा"), "ɑː": ("आ", "ा"), "ɪ": ("इ", "ि"),
    "i": ("इ", "ि"), "iː": ("ई", "ी"), "ʊ": ("उ", "ु"), "u": ("उ", "ु"), "uː": ("ऊ", "ू"),
    "e": ("ए", "े"), "eː": ("ए", "े"), "ɛ": ("ऐ", "ै"), "ɛː": ("ऐ", "ै"), "æ": ("ऐ", "ै"),
    "o": ("ओ", "ो"), "oː": ("ओ", "ो"), "ɔ": ("औ", "ौ"), "ɔː": ("औ", "ौ"), "ɒ": ("ऑ", "ॉ"),
    "ʌ": ("अ", ""), "ɚ": ("अर", "र"),
}  # fmt: skip
_IGNORED = set("ˈˌ.‿ ͡")  # stress, syllable marks and ties
_LATIN_SYMBOLS = set(IPA_LATIN)
_DEVANAGARI_SYMBOLS = set(IPA_DEVANAGARI_CONSONANTS) | set(IPA_DEVANAGARI_VOWELS)
_VIRAMA = "्"
_warned: set[str] = set()


def _tokens(ph: str, table: set[str]) -> list[str] | None:
    """``ph`` cut into symbols of ``table`` (longest first); None at a symbol it lacks."""
    longest = max(map(len, table))
    out, i = [], 0
    ph = "".join(c for c in nfc(ph) if c not in _IGNORED)
    while i < len(ph):
        for size in range(min(longest, len(ph) - i), 0, -1):
            if ph[i : i + size] in table:
                out.append(ph[i : i + size])
                i += size
                break
        else:
            return None
    return out


def respell(ph: str, word: str) -> str | None:
    """A respelling of IPA ``ph`` in ``word``'s script (Devanagari or Latin); None: unmappable."""
    devanagari = any("\u0900" <= c <= "\u097f" for c in word)
    if devanagari:
        symbols = _tokens(ph, _DEVANAGARI_SYMBOLS)
        return _devanagari(symbols) if symbols else None
    symbols = _tokens(ph, _LATIN_SYMBOLS)
    return "".join(IPA_LATIN[s] for s in symbols) or None if symbols else None


def phoneme_markup(word: str, ph: str) -> str | None:
    """``word`` in a ``<phoneme alphabet="ipa">`` tag when ``ph`` maps to a respelling; else None.

    Pipecat's ``format_pronunciation`` contract: None means "speak the word as written".
    """
    if respell(ph, word) is None:
        return None
    return f'<phoneme alphabet="ipa" ph="{escape(ph)}">{escape(word)}</phoneme>'


def escape(text: str) -> str:
    """``text`` as SSML character data or an attribute value (``& < > "`` escaped)."""
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    )


#: ``phoneme_markup``'s and ``break_markup``'s output, exactly (so text holding them can be
#: read as SSML while the rest of it stays data).
HOOK_MARKUP = re.compile(
    r'<phoneme alphabet="ipa" ph="[^"<>]*">[^<>]*</phoneme>|<break time="\d{1,5}ms"/>'
)
_ANY_BREAK = re.compile(r"<break\s+time=\"\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*\"\s*/?>")


def break_markup(text: str) -> str:
    """``text`` with LiveKit's ``<break time="0.5s"/>`` tags in the form ``markup_of_hook`` reads.

    A break over ``MAX_BREAK_S`` is cut to it.
    """

    def exact(m: re.Match[str]) -> str:
        seconds = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
        return f'<break time="{round(min(seconds, MAX_BREAK_S) * 1000)}ms"/>'

    return _ANY_BREAK.sub(exact, text)


def markup_of_hook(text: str) -> str | None:
    """Text holding ``phoneme_markup`` or ``break_markup`` tags as SSML (the rest escaped).

    None when it holds none: such text stays data.
    """
    pieces, at = [], 0
    for m in HOOK_MARKUP.finditer(text):
        pieces += [escape(text[at : m.start()]), m.group(0)]
        at = m.end()
    if not pieces:
        return None
    return "".join(pieces) + escape(text[at:])


def ipa_respelling(ph: str, word: str) -> str:
    """A respelling of IPA ``ph`` in ``word``'s script (Devanagari or Latin) the model reads.

    Where a symbol has no entry, ``word`` as written (logged once per IPA string).
    """
    spelled = respell(ph, word)
    if not spelled:
        if ph not in _warned and len(_warned) < 1000:
            _warned.add(ph)
            logger.warning(
                f"<phoneme ph={ph!r}> has IPA symbols with no respelling; the word is spoken "
                "as written"
            )
        return word
    return spelled


def _devanagari(symbols: list[str]) -> str:
    out: list[str] = []
    after_consonant = False
    for s in symbols:
        if s in IPA_DEVANAGARI_CONSONANTS:
            if after_consonant:
                out.append(_VIRAMA)
            out.append(IPA_DEVANAGARI_CONSONANTS[s])
            after_consonant = True
        else:
            independent, sign = IPA_DEVANAGARI_VOWELS[s]
            out.append(sign if after_consonant else independent)
            after_consonant = False
    return nfc("".join(out))
