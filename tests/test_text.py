"""Sentence/clause splitting (Latin and Devanagari), the cuts of streamed text, speakability and
the runaway budget."""

import re

import pytest

from pipecat_veena.text import (
    complete_sentences,
    is_speakable,
    max_speech_seconds,
    split_parts,
    split_sentences,
    split_text,
)


def test_splits_at_latin_and_devanagari_sentence_ends():
    text = "नमस्ते! Welcome to the demo. यह एक परीक्षण है। And another one? ok"
    assert split_text(text, max_chars=30) == [
        "नमस्ते! Welcome to the demo.",
        "यह एक परीक्षण है।",
        "And another one? ok",
    ]


def test_packs_short_sentences_within_budget():
    text = "One. Two. Three. Four."
    assert split_text(text, max_chars=220) == ["One. Two. Three. Four."]
    assert split_text(text, max_chars=10) == ["One. Two.", "Three.", "Four."]


def test_danda_without_space_still_splits():
    assert split_text("पहला वाक्य।दूसरा वाक्य।", max_chars=12) == ["पहला वाक्य।", "दूसरा वाक्य।"]


def test_long_sentence_splits_at_clauses_then_words():
    sentence = "first clause here, second clause there; " + "word " * 40
    parts = split_text(sentence, max_chars=40)
    assert all(len(p) <= 40 for p in parts)
    assert " ".join(parts).split() == sentence.split()
    assert parts[0] == "first clause here, second clause there;"


def test_a_word_longer_than_the_budget_is_cut_not_lost():
    parts = split_text("x" * 95, max_chars=40)
    assert [len(p) for p in parts] == [40, 40, 15]


@pytest.mark.parametrize("text", ["", "   ", "<laugh>", "** __ ##", "[pause] <sigh>", "...!"])
def test_nothing_speakable_gives_no_parts(text):
    assert not is_speakable(text)
    assert split_text(text) == []


@pytest.mark.parametrize("text", ["a", "42", "नमस्ते", "<laugh> hi"])
def test_speakable(text):
    assert is_speakable(text)


def test_no_text_is_lost_over_many_sentences():
    text = " ".join(f"Sentence number {i} is here." for i in range(50))
    parts = split_text(text, max_chars=100)
    assert all(len(p) <= 100 for p in parts)
    assert " ".join(parts) == text


def test_max_speech_seconds_grows_with_text_and_has_a_floor():
    assert max_speech_seconds("hi") == 3.0
    assert max_speech_seconds("x" * 200) == pytest.approx(50.0)


def test_bad_budget_is_an_error():
    with pytest.raises(ValueError, match="max_chars"):
        split_text("hello", max_chars=0)


def test_abbreviations_and_numbers_do_not_end_a_sentence():
    """sentencex keeps "Rs. 500", "Dr. Rao" and "डॉ. शर्मा" whole: the old regex broke after every
    ". ", here giving the parts "Hello there my friend, pay Rs." and "500 now." (an amount
    cut from its currency), and "नमस्ते जी। डॉ." + "शर्मा आएँगे।"."""
    assert split_text("Hello there my friend, pay Rs. 500 now.", max_chars=30) == [
        "Hello there my friend,",
        "pay Rs. 500 now.",
    ]
    assert split_text("नमस्ते जी। डॉ. शर्मा आएँगे।", max_chars=20) == ["नमस्ते जी।", "डॉ. शर्मा आएँगे।"]


STREAMED = [
    "Please pay Rs. 500 to Dr. Rao by 10 a.m. tomorrow. Thanks! See you.",
    "Mr. Smith said no. 5 is free, e.g. this one. It costs approx. 20 dollars… fine? Yes.",
    "डॉ. शर्मा 5 कि.मी. दूर हैं। Rs. 500 भेजें। ठीक है? हाँ।",
    'He said "Stop." Then he left. The U.S. team won at 3 p.m. today.',
]


def _stream(pieces: list[str]) -> list[str]:
    """What a WebSocket utterance speaks when ``pieces`` are appended one by one, then ended."""
    spoken, pending = [], ""
    for piece in pieces:
        complete, pending = complete_sentences(pending + piece)
        if complete:
            spoken.append(complete)
    return spoken + ([pending] if pending else [])


@pytest.mark.parametrize("text", STREAMED)
def test_streamed_text_is_cut_where_the_whole_text_is(text):
    """Word by word or character by character, appended text is cut at the sentence ends of the
    whole text: never after "Rs. ", "Dr. ", "a.m. " (the cut the old regex made)."""
    words = re.findall(r"\S+\s*", text)
    assert _stream(words) == split_sentences(text)
    assert _stream(list(text)) == split_sentences(text)


def test_a_complete_sentence_is_cut_before_the_next_word_arrives():
    assert complete_sentences("Hello there. ") == ("Hello there. ", "")
    assert complete_sentences("नमस्ते। ") == ("नमस्ते। ", "")
    assert complete_sentences("Wow! ") == ("Wow! ", "")
    for waiting in ("Please pay Rs. ", "Call Dr. ", "Come at 10 a.m. ", "Hello there.", "Ok… "):
        assert complete_sentences(waiting) == ("", waiting)


def test_parts_know_the_written_text_they_speak():
    """Each part carries the written sentences that end in it; a long sentence split at clauses
    carries its written text on its last piece (its words are timed together)."""
    spoken = {"Pay ₹1,250 now.": "Pay one thousand two hundred fifty rupees now."}
    text = "Hi. Pay ₹1,250 now. Thanks, see you soon, bye."
    parts = split_parts(text, max_chars=30, speak=lambda s: spoken.get(s, s))
    assert [p.spoken for p in parts] == [
        "Hi.",
        "Pay one thousand two hundred",
        "fifty rupees now. Thanks,",
        "see you soon, bye.",
    ]
    # "Pay ₹1,250 now." and "Thanks, ..." share part 3, which does not end a sentence: the
    # written text waits for the part that closes the group.
    assert [p.written for p in parts] == [
        "Hi.",
        "",
        "",
        "Pay ₹1,250 now. Thanks, see you soon, bye.",
    ]
    assert split_text(text, max_chars=30) == [p.spoken for p in split_parts(text, max_chars=30)]
