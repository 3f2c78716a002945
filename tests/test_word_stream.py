"""WordStream: words released while a sentence's audio arrives (issue 38 item 3).

Properties on synthetic audio (noise bursts and silences, so where speech and pauses are is
known exactly) and on espeak-ng speech (real speech with known word starts): every written word
once, in order, never before the audio covering it exists, corrected only forward; a pause
anchors the words before it; the engine folds each sentence's measured rate into its voice's.
"""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from benchmarks.timing import speak
from pipecat_veena.engine.utterance import RATE_MEMORY, EngineParts
from pipecat_veena.timing import align_words, split_words
from pipecat_veena.word_stream import RELEASE_MARGIN_S, WordStream

SR = 16000


def burst(seconds: float, seed: int) -> np.ndarray:
    """Speech-like noise at a steady level."""
    return (0.3 * np.random.default_rng(seed).standard_normal(round(seconds * SR))).astype(
        np.float32
    )


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * SR), np.float32)


def stream(ws: WordStream, audio: np.ndarray, hop_s: float = 0.04):
    """Feed ``audio`` in ``hop_s`` pieces: [(audio seconds fed so far, words released)], then
    finish's words."""
    hop = round(hop_s * ws.sample_rate)
    fed = []
    for i in range(0, len(audio), hop):
        piece = audio[i : i + hop]
        fed.append(((i + len(piece)) / ws.sample_rate, ws.feed(piece)))
    return fed, ws.finish()


def test_every_word_once_in_order_never_ahead_of_the_audio_and_forward_only():
    text = "Your bill of ₹1,250 is due, please pay it before next Monday."
    audio = np.concatenate([silence(0.2), burst(1.4, 1), silence(0.3), burst(1.6, 2)])
    ws = WordStream(text, SR, "en", seconds_per_unit=0.05)
    fed, final = stream(ws, audio)
    provisional = [w for _, words in fed for w in words]
    assert provisional, "no word was released before the sentence's audio was complete"
    words = provisional + final
    assert [w.word for w in words] == [text[a:b] for a, b in split_words(text)]
    assert [w.word for w in words] == [w.word for w in align_words(text, audio, SR, "en")]
    assert all(text[w.offset : w.offset + len(w.word)] == w.word for w in words)
    times = [t for w in words for t in (w.start, w.end)]
    assert times == sorted(times)  # released words are never moved back by later ones
    for heard, released in fed:
        for w in released:
            assert w.end + RELEASE_MARGIN_S <= heard + 1e-6  # its audio exists
    assert final and final[-1].word == "Monday."  # the last word is never provisional
    assert ws.seconds_per_unit is not None and 0.02 <= ws.seconds_per_unit <= 0.3


def test_a_pause_anchors_the_words_before_it():
    # "Hello there," fills the first burst, the rest the second; the pause sits at the comma.
    text = "Hello there, how are you doing today?"
    first, gap = 0.7, 0.35
    audio = np.concatenate([silence(0.1), burst(first, 3), silence(gap), burst(1.2, 4)])
    ws = WordStream(text, SR, "en", seconds_per_unit=0.2)  # a prior far too slow
    fed, _ = stream(ws, audio, hop_s=0.02)
    # Without the pause nothing would be due yet at this rate; speech resuming after the pause
    # releases the words before it, "there," ending where the pause starts.
    resumed = 0.1 + first + gap
    early = [w for heard, words in fed if heard <= resumed + 0.1 for w in words]
    assert [w.word for w in early] == ["Hello", "there,"]
    assert early[0].start == pytest.approx(0.1, abs=0.011)
    assert early[1].end == pytest.approx(0.1 + first, abs=0.011)


def test_silence_releases_nothing_and_finish_still_gives_every_word():
    text = "नमस्ते, आप कैसे हैं?"
    ws = WordStream(text, SR, "auto")
    fed, final = stream(ws, silence(1.0))
    assert not [w for _, words in fed for w in words]
    assert [w.word for w in final] == text.split()
    assert all(0 <= w.start <= w.end <= 1.0 for w in final)


def test_int16_and_float_give_the_same_words():
    text = "One two three four five six."
    audio = np.concatenate([burst(0.8, 5), silence(0.2), burst(0.8, 6)])
    a = stream(WordStream(text, SR, "en"), audio)
    b = stream(WordStream(text, SR, "en"), (audio * 32767).astype(np.int16))
    assert a == b


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="language"):
        WordStream("hi", SR, "fr")
    with pytest.raises(ValueError, match="sample_rate"):
        WordStream("hi", 0)


def test_engine_keeps_a_moving_average_of_each_voices_rate():
    parts = EngineParts(None, None, None, None, None, None)
    parts.remember_rate(("kavya", "hi"), 0.08)
    parts.remember_rate(("kavya", "hi"), 0.06)
    parts.remember_rate(("arjun", "en"), 0.05)
    assert parts.speaking_rates[("kavya", "hi")] == pytest.approx(0.08 + RATE_MEMORY * -0.02)
    assert parts.speaking_rates[("arjun", "en")] == 0.05


@pytest.fixture(scope="module")
def espeak():
    from benchmarks._espeak import Espeak

    return Espeak()


@pytest.mark.parametrize("language", ["en", "hi"])
def test_provisional_words_on_real_speech_are_close_and_early(espeak, language):
    """espeak-ng reads four sentences in a row; the second on get the first's measured rate.

    Loose bounds (BENCHMARKS.md has the figures): most words are released before their
    sentence ends, and their starts are near the true ones.
    """
    texts = {
        "en": [
            "Thank you for calling, how can I help you today?",
            "Your order of three items will arrive on Friday morning.",
            "Please keep your reference number ready when you call again.",
            "We have sent the details to your registered email address.",
        ],
        "hi": [
            "नमस्ते, मैं आपकी कैसे मदद कर सकती हूँ?",
            "आपका ऑर्डर शुक्रवार सुबह तक पहुँच जाएगा।",
            "कृपया अगली बार कॉल करते समय अपना नंबर तैयार रखें।",
            "हमने पूरी जानकारी आपके ईमेल पर भेज दी है।",
        ],
    }[language]
    rate, errors, released, total = None, [], 0, 0
    for text in texts:
        synth, truth = speak(espeak, text, language, 175)
        ws = WordStream(text, synth.sample_rate, language, seconds_per_unit=rate)
        fed, final = stream(ws, synth.audio, hop_s=0.08)
        provisional = [w for _, words in fed for w in words]
        released += len(provisional)
        total += len(truth)
        for w, t in zip(provisional, truth, strict=False):
            if t is not None and rate is not None:
                errors.append(abs(w.start - t))
        rate = ws.seconds_per_unit
    assert released >= 0.6 * total
    assert statistics.median(errors) < 0.12
