"""Prompt formats, and user text treated as data: control strings never become control ids."""

import json

import pytest
from tokenizers_for_tests import spark_tokenizer, veena_tokenizer

from pipecat_veena.engine import Voice, spark_voices, veena_voices
from pipecat_veena.engine.prompts import SparkPrompts, TextEncoder, VeenaPrompts
from pipecat_veena.engine.tokens import BiCodecIds, SnacIds
from pipecat_veena.errors import CheckpointError, UnknownVoiceError

TEMPLATE = "<|task_tts|><|start_content|>{speaker}{text}<|end_content|><|start_global_token|>"
INJECTIONS = [
    "<|im_end|>",
    "<|end_content|>",
    "<|bicodec_global_7|>",
    "<|bicodec_semantic_12|>",
    "<|start_semantic_token|>",
    "<|speaker_nilay|>",
]


@pytest.fixture(scope="module")
def spark():
    tok = spark_tokenizer()
    ids = BiCodecIds.from_lookup(tok.token_to_id)
    return tok, ids, SparkPrompts(ids, TextEncoder(tok, ["<laugh>"]), TEMPLATE)


def _codec_and_control_ids(ids: BiCodecIds) -> set[int]:
    codec = set(range(ids.global_base, ids.global_base + 4096))
    codec |= set(range(ids.semantic_base, ids.semantic_base + 8192))
    return codec | ids.control_ids


def test_controllable_prompt_layout(spark):
    tok, ids, prompts = spark
    voice = Voice("female", gender=0, pitch=3, speed=1)
    prompt = prompts.build("Hello world", voice)
    text = tok.decode(prompt, skip_special_tokens=False)
    assert text.startswith("<|task_controllable_tts|><|start_content|>Hello world<|end_content|>")
    assert text.endswith(
        "<|start_style_label|><|gender_0|><|pitch_label_3|><|speed_label_1|><|end_style_label|>"
    )


def test_prefix_is_appended_for_continuations(spark):
    _, ids, prompts = spark
    voice = Voice("female", gender=0)
    prefix = [ids.marker("start_global_token"), *ids.global_ids(range(32)),
              ids.marker("end_global_token")]  # fmt: skip
    prompt = prompts.build("Hi", voice, prefix)
    assert prompt[-35:] == [*prefix, ids.marker("start_semantic_token")]


def test_clone_and_template_prompts(spark):
    tok, ids, prompts = spark
    clone = prompts.build("Hi", Voice("pinned", globals=tuple(range(32))))
    assert clone[-34:-2] == ids.global_ids(range(32))
    assert clone[-2:] == [ids.marker("end_global_token"), ids.marker("start_semantic_token")]
    named = prompts.build("Hi", Voice("nilay", speaker="<|speaker_nilay|>"))
    assert tok.decode(named, skip_special_tokens=False) == TEMPLATE.format(
        speaker="<|speaker_nilay|>", text="Hi"
    )


def test_clone_with_transcript_prompt_layout(spark):
    tok, ids, prompts = spark
    voice = Voice("asha", globals=tuple(range(32)), semantic=(5, 0, 8191), transcript="Ref one.")
    prompt = prompts.build("Hi", voice)
    globals_ = "".join(f"<|bicodec_global_{i}|>" for i in range(32))
    assert tok.decode(prompt, skip_special_tokens=False) == (
        "<|task_tts|><|start_content|>Ref one.Hi<|end_content|><|start_global_token|>"
        f"{globals_}<|end_global_token|><|start_semantic_token|><|bicodec_semantic_5|>"
        "<|bicodec_semantic_0|><|bicodec_semantic_8191|>"
    )  # Spark-TTS's clone-with-transcript prompt
    assert prompt[-3:] == ids.semantic_ids([5, 0, 8191])


@pytest.mark.parametrize("injection", INJECTIONS)
def test_control_strings_in_a_transcript_never_become_control_ids(spark, injection):
    _, ids, prompts = spark
    voice = Voice("asha", globals=(1,) * 32, semantic=(2,), transcript=f"Ref {injection} one.")
    prompt = prompts.build("Hi", voice)
    head = prompt[: prompt.index(ids.marker("end_content"))]
    assert not set(head[2:]) & _codec_and_control_ids(ids)


@pytest.mark.parametrize("injection", INJECTIONS)
def test_control_strings_in_user_text_never_become_control_ids(spark, injection):
    _, ids, prompts = spark
    enc = prompts.encoder
    dirty = f"Hello {injection} world {injection}"
    encoded = enc.user_text(dirty)
    assert not set(encoded) & _codec_and_control_ids(ids)
    assert not set(encoded) & enc.added_ids
    assert encoded == enc.user_text("Hello world")


def test_partial_or_unknown_tags_stay_plain_text(spark):
    _, ids, prompts = spark
    enc = prompts.encoder
    for text in ["a <|not_a_token|> b", "<|im_end", "5 < 6 | 7 > 3", "<custom_token_3>"]:
        encoded = enc.user_text(text)
        assert not set(encoded) & enc.added_ids
        assert enc.sanitize(text) == " ".join(text.split())


def test_allowed_emotion_tags_pass_through(spark):
    tok, _, prompts = spark
    encoded = prompts.encoder.user_text("ha <laugh> ha")
    assert tok.token_to_id("<laugh>") in encoded


def test_veena_prompt_and_injection():
    tok = veena_tokenizer()
    ids = SnacIds.from_lookup(tok.token_to_id)
    prompts = VeenaPrompts(ids, TextEncoder(tok))
    prompt = prompts.build("नमस्ते", Voice("kavya", speaker="kavya"))
    assert prompt[0] == ids.start_of_human
    assert prompt[-3:] == [ids.end_of_human, ids.start_of_ai, ids.start_of_speech]
    assert tok.decode(prompt[1:-3]) == "<spk_kavya> नमस्ते"
    dirty = prompts.build("नमस्ते <custom_token_2> <spk_maitri>", Voice("kavya", speaker="kavya"))
    assert dirty == prompt


def test_spark_voices_without_file_are_controllable(tmp_path):
    book = spark_voices(tmp_path, 32)
    assert book.names == ["female", "male"]
    voice = book.resolve("Male:High")
    assert (voice.gender, voice.pitch, voice.speed) == (1, 3, 2)
    with pytest.raises(UnknownVoiceError, match="offers: female, male.*gender:pitch:speed"):
        book.resolve("robot")


def test_voices_file(tmp_path):
    data = {
        "format": "veena3",
        "template": TEMPLATE,
        "default_voice": "nilay",
        "voices": {"lipakshi": {"speaker": "<|speaker_lipakshi|>"},
                   "nilay": {"speaker": "<|speaker_nilay|>"},
                   "fixed": {"globals": list(range(32))}},
        "emotion_tags": ["<laugh>"],
        "max_part_chars": 100,
    }  # fmt: skip
    (tmp_path / "voices.json").write_text(json.dumps(data))
    book = spark_voices(tmp_path, 32)
    assert book.max_part_chars == 100
    assert book.names == ["nilay", "lipakshi", "fixed"]
    assert book.resolve(None).speaker == "<|speaker_nilay|>"
    assert book.resolve("fixed").globals == tuple(range(32))
    book.register("Cloned", list(range(1, 33)))
    assert book.resolve("cloned").globals[0] == 1
    with pytest.raises(ValueError, match="32 global codes"):
        book.register("bad", [1, 2])


def test_bad_voices_file_is_a_clear_error(tmp_path):
    (tmp_path / "voices.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="voices.json: cannot read"):
        spark_voices(tmp_path, 32)
    (tmp_path / "voices.json").write_text(json.dumps({"voices": {"x": {}}}))
    with pytest.raises(CheckpointError, match="needs 'speaker' or 'globals'"):
        spark_voices(tmp_path, 32)


def test_veena_default_voices(tmp_path):
    book = veena_voices(tmp_path)
    assert book.names == ["kavya", "agastya", "maitri", "vinaya"]
    with pytest.raises(UnknownVoiceError, match="kavya, agastya, maitri, vinaya"):
        book.resolve("tara")
