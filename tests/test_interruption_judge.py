"""The interruption judge (``benchmarks.interruption.judge``) on hand-made turns."""

from __future__ import annotations

from benchmarks.interruption import Spoken, judge

TEXT = "One two three. Four five six. Seven eight."
SENTENCES = [("One two three.", 0.0, 1.0), ("Four five six.", 1.0, 4.0), ("Seven eight.", 4.0, 5.0)]
FIRST = ["One", "two", "three."]


def _spoken(cut: dict[int, int]) -> Spoken:
    """The second sentence was cut short (looped) before any of its words were timed."""
    words = [("One", 0.0), ("two", 0.3), ("three.", 0.6), ("Seven", 4.0), ("eight.", 4.4)]
    return Spoken(seconds=5.0, words=words, sentences=SENTENCES, cut=cut)


def test_a_sentence_cut_short_asks_for_none_of_its_untimed_words() -> None:
    spoken = _spoken({1: 0})
    assert judge(FIRST, TEXT, spoken, 2.5) is None  # 1.5 s into the cut sentence
    assert judge([*FIRST, "Seven"], TEXT, spoken, 4.2) is None  # the next one follows
    assert judge([*FIRST, "Four"], TEXT, spoken, 2.5) is not None  # never timed: not allowed


def test_a_sentence_not_cut_must_be_in_context_in_part() -> None:
    spoken = _spoken({})
    assert "played" in judge(FIRST, TEXT, spoken, 2.5)  # 1.5 s of it played, none in context
    assert "not a prefix" in judge([*FIRST, "Seven"], TEXT, spoken, 4.2)
