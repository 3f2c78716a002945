"""Voice enrolment over HTTP without vLLM: POST / GET / DELETE /v1/audio/voices on a real server
(real sockets, httpx) over a VeenaEngine with a scripted generator and the tiny random BiCodec
checkpoint's real speaker encoder; espeak-ng speech encoded with PyAV in every upload format;
each refusal's status and code; the shared voices file (reload on change, on SIGHUP)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import struct
import tempfile
import threading
import tracemalloc
from contextlib import ExitStack
from pathlib import Path

import hostile_audio
import httpx
import numpy as np
import psutil
import pytest
from engine_fakes import ScriptedGenerator
from server_fakes import serving, until
from speech import encode_clip, espeak
from test_enrolment import _bicodec_checkpoint, _engine

from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.remote.protocol import ProtocolError
from pipecat_veena.server import ServerHandle, create_app, uploads, voice_routes
from pipecat_veena.server.runner import serve_until_signalled
from pipecat_veena.server.settings import ServerSettings
from pipecat_veena.server.uploads import DECODE_RATE, decode_clip
from pipecat_veena.server.voice_routes import MAX_CLIP_SECONDS
from pipecat_veena.server.workers import WORKER_NICENESS, upload_workers

VOICES = "/v1/audio/voices"


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[int, np.ndarray]:
    """About 11 s of espeak-ng speech at each rate the uploads use, float32."""
    tmp = tmp_path_factory.mktemp("speech")
    return {
        rate: espeak(tmp, "en+f3", 160, 60, 2, rate=rate)
        for rate in (16000, 22050, 44100, 48000, 24000)
    }


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return _bicodec_checkpoint(tmp_path / "ckpt")


def _form(data: bytes, name: str = "asha", filename: str = "clip.wav", **fields) -> dict:
    fields = {"name": name, "consent": "true", **fields}
    return {"files": {"file": (filename, data)}, "data": fields}


async def _post(url: str, form: dict, **kwargs) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        return await http.post(VOICES, **form, **kwargs)


@pytest.mark.parametrize(
    ("fmt", "rate"),
    [("wav", 22050), ("mp3", 44100), ("ogg", 48000), ("flac", 16000), ("m4a", 24000)],
)
async def test_an_upload_in_each_format_enrols_a_voice_that_speaks(
    checkpoint, clips, fmt, rate
) -> None:
    engine, generator = await _engine(checkpoint)
    try:
        async with serving(engine) as handle, httpx.AsyncClient(base_url=handle.url) as http:
            data = encode_clip(clips[rate], rate, fmt)
            answer = await http.post(VOICES, **_form(data, "Asha", f"clip.{fmt}"), timeout=60)
            assert answer.status_code == 201, answer.text
            voice = answer.json()
            assert voice["id"] == "asha" and len(voice["global_tokens"]) == 32
            assert engine._format.voices.resolve("asha").globals == tuple(voice["global_tokens"])
            listed = (await http.get(VOICES)).json()
            assert listed["enrolled"] == ["asha"] and "asha" in listed["voices"]
            assert "female" in listed["voices"]  # the built-in ones stay
            for spec in ("asha", {"id": "asha"}):  # the name, and OpenAI's custom voice object
                body = {"input": "Hello there.", "voice": spec, "response_format": "pcm"}
                speech = await http.post("/v1/audio/speech", json=body, timeout=60)
                assert speech.status_code == 200 and len(speech.content) > 0
                prompt = generator.prompts[-1]
                codes = list(engine._format.ids.global_ids(voice["global_tokens"]))
                at = prompt.index(codes[0])
                assert prompt[at : at + 32] == codes
    finally:
        await engine.shutdown()


def _noise(seconds: float, level: float = 0.1, rate: int = 16000) -> np.ndarray:
    rng = np.random.default_rng(1)
    return (level * rng.standard_normal(int(seconds * rate))).astype(np.float32)


@pytest.mark.parametrize(
    ("make", "fields", "status", "code", "words"),
    [
        (lambda c: b"this is a text file, not audio", {}, 415, "not_audio", "not audio"),
        (lambda c: b"", {}, 415, "not_audio", "empty"),
        (lambda c: encode_clip(c[44100], 44100, "mp2"), {}, 415, "unsupported_codec", "'mp2'"),
        (
            lambda c: encode_clip(c[16000][: 2 * 16000], 16000, "wav"),
            {},
            422,
            "bad_voice_clip",
            "s of speech (2.0 s in all)",
        ),
        (
            lambda c: encode_clip(_noise(31), 16000, "flac"),
            {},
            422,
            "bad_voice_clip",
            "longer than 30 s",
        ),
        (
            lambda c: encode_clip(np.zeros(5 * 16000, np.float32), 16000, "wav"),
            {},
            422,
            "bad_voice_clip",
            "silent",
        ),
        (
            lambda c: encode_clip(np.sign(_noise(5)), 16000, "wav"),
            {},
            422,
            "bad_voice_clip",
            "clipped",
        ),
        (
            lambda c: encode_clip(c[16000], 16000, "wav"),
            {"name": "female"},
            409,
            "voice_name_taken",
            "built-in voice",
        ),
        (
            lambda c: encode_clip(c[16000], 16000, "wav"),
            {"name": "asha smith!"},
            400,
            "bad_voice_name",
            "not usable",
        ),
        (
            lambda c: encode_clip(c[16000], 16000, "wav"),
            {"consent": "false"},
            400,
            "consent_required",
            "consent=true",
        ),
        (
            lambda c: encode_clip(c[16000], 16000, "wav"),
            {"transcript": "The quick brown fox"},
            422,
            "transcript_unsupported",
            "wav2vec2",
        ),
    ],
)
async def test_bad_uploads_get_a_4xx_naming_the_problem(
    checkpoint, clips, make, fields, status, code, words
) -> None:
    engine, _ = await _engine(checkpoint)
    try:
        async with serving(engine) as handle:
            answer = await _post(handle.url, _form(make(clips), **fields))
        assert answer.status_code == status, answer.text
        error = answer.json()["error"]
        assert error["code"] == code and words in error["message"]
        assert not engine.enrolled_voices
    finally:
        await engine.shutdown()


async def test_form_problems_size_cap_and_auth(checkpoint, clips) -> None:
    engine, _ = await _engine(checkpoint)
    wav = encode_clip(clips[16000], 16000, "wav")
    settings = ServerSettings(api_keys={"k1": "alice"}, max_upload_bytes=len(wav) // 2)
    auth = {"authorization": "Bearer k1"}
    try:
        async with serving(engine, settings) as handle:
            no_key = await _post(handle.url, _form(wav))
            too_big = await _post(handle.url, _form(wav), headers=auth)
            not_form = await _post(handle.url, {"json": {"name": "asha"}}, headers=auth)
            no_file = await _post(
                handle.url, {"data": {"name": "asha", "consent": "true"},
                             "files": {"other": ("x", b"1")}}, headers=auth)  # fmt: skip
        assert no_key.status_code == 401
        assert too_big.status_code == 413 and "cap" in too_big.json()["error"]["message"]
        assert not_form.status_code == 400 and "multipart" in not_form.json()["error"]["message"]
        assert no_file.status_code == 400 and "'file'" in no_file.json()["error"]["message"]
    finally:
        await engine.shutdown()


async def test_a_snac_model_answers_to_use_a_lora_voice(veena_checkpoint, clips) -> None:
    engine = VeenaEngine(
        EngineConfig(checkpoint=veena_checkpoint, warmup=False),
        generator=ScriptedGenerator(lambda prompt, options: []),
    )
    try:
        async with serving(engine) as handle:
            answer = await _post(handle.url, _form(encode_clip(clips[24000], 24000, "wav")))
        assert answer.status_code == 422
        error = answer.json()["error"]
        assert error["code"] == "enrolment_unsupported" and "LoRA adapter" in error["message"]
    finally:
        await engine.shutdown()


async def test_nothing_uploaded_is_left_on_disk(checkpoint, clips, tmp_path, monkeypatch) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    engine, _ = await _engine(checkpoint)
    big = encode_clip(clips[48000], 48000, "wav")  # over a MiB: Starlette would spool it
    assert len(big) > 1 << 20
    try:
        async with serving(engine) as handle:
            good = await _post(handle.url, _form(big))
            bad = await _post(handle.url, _form(big, name="female"))
            broken = await _post(handle.url, _form(big[: len(big) // 3] + b"\0" * 99, "cut"))
        assert good.status_code == 201 and bad.status_code == 409
        assert broken.status_code in (201, 415, 422)
        assert list(spool.iterdir()) == []
        open_files = [f.path for f in psutil.Process().open_files()]
        assert not [f for f in open_files if str(spool) in f or "(deleted)" in f]
    finally:
        await engine.shutdown()


async def test_delete_removes_only_enrolled_voices(checkpoint, clips) -> None:
    engine, _ = await _engine(checkpoint)
    try:
        async with serving(engine) as handle, httpx.AsyncClient(base_url=handle.url) as http:
            created = await http.post(VOICES, **_form(encode_clip(clips[16000], 16000, "wav")))
            assert created.status_code == 201
            gone = await http.delete(f"{VOICES}/asha")
            assert gone.status_code == 200 and gone.json() == {
                "id": "asha", "object": "audio.voice", "deleted": True}  # fmt: skip
            builtin = await http.delete(f"{VOICES}/female")
            unknown = await http.delete(f"{VOICES}/asha")
            body = {"input": "Hello.", "voice": "asha", "response_format": "pcm"}
            speech = await http.post("/v1/audio/speech", json=body)
        assert builtin.status_code == 409 and "built-in" in builtin.json()["error"]["message"]
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_voice"
        assert speech.status_code == 400 and speech.json()["error"]["code"] == "unknown_voice"
        assert "female" in engine.voices
    finally:
        await engine.shutdown()


async def test_replicas_sharing_a_voices_file_see_enrolments_and_removals(
    checkpoint, clips, tmp_path
) -> None:
    shared = tmp_path / "shared" / "voices.json"
    shared.parent.mkdir()
    one, _ = await _engine(checkpoint, voices_file=shared)  # the file does not exist yet
    two, _ = await _engine(checkpoint, voices_file=shared)
    try:
        async with serving(one) as a, serving(two) as b, httpx.AsyncClient() as http:
            created = await http.post(
                a.url + VOICES, **_form(encode_clip(clips[22050], 22050, "wav"))
            )
            assert created.status_code == 201
            data = json.loads(shared.read_text())
            assert data["enrolled"]["asha"]["globals"] == created.json()["global_tokens"]

            async def listed() -> list[str]:
                return (await http.get(b.url + VOICES)).json()["enrolled"]

            for _ in range(30):  # the other replica polls the file's mtime (VOICES_POLL_S)
                if await listed() == ["asha"]:
                    break
                await asyncio.sleep(0.1)
            assert await listed() == ["asha"]
            assert (await http.delete(b.url + VOICES + "/asha")).status_code == 200
            for _ in range(30):
                if "asha" not in (await http.get(a.url + VOICES)).json()["voices"]:
                    break
                await asyncio.sleep(0.1)
            assert (await http.get(a.url + VOICES)).json()["enrolled"] == []
            assert "enrolled" not in json.loads(shared.read_text())
    finally:
        await one.shutdown()
        await two.shutdown()


async def test_sighup_reloads_the_voices_file(checkpoint, clips, tmp_path) -> None:
    shared = tmp_path / "voices.json"
    writer, _ = await _engine(checkpoint, voices_file=shared)
    await writer.enroll_voice("ravi", clips[16000], 16000)
    await writer.shutdown()
    reader, _ = await _engine(checkpoint, voices_file=shared)
    assert reader.enrolled_voices == ["ravi"]
    handle = ServerHandle(create_app(reader, owns_engine=False))
    serving_task = asyncio.ensure_future(serve_until_signalled(handle))
    try:
        await until(lambda: handle.state is not None and handle.state.ready, 20)
        reader._voices_file._polled = float("inf")  # no poll from now on: only SIGHUP
        data = json.loads(shared.read_text())
        data["enrolled"]["mira"] = data["enrolled"]["ravi"]
        shared.write_text(json.dumps(data))
        os.kill(os.getpid(), signal.SIGHUP)
        await until(lambda: "mira" in reader._format.voices.enrolled, 5)
    finally:
        if not serving_task.done():  # its handler is installed: it drains and stops the server
            os.kill(os.getpid(), signal.SIGTERM)
        assert await asyncio.wait_for(serving_task, 30) == 0
        await reader.shutdown()


def test_cli_voices_add_list_remove(checkpoint, clips, tmp_path, capsys) -> None:
    from pipecat_veena.cli import main

    clip = tmp_path / "clip.mp3"
    clip.write_bytes(encode_clip(clips[44100], 44100, "mp3"))
    voices = ["--model", str(checkpoint), "--voices-file", str(tmp_path / "v.json")]
    assert main(["voices", "add", "Asha", str(clip), *voices]) == 0
    assert main(["voices", "list", *voices]) == 0
    assert "enrolled" in capsys.readouterr().out.splitlines()[-1].split(":")[0]
    data = json.loads((tmp_path / "v.json").read_text())
    assert len(data["enrolled"]["asha"]["globals"]) == 32
    assert main(["voices", "add", "female", str(clip), *voices]) == 2  # a built-in name
    assert main(["voices", "add", "x", str(tmp_path / "v.json"), *voices]) == 2  # not audio
    assert "not audio" in capsys.readouterr().err
    assert main(["voices", "remove", "asha", *voices]) == 0
    assert main(["voices", "remove", "asha", *voices]) == 2
    assert "enrolled" not in json.loads((tmp_path / "v.json").read_text())
    said = "The quick brown fox"
    assert main(["voices", "add", "Asha", str(clip), "--transcript", said, *voices]) == 2
    assert "wav2vec2" in capsys.readouterr().err  # transcript mode needs the wav2vec2 model


def test_cli_voices_add_in_transcript_mode(checkpoint, clips, tmp_path) -> None:
    from pipecat_veena.cli import main
    from pipecat_veena.codecs.bicodec.random_semantic import (
        add_random_semantic_encoder,
        write_random_wav2vec2,
    )
    from pipecat_veena.engine.checkpoint import WAV2VEC2_DIR

    add_random_semantic_encoder(checkpoint / "BiCodec", seed=3)
    write_random_wav2vec2(checkpoint / WAV2VEC2_DIR, hidden_size=64, seed=4)
    clip = tmp_path / "clip.wav"
    clip.write_bytes(encode_clip(clips[16000], 16000, "wav"))
    voices = ["--model", str(checkpoint), "--voices-file", str(tmp_path / "v.json")]
    said = ["--transcript", " The quick  fox"]
    assert main(["voices", "add", "Asha", str(clip), *said, *voices]) == 0
    entry = json.loads((tmp_path / "v.json").read_text())["enrolled"]["asha"]
    assert entry["transcript"] == "The quick fox" and len(entry["globals"]) == 32
    seconds = len(clips[16000]) / 16000
    assert abs(len(entry["semantic"]) - 50 * min(seconds, 30)) <= 2  # 50 semantic codes a second


async def test_a_voices_file_that_cannot_be_written_changes_nothing(checkpoint, clips, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    engine, _ = await _engine(checkpoint, voices_file=blocker / "voices.json")
    try:
        async with serving(engine) as handle:
            answer = await _post(handle.url, _form(encode_clip(clips[16000], 16000, "wav")))
        assert answer.status_code == 422
        error = answer.json()["error"]
        assert error["code"] == "enrolment_unsupported"
        assert "cannot write the voices file" in error["message"]
        assert engine.enrolled_voices == [] and "asha" not in engine.voices
    finally:
        await engine.shutdown()


# -- hostile uploads (issue 37): the container allow-list, header checks and the output cap ----


def _refusal(data: bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as refused:
        decode_clip(data, MAX_CLIP_SECONDS)
    assert "Errno" not in refused.value.message and "avformat" not in refused.value.message
    return refused.value


@pytest.mark.parametrize("fmt", ["wav", "mp3", "ogg", "flac", "m4a", "webm", "adts"])
def test_every_accepted_format_decodes_to_the_fixed_rate(clips, fmt) -> None:
    clip = clips[48000]
    if fmt == "webm":
        data = hostile_audio.webm_opus(clip)
    elif fmt == "adts":
        data = hostile_audio._encode(clip, 48000, "adts", "aac")
    else:
        data = encode_clip(clip, 48000, fmt)
    samples, rate = decode_clip(data, MAX_CLIP_SECONDS)
    assert rate == DECODE_RATE and samples.dtype == np.float32
    assert abs(len(samples) / DECODE_RATE - len(clip) / 48000) < 0.1


@pytest.mark.parametrize(
    "data",
    [
        hostile_audio.sdp(5004),
        b"#EXTM3U\n#EXTINF:10,\nhttp://127.0.0.1:1/a.ts\n",  # HLS
        b"ffconcat version 1.0\nfile /etc/passwd\n",  # concat
        b"\x89PNG\r\n\x1a\n" + bytes(64),  # image2
        b"RIFF\x00\x00\x00\x00AVI LIST",  # RIFF, not WAVE
    ],
    ids=["sdp", "hls", "concat", "png", "avi"],
)
def test_other_containers_never_reach_ffmpeg(data, monkeypatch) -> None:
    def no_ffmpeg(*args, **kwargs):
        raise AssertionError("FFmpeg opened a file outside the allow-list")

    monkeypatch.setattr(uploads.av, "open", no_ffmpeg)
    refused = _refusal(data)
    assert refused.code == "not_audio" and "accepted format" in refused.message


def test_each_container_is_opened_with_its_own_demuxer_only(clips, monkeypatch) -> None:
    files = [encode_clip(clips[16000], 16000, f) for f in ("wav", "mp3", "ogg", "flac", "m4a")]
    files.append(hostile_audio.webm_opus(clips[48000]))
    opened = []
    real_open = uploads.av.open

    def spy(*args, **kwargs):
        opened.append(kwargs.get("format"))
        return real_open(*args, **kwargs)

    monkeypatch.setattr(uploads.av, "open", spy)
    for data in files:
        decode_clip(data, MAX_CLIP_SECONDS)
    assert opened == ["wav", "mp3", "ogg", "flac", "mov", "matroska"]


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (hostile_audio.vorbis_claiming_rate, "sample rate (2000000000 Hz)"),
        (hostile_audio.flac_bomb, "sample rate (655350 Hz)"),
        (lambda: encode_clip(_noise(4, rate=4000), 4000, "wav"), "sample rate (4000 Hz)"),
        (lambda: _wav_patched(22, struct.pack("<H", 16)), "16 audio channels"),
        (lambda: encode_clip(_noise(40), 16000, "wav"), "longer than 30 s"),
    ],
    ids=["vorbis-2GHz", "flac-655kHz", "4kHz", "16-channels", "declared-40s"],
)
def test_headers_are_checked_before_decoding(make, words, monkeypatch) -> None:
    monkeypatch.setattr(uploads, "_decode", lambda *a: pytest.fail("decoded a refused clip"))
    refused = _refusal(make())
    assert refused.code == "bad_voice_clip" and words in refused.message


def _wav_patched(at: int, value: bytes) -> bytes:
    data = bytearray(encode_clip(_noise(4), 16000, "wav"))
    data[at : at + len(value)] = value
    return bytes(data)


def test_the_cap_is_on_decoded_output_whatever_the_header_says() -> None:
    """A 28 KB FLAC of unknown length at an allowed 192 kHz holding 6 minutes of silence: the
    decoder stops at 30 s of output and little memory is ever held."""
    bomb = hostile_audio.flac_bomb(blocks=2000, rate=192000, channels=2)
    assert len(bomb) < 64 * 1024
    tracemalloc.start()
    try:
        refused = _refusal(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert refused.code == "bad_voice_clip" and "longer than 30 s" in refused.message
    assert peak < 16 * 1024 * 1024  # 30 s at 16 kHz is 1.9 MB; the whole file would be 1 GB


def test_a_rate_change_mid_stream_decodes_with_a_fresh_resampler() -> None:
    samples, _ = decode_clip(hostile_audio.rate_change_mp3(seconds=4.0), MAX_CLIP_SECONDS)
    assert abs(len(samples) / DECODE_RATE - 8.0) < 0.2  # both halves, at the fixed rate


def test_a_broken_file_is_a_4xx_without_ffmpeg_internals(clips) -> None:
    flac = encode_clip(clips[16000], 16000, "flac")
    refused = _refusal(flac[:200])
    assert refused.code == "not_audio"
    refused = _refusal(b"OggS" + bytes(200))
    assert refused.code == "not_audio" and "send WAV" in refused.message


async def test_a_full_upload_pool_answers_429_with_retry_after(checkpoint, clips) -> None:
    engine, _ = await _engine(checkpoint)
    workers = upload_workers()
    wav = encode_clip(clips[16000], 16000, "wav")
    try:
        async with serving(engine) as handle:
            with ExitStack() as held:
                for _ in range(workers.admitted):
                    held.enter_context(workers.admit())
                busy = await _post(handle.url, _form(wav))
            assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
            assert busy.json()["error"]["code"] == "uploads_busy"
            assert workers.in_progress == 0
            again = await _post(handle.url, _form(wav, consent="on"))  # an HTML checkbox
            assert again.status_code == 201, again.text
    finally:
        await engine.shutdown()


async def test_decoding_and_enrolment_never_use_the_default_thread_pool(
    checkpoint, clips, monkeypatch
) -> None:
    engine, _ = await _engine(checkpoint)
    threads: list[str] = []
    nice: list[int] = []

    def on_thread(work):
        def noted(*args):
            threads.append(threading.current_thread().name)
            nice.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
            return work(*args)

        return noted

    monkeypatch.setattr(voice_routes, "decode_clip", on_thread(uploads.decode_clip))
    try:
        async with serving(engine) as handle:
            encoder = await engine._speaker_encoder_loaded()
            monkeypatch.setattr(encoder, "tokenize", on_thread(encoder.tokenize))
            answer = await _post(handle.url, _form(encode_clip(clips[16000], 16000, "mp3")))
        assert answer.status_code == 201, answer.text
        assert len(threads) == 2 and all(t.startswith("veena-upload") for t in threads), threads
        base = os.getpriority(os.PRIO_PROCESS, 0)
        assert nice == [min(base + WORKER_NICENESS, 19)] * 2  # they yield the CPU to speech
    finally:
        await engine.shutdown()
