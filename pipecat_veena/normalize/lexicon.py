"""A user lexicon: how to say brand names, acronyms and other terms, per language.

Entries map a term to its spoken form. They are applied to a sentence before the rules, as whole
words; all-capital terms (acronyms: "SBI", "EMI") match only in capitals, other terms in any
case. JSON file or dict, either flat (every language) or by language::

    {"*": {"Zomato": "ज़ोमैटो"}, "en": {"EMI": "E M I"}, "hi": {"EMI": "ई एम आई"}}

A spoken form that contains its own term would grow on every pass; avoid those, so that
normalising twice stays the same as normalising once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

from pipecat_veena.normalize.tables import NOT_AFTER_WORD, NOT_BEFORE_WORD, WORD_CHAR, nfc, nukta_re

LANGUAGES = ("*", "hi", "en")
_WORD = re.compile(WORD_CHAR)
#: Bounds on a lexicon sent with one request (``request_lexicon``).
MAX_REQUEST_ENTRIES = 1000
MAX_REQUEST_BYTES = 64 * 1024


def _is_acronym(term: str) -> bool:
    letters = [c for c in term if c.isalpha()]
    return len(letters) >= 2 and all(c.isupper() for c in letters)


class Lexicon:
    """Term -> spoken form, per language ("hi", "en", or "*" for both).

    Args:
        entries: ``{"*"|"hi"|"en": {term: spoken}}``, or a flat ``{term: spoken}`` (every
            language), or a mix of both.

    Raises:
        ValueError: an entry that is not a string mapping or an unknown language section.
    """

    def __init__(self, entries: Mapping[str, object] | None = None) -> None:
        self._entries: dict[str, dict[str, str]] = {lang: {} for lang in LANGUAGES}
        for key, value in (entries or {}).items():
            if isinstance(value, str):
                self._add("*", key, value)
            elif isinstance(value, Mapping):
                if key not in LANGUAGES:
                    raise ValueError(f"lexicon section {key!r}: use one of {LANGUAGES}")
                for term, spoken in value.items():
                    if not isinstance(term, str) or not isinstance(spoken, str):
                        raise ValueError(f"lexicon entry {term!r}: {spoken!r} is not text")
                    self._add(key, term, spoken)
            else:
                raise ValueError(f"lexicon entry {key!r}: {value!r} is not text or a mapping")
        self._compiled: dict[str, tuple[re.Pattern, dict[str, str], dict[str, str]] | None] = {}

    def _add(self, lang: str, term: str, spoken: str) -> None:
        term = nfc(term.strip())
        if term:
            self._entries[lang][term] = nfc(spoken)

    @classmethod
    def load(cls, source: Lexicon | Mapping | str | Path | None) -> Lexicon | None:
        """A Lexicon from a Lexicon, a dict, or the path of a JSON file; None stays None."""
        if source is None or isinstance(source, Lexicon):
            return source
        if isinstance(source, Mapping):
            return cls(source)
        path = Path(source)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read the lexicon {path}: {e}") from e
        if not isinstance(data, Mapping):
            raise ValueError(f"lexicon {path}: the JSON must be an object")
        return cls(data)

    def merged(self, over: Lexicon | None) -> Lexicon:
        """A new Lexicon: these entries with ``over``'s laid over them (``self`` unchanged)."""
        if over is None or not len(over):
            return self
        lexicon = Lexicon()
        shared = over._entries["*"]  # (over every language's own entry for the term here too)
        for lang in LANGUAGES:
            mine = {t: s for t, s in self._entries[lang].items() if t not in shared}
            lexicon._entries[lang] = {**mine, **over._entries[lang]}
        return lexicon

    def __len__(self) -> int:
        return sum(len(v) for v in self._entries.values())

    def terms(self, lang: str) -> dict[str, str]:
        """Every entry that applies to ``lang`` ("hi" or "en"): its own over the shared ones."""
        return {**self._entries["*"], **self._entries.get(lang, {})}

    def _matcher(self, lang: str) -> tuple[re.Pattern, dict[str, str], dict[str, str]] | None:
        if lang not in self._compiled:
            terms = self.terms(lang)
            if not terms:
                self._compiled[lang] = None
                return None
            exact = {t: s for t, s in terms.items() if _is_acronym(t)}
            folded = {t.casefold(): s for t, s in terms.items() if not _is_acronym(t)}
            alternatives = []
            for term in sorted(terms, key=len, reverse=True):
                body = nukta_re(term)
                body = body if _is_acronym(term) else f"(?i:{body})"
                before = NOT_AFTER_WORD if _WORD.match(term[0]) else ""
                after = NOT_BEFORE_WORD if _WORD.match(term[-1]) else ""
                alternatives.append(f"{before}{body}{after}")
            self._compiled[lang] = (re.compile("|".join(alternatives)), exact, folded)
        return self._compiled[lang]

    def apply(self, text: str, lang: str) -> str:
        """``text`` with every term of ``lang`` replaced by its spoken form."""
        matcher = self._matcher(lang)
        if matcher is None:
            return text
        regex, exact, folded = matcher

        def spoken(m: re.Match) -> str:
            found = nfc(m.group(0))
            return exact.get(found) or folded.get(found.casefold(), m.group(0))

        return regex.sub(spoken, text)


def request_lexicon(entries: object) -> Lexicon:
    """A lexicon sent with one request, checked: the same shapes as ``Lexicon``, bounded.

    At most ``MAX_REQUEST_ENTRIES`` entries and ``MAX_REQUEST_BYTES`` of terms and spoken forms
    (UTF-8); a spoken form that contains its own term as a word is refused (normalised again it
    would grow). Counting stops at the first bound passed, so a huge lexicon is refused at once.

    Raises:
        ValueError: naming the entry or the bound.
    """
    if isinstance(entries, Lexicon):
        return entries
    if not isinstance(entries, Mapping):
        raise ValueError(
            f"lexicon must be an object of term -> spoken form (or of 'hi'/'en'/'*' sections), "
            f"got {type(entries).__name__}"
        )
    count = size = 0
    flat: list[tuple[str, object, object]] = []
    for key, value in entries.items():
        section = value.items() if isinstance(value, Mapping) else [(key, value)]
        lang = key if isinstance(value, Mapping) else "*"
        for term, spoken in section:
            count += 1
            if count > MAX_REQUEST_ENTRIES:
                raise ValueError(
                    f"lexicon has more than {MAX_REQUEST_ENTRIES} entries (the most one request "
                    "may carry; put a large lexicon in the server's --lexicon file)"
                )
            if isinstance(term, str) and isinstance(spoken, str):
                size += len(term.encode("utf-8", "replace")) + len(
                    spoken.encode("utf-8", "replace")
                )
                if size > MAX_REQUEST_BYTES:
                    raise ValueError(
                        f"lexicon entries add up to more than {MAX_REQUEST_BYTES} bytes (the most "
                        "one request may carry)"
                    )
            flat.append((lang, term, spoken))
    lexicon = Lexicon(entries)  # (checks types and sections)
    for _lang, term, spoken in flat:
        t, said = nfc(str(term).strip()), nfc(str(spoken))
        if not t:
            raise ValueError(f"lexicon entry {term!r}: the term is empty")
        if not said.strip():
            raise ValueError(f"lexicon entry {term!r}: the spoken form is empty")
        if said != t and _contains_term(said, t):
            raise ValueError(
                f"lexicon entry {term!r} -> {spoken!r}: the spoken form contains the term "
                "itself, so it would grow every time the text is normalised; respell it"
            )
    return lexicon


def _contains_term(text: str, term: str) -> bool:
    body = nukta_re(term)
    body = body if _is_acronym(term) else f"(?i:{body})"
    before = NOT_AFTER_WORD if _WORD.match(term[0]) else ""
    after = NOT_BEFORE_WORD if _WORD.match(term[-1]) else ""
    return re.search(f"{before}{body}{after}", text) is not None
