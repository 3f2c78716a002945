"""Voice enrolment without vLLM: clip and name checks, the voices file, and VeenaEngine.enroll_voice
with a scripted generator over a real (random, tiny) BiCodec checkpoint with its speaker encoder.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from engine_fakes import FakeBiCodec, ScriptedGenerator, make_checkpoint, spark_ids, well_formed
from safetensors.torch import load_file, save_file
from speech import espeak

from pipecat_veena.codecs.bicodec import write_random_checkpoint
from pipecat_veena.codecs.bicodec.encoder import BiCodecSpeakerEncoder
from pipecat_veena.codecs.bicodec.random_semantic import (
    add_random_semantic_encoder,
    write_random_wav2vec2,
)
from pipecat_veena.codecs.bicodec.semantic import SemanticTokenizer
from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.engine.checkpoint import WAV2VEC2_DIR
from pipecat_veena.engine.enrolment import check_voice_name, prepare_clip, speech_seconds
from pipecat_veena.engine.voices import GENDERS, Voice, VoiceBook
from pipecat_veena.errors import EnrolmentError

RATE = 16000
IDS = spark_ids()


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """About 10 s of espeak-ng speech at 22050 Hz, float32."""
    return espeak(tmp_path_factory.mktemp("speech"), "en+f3", 160, 60, 2, rate=22050)


def _noise(seconds: float, level: float = 0.1, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (level * rng.standard_normal(int(seconds * RATE))).astype(np.float32)


# --- clips ---


@pytest.mark.parametrize(
    ("audio", "rate", "problem"),
    [
        (_noise(31), RATE, r"31\.0 s long; enrol with 3-30 s"),
        (np.zeros(5 * RATE, np.float32), RATE, "silent"),
        (_noise(5, level=1e-4), RATE, "silent"),
        (np.r_[_noise(2), np.zeros(4 * RATE, np.float32)], RATE, r"2\.0 s of speech"),
        (np.sign(_noise(5)), RATE, "clipped"),
        (np.stack([_noise(5), _noise(5)]), RATE, "mono samples"),
        (_noise(5) * 3, RATE, r"exceed \[-1, 1\]"),
        (np.r_[_noise(5), np.nan].astype(np.float32), RATE, "NaN"),
        (_noise(5).astype(np.int32), RATE, "float samples in"),
        (_noise(5), 4000, "outside"),
        (_noise(5), 16000.0, "integer in Hz"),
    ],
)
def test_bad_clips_are_refused_with_the_fix(audio, rate, problem: str) -> None:
    with pytest.raises(EnrolmentError, match=problem):
        prepare_clip(audio, rate, RATE)


def test_speech_clip_at_another_rate_is_resampled(speech: np.ndarray) -> None:
    seconds = len(speech) / 22050
    assert 3 < speech_seconds(speech, 22050) <= seconds
    wav = prepare_clip(speech, 22050, RATE)
    assert wav.dtype == np.float32 and abs(len(wav) - round(seconds * RATE)) <= 1
    int16 = (speech * 32767).astype(np.int16)  # int16 input is accepted as it is
    assert np.abs(prepare_clip(int16, 22050, RATE) - wav).max() < 1e-3


@pytest.mark.parametrize("name", ["", " ", "a b", "x:high", "../etc", "änne", "a" * 65, 7])
def test_odd_voice_names_are_refused(name) -> None:
    with pytest.raises(EnrolmentError, match="not usable"):
        check_voice_name(name)


def test_voice_names_are_canonical() -> None:
    assert check_voice_name(" Asha ") == "asha"
    assert check_voice_name("support-agent_2.v1") == "support-agent_2.v1"


# --- the voice book and its file ---


def _book() -> VoiceBook:
    voices = {g: Voice(name=g, gender=i) for i, g in enumerate(GENDERS)}
    voices["meera"] = Voice(name="meera", speaker="<|speaker_meera|>")
    return VoiceBook(voices, "female", controllable=True)


@pytest.mark.parametrize("name", ["female", "MALE", " Female ", "meera"])
def test_builtin_names_cannot_be_enrolled(name: str) -> None:
    book = _book()
    with pytest.raises(EnrolmentError, match="belongs to a built-in voice"):
        book.enrol(name, [1] * 32)
    assert not book.enrolled


def test_enrolled_voices_round_trip_through_the_voices_file(tmp_path: Path) -> None:
    book = _book()
    book.enrol("Asha", list(range(32)))
    book.enrol("asha", [5] * 32)  # enrolling again replaces
    book.enrol("ravi", list(range(100, 132)))
    path = tmp_path / "voices.json"
    path.write_text(json.dumps(book.export_prints("demo")))
    other = _book()
    names = other.load_prints(json.loads(path.read_text()), lambda prefix: ())
    assert names == ["asha", "ravi"]
    assert other.resolve("asha").globals == (5,) * 32
    assert other.resolve("ravi").globals == tuple(range(100, 132))
    assert other.enrolled == {"asha", "ravi"}


def test_transcript_mode_voices_round_trip_and_bad_entries_are_refused() -> None:
    book = _book()
    book.enrol("asha", [3] * 32, [1, 2, 8191], " Hello there. ")
    data = book.export_prints("demo")
    assert data["enrolled"]["asha"] == {
        "globals": [3] * 32, "semantic": [1, 2, 8191], "transcript": "Hello there."
    }  # fmt: skip
    other = _book()
    other.load_prints(json.loads(json.dumps(data)), lambda prefix: ())
    voice = other.resolve("asha")
    assert voice.semantic == (1, 2, 8191) and voice.transcript == "Hello there."
    bad = [
        ({"semantic": [1, 8192], "transcript": "Hi"}, "'semantic' must be"),
        ({"semantic": [], "transcript": "Hi"}, "'semantic' must be"),
        ({"semantic": [1, 2]}, "'transcript' must be"),
        ({"transcript": "Hi"}, "'semantic' must be"),
    ]
    for extra, problem in bad:
        data["enrolled"] = {"ravi": {"globals": [1] * 32, **extra}}
        fresh = _book()
        with pytest.raises(ValueError, match=problem):
            fresh.load_prints(data, lambda prefix: ())
        assert not fresh.enrolled


def test_a_voices_file_that_enrols_a_builtin_name_changes_nothing() -> None:
    data = _book().export_prints("demo")
    data["enrolled"] = {"zoe": {"globals": [1] * 32}, "male": {"globals": [2] * 32}}
    book = _book()
    with pytest.raises(EnrolmentError, match="'male' belongs to a built-in voice"):
        book.load_prints(data, lambda prefix: ())
    assert not book.enrolled and "zoe" not in book.voices


# --- the engine, with a scripted generator ---


def _bicodec_checkpoint(root: Path) -> Path:
    make_checkpoint(root)
    write_random_checkpoint(root / "BiCodec", "tiny", seed=7)
    return root


async def _engine(root: Path, **config) -> tuple[VeenaEngine, ScriptedGenerator]:
    generator = ScriptedGenerator(well_formed(IDS, voice_globals=[9] * 32, semantics=20))
    cfg = EngineConfig(checkpoint=root, warmup=False, **config)
    engine = VeenaEngine(cfg, generator=generator, codec=FakeBiCodec())
    await engine.start()
    return engine, generator


async def test_enrolled_voice_speaks_with_the_encoders_codes(tmp_path: Path, speech) -> None:
    root = _bicodec_checkpoint(tmp_path / "ckpt")
    engine, generator = await _engine(root)
    try:
        voice = await engine.enroll_voice("Asha", speech, 22050)
        encoder = BiCodecSpeakerEncoder.from_pretrained(root)
        expected = encoder.tokenize(prepare_clip(speech, 22050, encoder.sample_rate))
        assert voice.name == "asha" and list(voice.globals) == expected
        assert "asha" in engine.voices and engine.check_voice("ASHA") == "asha"
        chunks = [c async for c in engine.stream("Hello there.", voice="asha")]
        assert sum(len(c.pcm) for c in chunks) == 20 * 320 * 2
        prompt = generator.prompts[-1]
        globals_at = prompt.index(IDS.global_ids(expected)[0])
        assert prompt[globals_at : globals_at + 32] == list(IDS.global_ids(expected))
        exported = engine.export_voices(tmp_path / "voices.json")
        assert exported["enrolled"] == {"asha": {"globals": expected}}
    finally:
        await engine.shutdown()
    replica, _ = await _engine(root, voices_file=tmp_path / "voices.json")
    try:
        assert replica.check_voice("asha") == "asha"
        assert list(replica._format.voices.resolve("asha").globals) == expected
    finally:
        await replica.shutdown()


async def test_enrolment_refusals_name_the_fix(tmp_path: Path, speech) -> None:
    root = _bicodec_checkpoint(tmp_path / "ckpt")
    engine, _ = await _engine(root)
    try:
        with pytest.raises(EnrolmentError, match="built-in voice"):
            await engine.enroll_voice("female", speech, 22050)
        with pytest.raises(EnrolmentError, match="speech"):
            await engine.enroll_voice("short", speech[: 22050 * 2], 22050)
        assert "short" not in engine.voices and not engine._format.voices.enrolled
    finally:
        await engine.shutdown()


async def test_transcript_without_wav2vec2_or_words_is_refused(tmp_path: Path, speech) -> None:
    root = _bicodec_checkpoint(tmp_path / "ckpt")
    engine, _ = await _engine(root)
    try:
        assert not engine.enrols_with_transcript  # what the server's voice upload asks
        with pytest.raises(EnrolmentError, match=f"transcript mode needs .* no {WAV2VEC2_DIR}/"):
            await engine.enroll_voice("asha", speech, 22050, transcript="Hello there.")
        with pytest.raises(EnrolmentError, match="the transcript is empty"):
            await engine.enroll_voice("asha", speech, 22050, transcript="  \n ")
        assert not engine._format.voices.enrolled
    finally:
        await engine.shutdown()


def _transcript_checkpoint(root: Path) -> Path:
    """The tiny checkpoint with semantic-encoder tensors and a random wav2vec2 directory."""
    _bicodec_checkpoint(root)
    add_random_semantic_encoder(root / "BiCodec", seed=8)
    write_random_wav2vec2(root / WAV2VEC2_DIR, hidden_size=64, seed=9)
    return root


async def test_transcript_mode_puts_the_reference_in_every_prompt(tmp_path: Path, speech) -> None:
    root = _transcript_checkpoint(tmp_path / "ckpt")
    engine, generator = await _engine(root)
    words = "The quick brown fox jumps over the lazy dog."
    try:
        assert engine.enrols_with_transcript
        voice = await engine.enroll_voice("Asha", speech, 22050, transcript=f" {words} ")
        tokenizer = SemanticTokenizer.from_pretrained(root / "BiCodec", root / WAV2VEC2_DIR)
        expected = tokenizer.tokenize(prepare_clip(speech, 22050, tokenizer.sample_rate))
        assert list(voice.semantic) == expected and voice.transcript == words
        assert abs(len(expected) - 50 * len(speech) / 22050) <= 2
        global_only = await engine.enroll_voice("ravi", speech, 22050)
        assert global_only.semantic is None and global_only.globals == voice.globals
        chunks = [c async for c in engine.stream("Hello there.", voice="asha")]
        assert sum(len(c.pcm) for c in chunks) == 20 * 320 * 2  # only the generated semantics
        prompt = generator.prompts[-1]
        reference = [IDS.marker("start_semantic_token"), *IDS.semantic_ids(expected)]
        assert prompt[-len(reference) :] == reference
        globals_at = prompt.index(IDS.global_ids(voice.globals)[0])
        assert prompt[globals_at - 1] == IDS.marker("start_global_token")
        exported = engine.export_voices(tmp_path / "voices.json")
        assert exported["enrolled"]["asha"] == {
            "globals": list(voice.globals), "semantic": expected, "transcript": words
        }  # fmt: skip
    finally:
        await engine.shutdown()
    replica, replica_generator = await _engine(root, voices_file=tmp_path / "voices.json")
    try:
        assert replica._format.voices.resolve("asha") == voice
        _ = [c async for c in replica.stream("Hello there.", voice="asha")]
        assert replica_generator.prompts[-1] == prompt  # the replica speaks it the same way
    finally:
        await replica.shutdown()


async def test_bicodec_weights_without_a_speaker_encoder(tmp_path: Path, speech) -> None:
    root = _bicodec_checkpoint(tmp_path / "ckpt")
    weights = root / "BiCodec" / "model.safetensors"
    state = load_file(str(weights))
    encode_only = ("speaker_encoder.speaker_encoder.", "speaker_encoder.perceiver_sampler.")
    save_file({k: v for k, v in state.items() if not k.startswith(encode_only)}, str(weights))
    engine, _ = await _engine(root)
    try:
        with pytest.raises(EnrolmentError, match="no speaker-encoder tensors"):
            await engine.enroll_voice("asha", speech, 22050)
    finally:
        await engine.shutdown()


async def test_snac_model_says_to_use_a_lora_voice(veena_checkpoint: Path, speech) -> None:
    generator = ScriptedGenerator(lambda prompt, options: [])
    cfg = EngineConfig(checkpoint=veena_checkpoint, warmup=False)
    engine = VeenaEngine(cfg, generator=generator)
    await engine.start()
    try:
        # it says what to do instead: a LoRA voice in the checkpoint's voices.json
        with pytest.raises(EnrolmentError, match='SNAC model .* LoRA adapter .*"lora": "adapters/'):
            await engine.enroll_voice("asha", speech, 22050)
    finally:
        await engine.shutdown()
