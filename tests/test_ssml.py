"""The SSML subset and per-request lexicons (issue 39 items 2-3), without an engine: every tag,
malformed markup named by position, and the hostile inputs each refused within a small bound."""

from __future__ import annotations

import time

import pytest

from pipecat_veena.normalize import Lexicon, normalize, ssml
from pipecat_veena.normalize.lexicon import MAX_REQUEST_ENTRIES, request_lexicon
from pipecat_veena.normalize.ssml import (
    MAX_DEPTH,
    Break,
    Span,
    SsmlError,
    ipa_respelling,
    model_text,
    parse_ssml,
    say_as,
    speech_parts,
    ssml_parts,
)
from pipecat_veena.text import Part

#: A refusal must come at once: well under this, whatever the input's size.
FAST_S = 0.5


def _said(doc: str, language: str = "auto") -> str:
    return model_text(speech_parts(doc, language, ssml=True))


def _refused(doc: str, match: str) -> SsmlError:
    started = time.perf_counter()
    with pytest.raises(SsmlError, match=match) as info:
        parse_ssml(doc)
    assert time.perf_counter() - started < FAST_S
    return info.value


def test_plain_text_and_speak():
    assert parse_ssml("Hello there.") == [Span("Hello there.")]
    assert parse_ssml('<?xml version="1.0"?><speak version="1.1" xml:lang="en-IN">Hi</speak>') == [
        Span("Hi", language="en")
    ]
    assert parse_ssml("<speak>a &lt;b&gt; &amp; &#65;&#x42;</speak>") == [Span("a <b> & AB")]


def test_break_time_and_strength():
    assert parse_ssml('A<break time="300ms"/>B<break time="1.5s"/>C') == [
        Span("A"), Break(0.3), Span("B"), Break(1.5), Span("C")
    ]  # fmt: skip
    assert parse_ssml('A<break strength="strong"/>B<break/>C<break strength="none"/>D') == [
        Span("A"), Break(0.75), Span("B"), Break(0.4), Span("CD")
    ]  # fmt: skip
    # consecutive breaks add up; a break can lead or trail
    assert parse_ssml('<break time="100ms"/><break time="200ms"/>A<break time="50ms"></break>') == [
        Break(0.3), Span("A"), Break(0.05)
    ]  # fmt: skip
    parts = ssml_parts(parse_ssml('Hello.<break time="300ms"/>World.'))
    assert parts == [Part("Hello.", "Hello."), Part("", "", 0.3), Part("World.", "World.")]


def test_sub_is_the_written_word_and_the_alias_is_said():
    (sub,) = [s for s in parse_ssml('The <sub alias="World Health Organisation">WHO</sub>.')
              if s.spoken]  # fmt: skip
    assert sub == Span("WHO", "World Health Organisation")
    parts = ssml_parts(parse_ssml('The <sub alias="World Health Organisation">WHO</sub> met.'))
    assert parts == [Part("The World Health Organisation met.", "The WHO met.")]


@pytest.mark.parametrize(
    ("kind", "words", "lang", "said"),
    [
        ("characters", "SBI", "en", "S B I"),
        ("spell-out", "A1", "en", "A one"),
        ("digits", "2024", "en", "two zero two four"),
        ("digits", "2024", "hi", "दो शून्य दो चार"),
        ("cardinal", "2,024", "en", "two thousand twenty-four"),
        ("ordinal", "3", "en", "third"),
        ("ordinal", "3", "hi", "तीसरा"),
        ("date", "05/08/2025", "hi", "पाँच अगस्त दो हज़ार पच्चीस"),
        ("time", "10:30", "en", "ten thirty"),
        ("telephone", "9876543210", "en", "nine eight seven six five, four three two one zero"),
        ("telephone", "98765 43210", "hi", "नौ आठ सात छह पाँच, चार तीन दो एक शून्य"),
        ("currency", "₹1,250", "en", "one thousand two hundred fifty rupees"),
    ],
)
def test_say_as_goes_to_the_normaliser(kind, words, lang, said):
    assert say_as(words, kind, lang) == said
    doc = f'<lang xml:lang="{lang}"><say-as interpret-as="{kind}">{words}</say-as></lang>'
    assert parse_ssml(doc) == [Span(words, None, lang, interpret_as=kind)]
    assert _said(doc) == said
    # without <lang>: the request's language, else the document's (from its script)
    assert _said(f'<say-as interpret-as="{kind}">{words}</say-as>', language=lang) == said


def test_say_as_in_a_hindi_sentence_is_hindi():
    assert _said('यह <say-as interpret-as="ordinal">3</say-as> बार है।') == "यह तीसरा बार है।"
    assert _said('It is the <say-as interpret-as="ordinal">3</say-as> time.') == (
        "It is the third time."
    )


def test_lang_sets_the_normalisers_language():
    assert _said('<lang xml:lang="hi">5</lang> and 5') == "पाँच and five"
    assert _said('Total <lang xml:lang="hi">₹500</lang>, thanks.') == "Total पाँच सौ रुपये, thanks."
    assert _said('<lang xml:lang="en-IN">₹5</lang>') == "five rupees"


def test_prosody_rate_is_refused_where_spans_have_no_speed(monkeypatch):
    monkeypatch.setattr(ssml, "PROSODY_RATE", False)
    _refused('<prosody rate="150%">b</prosody>', r"not supported yet")


def test_prosody_rate_parts_are_their_own():
    parts = ssml_parts(parse_ssml('A b. <prosody rate="1.5">C d.</prosody> E.'))
    assert parts == [Part("A b.", "A b."), Part("C d.", "C d.", rate=1.5), Part("E.", "E.")]


def test_prosody_rate_is_kept_per_span():
    spans = parse_ssml('a <prosody rate="150%">b <prosody rate="slow">c</prosody></prosody> d')
    assert [(s.written.strip(), s.rate) for s in spans] == [
        ("a", None), ("b", 1.5), ("c", 0.75), ("d", None)
    ]  # fmt: skip
    assert parse_ssml('<prosody rate="2">x</prosody>') == [Span("x", rate=2.0)]
    _refused('<prosody rate="3">x</prosody>', r"0.5-2.0")
    _refused('<prosody pitch="high">x</prosody>', r"no attribute 'pitch'")


def test_phoneme_maps_ipa_to_the_words_script():
    assert ipa_respelling("ˈtʃeɪtən", "Chaitan") == "chaytan"
    assert ipa_respelling("raːm", "राम") == "राम"
    assert ipa_respelling("kəməleːʃ", "कमलेश") == "कमलेश"
    assert ipa_respelling("ʃɾiː", "श्री") == "श्री"  # a cluster: a virama between
    assert ipa_respelling("pʰuːl", "फूल") == "फूल"
    doc = 'Say <phoneme alphabet="ipa" ph="ˈniːʃə">Nisha</phoneme>.'
    assert _said(doc) == "Say neesha."


def test_an_unmappable_phoneme_speaks_the_word_and_says_so_once():
    from loguru import logger

    lines: list[str] = []
    sink = logger.add(lines.append, level="WARNING", format="{message}")
    try:
        for _ in range(3):
            assert ipa_respelling("ʘǂ", "Xhosa") == "Xhosa"
    finally:
        logger.remove(sink)
    assert len([line for line in lines if "ʘǂ" in line]) == 1


@pytest.mark.parametrize(
    ("doc", "position", "match"),
    [
        ("Hello <foo>x</foo>", 6, r"unknown tag <foo>"),
        ("<speak>Hello", 0, r"<speak> is never closed"),
        ("<speak>Hi</sub>", 9, r"</sub> does not close"),
        ("a < b", 2, r"starts no tag"),
        ("AT&T", 2, r"&amp;"),
        ("<break time='3 hours'/>", 0, r"duration"),
        ('<break time="11s"/>', 0, r"at most 10 s"),
        ('<say-as interpret-as="verbatim">x</say-as>', 0, r"use one of"),
        ('<phoneme alphabet="x-sampa" ph="a">a</phoneme>', 0, r"only alphabet"),
        ('<sub alias="x"><break/></sub>', 15, r"takes text only"),
        ("<sub>x</sub>", 0, r"needs alias"),
        ('<lang xml:lang="fr">x</lang>', 0, r"only hi and en"),
        ("<speak\n>ok <break", 11, r"not closed with '>'"),
        ('<break time="1s" time="2s"/>', 17, r"given twice"),
        ("<!-- hi -->", 0, r"comments"),
        ("<![CDATA[x]]>", 0, r"CDATA"),
    ],
)
def test_malformed_markup_names_its_position(doc, position, match):
    error = _refused(doc, match)
    assert error.position == position
    assert f"at character {position} " in str(error)


def test_line_and_column():
    error = _refused("<speak>\n  <bogus/>\n</speak>", "unknown tag")
    assert "(line 2, column 3)" in str(error)


# -- hostile input -------------------------------------------------------------------------
def test_a_1_mb_document_is_refused_at_once():
    _refused("<speak>" + "a" * 1_000_000 + "</speak>", r"at most 100000")


def test_10000_deep_nesting_is_refused_at_once():
    doc = "<s>" * 10_000 + "x" + "</s>" * 10_000
    error = _refused(doc, rf"nested deeper than {MAX_DEPTH}")
    assert error.position == 3 * MAX_DEPTH


@pytest.mark.parametrize(
    "doc",
    [
        '<!DOCTYPE speak [<!ENTITY a "aaaaaaaaaa">]><speak>&a;</speak>',
        '<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;">]><speak>&lol2;</speak>',
        '<!DOCTYPE speak SYSTEM "file:///etc/passwd"><speak>x</speak>',
        "<speak>&xxe;</speak>",
    ],
)
def test_entity_expansion_and_dtds_are_refused(doc):
    _refused(doc, r"DTDs|no other entity")


def test_tags_between_words_separate_them():
    assert _said("<speak><s>Hello</s><s>World</s><p>Next</p></speak>") == "Hello World Next"
    assert _said('Dial<say-as interpret-as="digits">12</say-as>now') == "Dial one two now"


def test_markup_never_reaches_the_model():
    doc = '<speak><p><s>Pay <say-as interpret-as="currency">₹500</say-as></s></p></speak>'
    said = _said(doc)
    assert said == "Pay five hundred rupees"
    assert "<" not in said and ">" not in said


# -- lexicons per request ------------------------------------------------------------------
def test_a_request_lexicon_is_laid_over_the_servers():
    server = Lexicon({"Zomato": "ज़ोमैटो", "en": {"EMI": "E M I"}})
    mine = request_lexicon({"en": {"EMI": "equated monthly instalment"}, "Asha": "Aashaa"})
    merged = server.merged(mine)
    assert merged.apply("Zomato EMI Asha", "en") == "ज़ोमैटो equated monthly instalment Aashaa"
    assert server.apply("Zomato EMI Asha", "en") == "ज़ोमैटो E M I Asha"  # unchanged
    # an entry for every language wins over the server's entry for one language
    assert server.merged(request_lexicon({"EMI": "easy"})).apply("EMI", "en") == "easy"


@pytest.mark.parametrize(
    ("entries", "match"),
    [
        ([1, 2], r"must be an object"),
        ({"fr": {"a": "b"}}, r"lexicon section 'fr'"),
        ({"a": 5}, r"is not text"),
        ({"IIT": "IIT Bombay"}, r"contains the term itself"),
        ({"": "x"}, r"term is empty"),
        ({"x": " "}, r"spoken form is empty"),
        ({"x": "y" * 70_000}, r"more than 65536 bytes"),
    ],
)
def test_a_bad_request_lexicon_is_named(entries, match):
    with pytest.raises(ValueError, match=match):
        request_lexicon(entries)


def test_a_million_entry_lexicon_is_refused_at_once():
    entries = {f"term{i}": f"said{i}" for i in range(1_000_000)}
    started = time.perf_counter()
    with pytest.raises(ValueError, match=rf"more than {MAX_REQUEST_ENTRIES} entries"):
        request_lexicon(entries)
    assert time.perf_counter() - started < FAST_S


def test_an_entry_containing_its_own_term_never_loops():
    # (a server file may hold one; applying it is one pass, and twice stays bounded)
    lex = Lexicon({"Veena": "Veena TTS"})
    once = normalize("Veena", "en", lexicon=lex)
    assert once == "Veena TTS"
    assert normalize(once, "en", lexicon=lex) == "Veena TTS TTS"  # one pass each: no loop


# -- pipecat-veena normalize ---------------------------------------------------------------
def test_cli_normalize_prints_what_the_model_reads(tmp_path, capsys):
    from pipecat_veena.cli import main

    doc = 'Dial <say-as interpret-as="telephone">9876543210</say-as>.<break time="300ms"/>Bye.'
    assert main(["normalize", "--ssml", doc]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "Dial nine eight seven six five, four three two one zero.",
        "[pause 300 ms]",
        "Bye.",
    ]
    lexicon = tmp_path / "lexicon.json"
    lexicon.write_text('{"en": {"EMI": "E M I"}}', encoding="utf-8")
    assert main(["normalize", "--lexicon", str(lexicon), "--language", "en", "EMI ₹500"]) == 0
    assert capsys.readouterr().out == "E M I five hundred rupees\n"
    assert main(["normalize", "<b>x</b>"]) == 0  # without --ssml, text is data
    assert capsys.readouterr().out == "<b>x</b>\n"
    assert main(["normalize", "--ssml", "a <foo/>"]) == 2
    assert "at character 2" in capsys.readouterr().err
