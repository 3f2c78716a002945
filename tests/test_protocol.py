"""The speech server's protocol module and wire helpers, without any server: message parsing and
type checks, the binary audio frame, error code mapping, WAV headers, the key file and the voice
map."""

from __future__ import annotations

import io
import json
import math
import re
import wave

import numpy as np
import pytest

from pipecat_veena.errors import (
    GenerationError,
    NoAudioError,
    RemoteError,
    ServerUnavailableError,
    UnknownVoiceError,
)
from pipecat_veena.generation import SamplingOptions
from pipecat_veena.generation.base import MAX_SEED, MAX_TOP_K
from pipecat_veena.interface import WordTiming
from pipecat_veena.remote import RemoteVeenaEngine
from pipecat_veena.remote.protocol import (
    Append,
    Cancel,
    Done,
    End,
    ErrorCode,
    Flush,
    GoAway,
    ProtocolError,
    Speak,
    Words,
    code_for,
    decode_audio_frame,
    encode_audio_frame,
    error_for,
    parse_client_message,
    parse_server_message,
    to_json,
)
from pipecat_veena.server.audio_out import wav_header
from pipecat_veena.server.settings import ServerSettings, parse_voice_map, read_api_keys


def _parse(**message):
    return parse_client_message(json.dumps(message))


def test_every_client_message_parses():
    speak = _parse(
        type="speak", id="ctx-1.a:b_c", text="Hello.", voice="male",
        options={"temperature": 0.7, "top_k": 20, "seed": None}, sample_rate=8000, final=False,
    )  # fmt: skip
    assert speak == Speak(
        "ctx-1.a:b_c", "Hello.", "male", {"temperature": 0.7, "top_k": 20}, 8000, False
    )
    assert _parse(type="speak", id="u", text="Hi") == Speak("u", "Hi")
    options = {"language": "hi", "normalize": False}
    assert _parse(type="speak", id="u", text="₹5", options=options).options == options
    assert _parse(type="append", id="u", text=" more") == Append("u", " more")
    assert _parse(type="flush", id="u") == Flush("u")
    assert _parse(type="end", id="u") == End("u")
    assert _parse(type="cancel", id="u") == Cancel("u")


@pytest.mark.parametrize(
    "raw, code, words",
    [
        ("{not json", ErrorCode.BAD_JSON, "not valid JSON"),
        ("[1, 2]", ErrorCode.BAD_MESSAGE, "JSON object"),
        ('{"type": "shout", "id": "u"}', ErrorCode.UNKNOWN_TYPE, "valid: speak, append"),
        ('{"id": "u", "text": "x"}', ErrorCode.UNKNOWN_TYPE, "None"),
        ('{"type": "speak", "text": "x"}', ErrorCode.BAD_MESSAGE, "'id' must be"),
        ('{"type": "speak", "id": "a b", "text": "x"}', ErrorCode.BAD_MESSAGE, "'id' must be"),
        ('{"type": "speak", "id": "' + "x" * 65 + '", "text": "x"}', ErrorCode.BAD_MESSAGE, "1-64"),
        ('{"type": "speak", "id": 7, "text": "x"}', ErrorCode.BAD_MESSAGE, "'id' must be"),
        ('{"type": "speak", "id": "u"}', ErrorCode.BAD_MESSAGE, "'text' is missing"),
        ('{"type": "speak", "id": "u", "text": 5}', ErrorCode.BAD_MESSAGE, "'text' must be str"),
        ('{"type": "speak", "id": "u", "text": "x", "voice": 3}', ErrorCode.BAD_MESSAGE, "'voice'"),
        ('{"type": "speak", "id": "u", "text": "x", "final": "no"}', ErrorCode.BAD_MESSAGE, "bool"),
        ('{"type": "speak", "id": "u", "text": "x", "sample_rate": true}', ErrorCode.BAD_MESSAGE,
         "'sample_rate' must be int"),
        ('{"type": "speak", "id": "u", "text": "x", "sample_rate": 4000}',
         ErrorCode.UNSUPPORTED_SAMPLE_RATE, "8000, 11025, 12000"),
        ('{"type": "speak", "id": "u", "text": "x", "options": [1]}', ErrorCode.BAD_MESSAGE,
         "'options' must be dict"),
        ('{"type": "speak", "id": "u", "text": "x", "options": {"temp": 1}}', ErrorCode.BAD_OPTIONS,
         "unknown option"),
        ('{"type": "speak", "id": "u", "text": "x", "options": {"top_k": 2.5}}',
         ErrorCode.BAD_OPTIONS, "'top_k' must be a int"),
        ('{"type": "speak", "id": "u", "text": "x", "options": {"seed": true}}',
         ErrorCode.BAD_OPTIONS, "'seed'"),
        ('{"type": "speak", "id": "u", "text": "x", "speed": 2}', ErrorCode.BAD_MESSAGE,
         "unknown field"),
        ('{"type": "append", "id": "u"}', ErrorCode.BAD_MESSAGE, "'text' is missing"),
        ('{"type": "cancel", "id": "u", "text": "x"}', ErrorCode.BAD_MESSAGE, "unknown field"),
        ('{"type": "speak", "id": "u", "text": "x", "words": "yes"}', ErrorCode.BAD_MESSAGE,
         "'words' must be bool"),
    ],
)  # fmt: skip
def test_bad_messages_name_the_problem(raw, code, words):
    with pytest.raises(ProtocolError) as info:
        parse_client_message(raw)
    assert info.value.code == code and words in info.value.message


@pytest.mark.parametrize(
    "message",
    [
        {"text": "x", "speed": 2},  # unknown field
        {"text": 5},  # wrong type
        {"text": "x", "sample_rate": 47.5},  # odd rates
        {"text": "x", "sample_rate": 10**30},
        {"text": "x", "final": "no"},
        {"text": "Hi \ud800 there"},  # lone surrogate
        {"text": "x", "voice": "\udfff"},
        {"text": "x", "options": {"warp": 9}},
        {"text": "x", "options": {"seed": 1.5}},
        {"text": "x" * 70000},  # over max_bytes below
    ],
)
def test_a_refused_speak_names_its_id_and_ends_it(message):
    """docs/protocol.md: every utterance ends with ``done`` or an error with ``ended: true``; a
    client waiting for its id's end must get it when the server will not run the speak."""
    raw = json.dumps({"type": "speak", "id": "turn-7", **message})
    with pytest.raises(ProtocolError) as info:
        parse_client_message(raw, max_bytes=65536)
    assert (info.value.ref, info.value.ended) == ("turn-7", True), info.value.message
    with pytest.raises(ProtocolError) as info:  # an invalid id is still the client's name for it
        parse_client_message(json.dumps({"type": "speak", "id": "turn 7", "text": "x"}))
    assert (info.value.ref, info.value.ended) == ("turn 7", True)


@pytest.mark.parametrize(
    "raw",
    [
        '{"type": "append", "id": "u", "text": 5}',
        '{"type": "cancel", "id": "u", "text": "x"}',
        '{"type": "SPEAK", "id": "u", "text": "x"}',
        '{"type": "flush", "id": "u", "pad": "' + "x" * 70000 + '"}',
    ],
)
def test_a_refused_message_about_an_open_utterance_does_not_end_it(raw):
    with pytest.raises(ProtocolError) as info:
        parse_client_message(raw, max_bytes=65536)
    assert not info.value.ended


def test_a_message_over_the_cap_is_too_large_even_when_not_json():
    with pytest.raises(ProtocolError) as info:
        parse_client_message("{" * 70000, max_bytes=65536)
    assert info.value.code == ErrorCode.MESSAGE_TOO_LARGE


#: Sampling values vLLM refuses or fails on, per option, with the range the error must name.
_OUT_OF_RANGE = {
    "temperature": ([math.nan, math.inf], "[0, 2]"),
    "top_p": ([math.nan], "(0, 1]"),
    "repetition_penalty": ([math.inf, math.nan, -math.inf], "finite number > 0"),
    "top_k": ([10**29, -5], f"[-1, {MAX_TOP_K}]"),
    "seed": ([2**64, 2**70, -1], f"[0, {MAX_SEED}]"),
}


@pytest.mark.parametrize(
    "option, value, accepted",
    [
        (name, value, accepted)
        for name, (values, accepted) in _OUT_OF_RANGE.items()
        for value in values
    ],
)
def test_sampling_values_out_of_range_are_refused_naming_the_range(option, value, accepted):
    """One check for every door (the WebSocket, the OpenAI route, the Pipecat and LiveKit
    settings, RemoteVeenaEngine): a value vLLM refuses or fails on later is a ``bad_options``
    (not retryable), not a 500 ``internal`` or a retried ``generation_failed``."""
    with pytest.raises(ValueError) as info:
        SamplingOptions(**{option: value})
    assert option in str(info.value) and accepted in str(info.value)
    assert code_for(info.value) == ErrorCode.BAD_OPTIONS
    assert not error_for(code_for(info.value), str(info.value)).retryable
    # the remote engine checks locally with the same rule (no request is sent)
    with pytest.raises(ValueError, match=re.escape(accepted)):
        RemoteVeenaEngine("ws://127.0.0.1:9").check_options(**{option: value})


def test_sampling_range_edges_are_accepted():
    SamplingOptions(top_k=-1, seed=MAX_SEED, repetition_penalty=1e9, temperature=0, top_p=1)
    SamplingOptions(top_k=MAX_TOP_K, seed=0)
    assert (MAX_TOP_K, MAX_SEED) == (2**31 - 1, 2**63 - 1)  # as docs/protocol.md says


def test_audio_frame_round_trip_and_garbage():
    pcm = np.arange(-5, 5, dtype="<i2").tobytes()
    frame = decode_audio_frame(encode_audio_frame("ctx-9", 1234, pcm))
    assert (frame.id, frame.tokens, frame.pcm) == ("ctx-9", 1234, pcm)
    for garbage in (b"", b"\x02\x01u\x00\x00\x00\x00", b"\x01\x05ab"):
        with pytest.raises(ProtocolError):
            decode_audio_frame(garbage)


def test_server_messages_round_trip():
    done = Done("u", "completed", 40, 1.5, 80.0, 1600.0, 16000, "ws-1")
    assert parse_server_message(to_json(done)) == done
    assert "warning" not in to_json(done)  # absent while null: clients from before it read it
    cut = Done("u", "completed", 40, 1.5, 80.0, 1600.0, 16000, "ws-1", warning="loop_guard")
    assert parse_server_message(to_json(cut)) == cut and '"warning":"loop_guard"' in to_json(cut)
    goaway = GoAway(ErrorCode.SERVER_DRAINING, "going")
    assert parse_server_message(to_json(goaway)) == goaway
    for broken in ('{"type": "done", "id": "u"}', '{"id": "u"}', "[1]", "not json"):
        with pytest.raises(ProtocolError):  # a known message missing fields, no type, not JSON
            parse_server_message(broken)


def test_word_timings_on_the_wire():
    """``words`` is asked for with ``speak``'s ``words`` (left out of the JSON unless set: a
    server from before it refuses the field); the ``words`` message carries WordTimings."""
    assert _parse(type="speak", id="u", text="Hi", words=True) == Speak("u", "Hi", words=True)
    assert "words" not in to_json(Speak("u", "Hi"))
    assert json.loads(to_json(Speak("u", "Hi", words=True)))["words"] is True
    timings = (WordTiming("₹1,250", 0.0, 0.61234567, 0), WordTiming("है।", 0.6123, 0.9, 7))
    message = parse_server_message(to_json(Words.of("u", timings)))
    assert message.type == "words" and message.estimated and message.id == "u"
    assert message.timings() == (
        WordTiming("₹1,250", 0.0, 0.6123, 0), WordTiming("है।", 0.6123, 0.9, 7)
    )  # fmt: skip
    for broken in ([{"word": "a", "start": 0}], [["a", 0, 1, 0]], "a",
                   [{"word": "a", "start": "0", "end": 1, "offset": 0}]):  # fmt: skip
        with pytest.raises(ProtocolError, match="word"):
            parse_server_message(json.dumps({"type": "words", "id": "u", "words": broken}))


def test_clients_read_server_messages_forward_compatibly():
    """A later server may add fields and message types; this client ignores what it does not
    know (the server stays strict about client messages: test_server_unit's fuzz)."""
    done = Done("u", "completed", 40, 1.5, 80.0, 1600.0, 16000, "ws-1")
    data = json.loads(to_json(done)) | {"energy_db": -20.5, "words": [{"w": "hi"}]}
    assert parse_server_message(json.dumps(data)) == done
    assert parse_server_message('{"type": "progress", "id": "u", "percent": 40}') is None
    with pytest.raises(ProtocolError, match="unknown field"):
        parse_client_message('{"type": "cancel", "id": "u", "energy_db": 1}')


@pytest.mark.parametrize(
    "error, code, back",
    [
        (UnknownVoiceError("unknown voice 'x'"), ErrorCode.UNKNOWN_VOICE, UnknownVoiceError),
        (NoAudioError("no audio"), ErrorCode.NO_AUDIO, NoAudioError),
        (GenerationError("failed"), ErrorCode.GENERATION_FAILED, GenerationError),
        (ValueError("temperature"), ErrorCode.BAD_OPTIONS, ValueError),
        (RuntimeError("boom"), ErrorCode.INTERNAL, RemoteError),
    ],
)
def test_error_codes_map_both_ways(error, code, back):
    assert code_for(error) == code
    assert isinstance(error_for(code, str(error)), back)


def test_unavailable_codes_are_retryable_and_input_errors_are_not():
    for code in (ErrorCode.SERVER_DRAINING, ErrorCode.TOO_MANY_STREAMS, ErrorCode.SERVER_STARTING):
        error = error_for(code, "x")
        assert isinstance(error, ServerUnavailableError) and error.retryable
    for code in (ErrorCode.TEXT_TOO_LONG, ErrorCode.BAD_OPTIONS):
        error = error_for(code, "x")
        assert isinstance(error, ValueError) and not error.retryable


def test_wav_header_for_known_and_streamed_lengths():
    pcm = np.arange(100, dtype="<i2").tobytes()
    with wave.open(io.BytesIO(wav_header(24000, 100) + pcm)) as f:
        assert (f.getframerate(), f.getnchannels(), f.getsampwidth(), f.getnframes()) == (
            24000, 1, 2, 100,
        )  # fmt: skip
    streamed = wav_header(24000)
    assert len(streamed) == 44 and streamed[4:8] == b"\xff\xff\xff\xff"
    assert streamed[40:44] == b"\xff\xff\xff\xff"


def test_api_key_file_and_voice_map(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# bots\nalpha-secret\nbob bob-secret  # second bot\n\n")
    assert read_api_keys(path) == {"alpha-secret": "key1", "bob-secret": "bob"}
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(ValueError, match="no API key"):
        read_api_keys(tmp_path / "empty")
    with pytest.raises(ValueError, match="cannot read"):
        read_api_keys(tmp_path / "missing")
    assert parse_voice_map("alloy=kavya, Echo=agastya") == {"alloy": "kavya", "echo": "agastya"}
    with pytest.raises(ValueError, match="not an OpenAI voice"):
        parse_voice_map("robot=kavya")
    with pytest.raises(ValueError, match="max_streams"):
        ServerSettings(max_streams=0)
