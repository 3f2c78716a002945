"""pipecat_veena.timing.align_words: accuracy on espeak-ng speech with known word starts, the
properties every caller relies on (one entry per written word, monotone, inside the audio) and
bad input (no words, no speech) giving no timings instead of an exception."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from benchmarks.timing import baseline_starts, speak
from pipecat_veena.timing import align_words, find_speech, split_words, spoken_units

SENTENCES = [
    ("hi", "आपका बिल ₹1,250 है, कृपया समय पर भुगतान करें।"),
    ("hi", "आपका order 3 दिन में deliver होगा।"),
    ("hi", "मौसम आज साफ़ रहेगा, बारिश की संभावना कम है।"),
    ("en", "Your OTP is 482913, please do not share it."),
    ("en", "The train will arrive on platform 3 in ten minutes."),
    ("en", "Thank you for calling, have a wonderful day."),
]


def _bursts(sample_rate: int = 16000) -> np.ndarray:
    """Four 0.3 s tones with 0.15 s of silence between: speech-like energy, no words."""
    t = np.arange(int(0.3 * sample_rate)) / sample_rate
    tone = 0.3 * np.sin(2 * np.pi * 220 * t).astype(np.float32)
    gap = np.zeros(int(0.15 * sample_rate), np.float32)
    return np.concatenate([gap, tone, gap, tone, gap, tone, gap, tone, gap])


@pytest.fixture(scope="module")
def espeak():
    from benchmarks._espeak import Espeak

    try:
        return Espeak()
    except RuntimeError as e:
        pytest.skip(str(e))


def test_word_starts_close_to_espeak_truth_and_better_than_characters(espeak):
    ours, base = [], []
    for lang, text in SENTENCES:
        synth, truth = speak(espeak, text, lang)
        words = align_words(text, synth.audio, synth.sample_rate, lang)
        start, end, _ = find_speech(synth.audio, synth.sample_rate)
        for w, b, t in zip(words, baseline_starts(text, start, end), truth, strict=True):
            if t is not None:
                ours.append(abs(w.start - t))
                base.append(abs(b - t))
    assert len(ours) >= 40
    assert statistics.median(ours) < 0.08  # measured ~0.02 s (BENCHMARKS.md)
    assert max(ours) < 0.5
    assert statistics.median(ours) < statistics.median(base)


@pytest.mark.parametrize("rate", [140, 210])
def test_properties_one_entry_per_written_word_monotone_inside_audio(espeak, rate):
    for lang, text in SENTENCES:
        synth, _ = speak(espeak, text, lang, rate)
        duration = len(synth.audio) / synth.sample_rate
        words = align_words(text, synth.audio, synth.sample_rate)  # language from the script
        assert [w.word for w in words] == text.split()
        assert [text[w.offset : w.offset + len(w.word)] for w in words] == text.split()
        for w, nxt in zip(words, words[1:], strict=False):
            assert 0.0 <= w.start < w.end <= nxt.start <= duration
        assert words[-1].end <= duration


def test_same_words_from_int16_and_pcm_bytes(espeak):
    lang, text = SENTENCES[0]
    synth, _ = speak(espeak, text, lang)
    pcm = (synth.audio * 32767).astype(np.int16)
    as_float = align_words(text, synth.audio, synth.sample_rate, lang)
    assert align_words(text, pcm, synth.sample_rate, lang) == as_float
    assert align_words(text, pcm.tobytes(), synth.sample_rate, lang) == as_float


def test_leading_and_trailing_silence_are_not_words(espeak):
    lang, text = SENTENCES[4]
    synth, truth = speak(espeak, text, lang)
    pad = np.zeros(synth.sample_rate // 2, np.float32)  # 0.5 s each side
    words = align_words(text, np.concatenate([pad, synth.audio, pad]), synth.sample_rate, lang)
    assert abs(words[0].start - 0.5) < 0.05
    assert words[-1].end < 0.5 + len(synth.audio) / synth.sample_rate + 0.05


@pytest.mark.parametrize("text", ["", "   ", "...!?", "🙂 👍", "— , ।"])
def test_text_without_words_gives_no_timings(text):
    assert align_words(text, _bursts(), 16000) == []


@pytest.mark.parametrize("audio", [np.zeros(0), np.zeros(16000), b"", np.zeros(16000, np.int16)])
def test_silence_or_no_audio_gives_no_timings(audio):
    assert align_words("नमस्ते दुनिया", audio, 16000) == []


def test_emoji_between_words_is_not_a_word():
    words = align_words("hello 🙂 world, again", _bursts(), 16000)
    assert [w.word for w in words] == ["hello", "world,", "again"]
    assert words[0].start == pytest.approx(0.15, abs=0.02)  # the first tone's onset
    assert words[-1].end == pytest.approx(1.8, abs=0.02)  # the last tone's end
    assert split_words("🙂 ₹1,250 है।") == [(2, 8), (9, 12)]


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="language"):
        align_words("hello", np.zeros(160), 16000, language="fr")
    with pytest.raises(ValueError, match="sample_rate"):
        align_words("hello", np.zeros(160), 0)


def test_spoken_units_count_the_spoken_form():
    assert spoken_units("₹1,250", "hi") > 4 * spoken_units("बिल", "hi")  # एक हज़ार दो सौ पचास रुपये
    assert spoken_units("OTP", "en") > spoken_units("top", "en")  # spelled out
    assert spoken_units("नमस्ते", "hi") > spoken_units("न", "hi") > 0
    assert spoken_units("🙂", "en") == 0


def test_english_syllables_follow_the_spelling():
    from pipecat_veena.timing import _latin_syllables

    counts = {
        **{"name": 1, "takes": 1, "lived": 1, "wanted": 2, "closes": 2, "table": 2},
        **{"create": 2, "transfer": 2, "delivered": 3, "yesterday": 3, "you": 1, "video": 3},
    }
    assert {w: _latin_syllables(w) for w in counts} == counts
    # an unstressed function word is shorter than a content word spelled alike
    assert spoken_units("to", "en") < spoken_units("toe", "en")


def test_a_pause_inside_a_spoken_number_is_not_the_word_boundary(espeak):
    """espeak-ng pauses between the groups of "twelve thousand | four hundred | eighty" at a
    slow rate: the number starts where it is spoken, not after its first inner pause, and the
    word after it starts after its last."""
    text = "Your balance is ₹12,480 as of yesterday."
    synth, truth = speak(espeak, text, "en", 130)
    words = align_words(text, synth.audio, synth.sample_rate, "en")
    assert len(find_speech(synth.audio, synth.sample_rate)[2]) >= 3  # the pauses exist
    assert abs(words[3].start - truth[3]) < 0.15  # ₹12,480 (was 0.6 s late)
    assert abs(words[4].start - truth[4]) < 0.15  # as
