"""Voices with owners through the real parts: a real server with two API keys on a real socket
over the real engine (vLLM CPU on the demo Spark checkpoint, its speaker encoder), espeak-ng
clips uploaded with httpx; the CLI's enrolment (the function ``pipecat-veena voices add`` runs)
overlapping a server's. Each failed on the server before voices had owners. (``pipecat-veena
serve`` started on a voices file whose voice-map target was deleted: test_server_real.py's
serve-command test, in the same process as its drain.)"""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest
import pytest_asyncio
from server_fakes import RawClient
from speech import encode_clip, espeak

from pipecat_veena.codecs.bicodec.encoder import BiCodecSpeakerEncoder
from pipecat_veena.engine import EngineConfig, VeenaEngine, enrol_into_file, read_voices_file
from pipecat_veena.server import ServerHandle, ServerSettings, create_app

pytestmark = pytest.mark.vllm
VOICES = "/v1/audio/voices"
ALICE, BOB = {"Authorization": "Bearer alice-key"}, {"Authorization": "Bearer bob-key"}
KEYS = {"alice-key": "alice", "bob-key": "bob"}
CAP = 4


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> tuple[bytes, bytes]:
    """Two clips of about 10 s of espeak-ng speech (two voices) as WAV files."""
    tmp = tmp_path_factory.mktemp("clip")
    return tuple(
        encode_clip(espeak(tmp, voice, 160, 55, 2, rate=22050), 22050, "wav")
        for voice in ("en+f3", "en+m3")
    )


@pytest.fixture(scope="module")
def clip(clips) -> bytes:
    return clips[0]


@pytest_asyncio.fixture(scope="module")
async def real(spark_tiny_checkpoint, spark_generator, tmp_path_factory):
    """(engine, server, voices file): two API keys, a cap of ``CAP`` enrolled voices."""
    path = tmp_path_factory.mktemp("voices") / "voices.json"
    config = EngineConfig(
        checkpoint=spark_tiny_checkpoint, warmup=False, pin_voices=False, voices_file=path
    )
    engine = VeenaEngine(config, generator=spark_generator)
    await engine.start()
    settings = ServerSettings(api_keys=KEYS, max_enrolled_voices=CAP)
    handle = await ServerHandle(create_app(engine, settings, owns_engine=False)).start()
    try:
        await handle.state.wait_started()
        yield engine, handle, path
    finally:
        await handle.stop()
        await engine.shutdown()


def _form(clip: bytes, name: str, **fields: str) -> dict:
    return {"files": {"file": ("clip.wav", clip)}, "data": {"name": name, "consent": "true",
                                                              **fields}}  # fmt: skip


async def _speak(http: httpx.AsyncClient, voice: str, key: dict) -> httpx.Response:
    body = {"input": "Hello there.", "voice": voice, "response_format": "pcm", "seed": 1}
    return await http.post("/v1/audio/speech", json=body, headers=key)


async def test_a_voice_belongs_to_the_key_that_enrolled_it(real, clips) -> None:
    engine, server, path = real
    clip, other = clips
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
        made = await http.post(VOICES, **_form(clip, "asha"), headers=ALICE)
        assert made.status_code == 201, made.text
        codes = made.json()["global_tokens"]

        # bob: the voice does not exist for him, in every API
        listed = (await http.get(VOICES, headers=BOB)).json()
        assert "asha" not in listed["voices"] and listed["enrolled"] == listed["owned"] == []
        spoken = await _speak(http, "asha", BOB)
        nothing = await _speak(http, "nobody", BOB)
        assert spoken.status_code == nothing.status_code == 400
        assert spoken.json()["error"]["code"] == "unknown_voice"
        assert "asha" not in spoken.json()["error"]["message"].split("offers:")[1]
        gone = await http.delete(f"{VOICES}/asha", headers=BOB)
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "unknown_voice"
        async with RawClient.connect(server.ws_url, api_key="bob-key") as ws:  # the WebSocket
            assert "asha" not in ws.ready.voices
            await ws.send({"type": "speak", "id": "u1", "text": "Hello.", "voice": "asha"})
            _, ended = await ws.until_end("u1")
            assert ended.code == "unknown_voice"
        async with RawClient.connect(server.ws_url, api_key="alice-key") as ws:
            assert "asha" in ws.ready.voices
        taken = await http.post(VOICES, **_form(other, "asha", replace="true"), headers=BOB)
        assert taken.status_code == 409 and taken.json()["error"]["code"] == "voice_name_taken"

        # alice: hers, listed as owned; re-enrolling needs replace=true, also with spaces
        mine = (await http.get(VOICES, headers=ALICE)).json()
        assert mine["owned"] == mine["enrolled"] == ["asha"] and "asha" in mine["voices"]
        again = await http.post(VOICES, **_form(other, "asha  "), headers=ALICE)
        assert again.status_code == 409 and "replace=true" in again.json()["error"]["message"]
        assert read_voices_file(path)["enrolled"]["asha"]["globals"] == codes
        assert (await _speak(http, "asha", ALICE)).status_code == 200
        replaced = await http.post(VOICES, **_form(other, "asha", replace="true"), headers=ALICE)
        assert replaced.status_code == 201, replaced.text
        assert replaced.json()["global_tokens"] != codes
        assert (await http.delete(f"{VOICES}/asha", headers=ALICE)).status_code == 200
    stored = json.dumps(read_voices_file(path))
    assert "alice-key" not in stored and "bob-key" not in stored  # fingerprints only


async def test_openai_and_built_in_names_cannot_be_enrolled(real, clip) -> None:
    engine, server, _ = real
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
        for name in ("alloy", "Nova", "female"):
            refused = await http.post(VOICES, **_form(clip, name), headers=ALICE)
            assert refused.status_code == 409, (name, refused.text)
            assert refused.json()["error"]["code"] == "voice_name_taken"
        assert "alloy" not in engine.enrolled_voices
        assert (await _speak(http, "alloy", BOB)).status_code == 200  # the OpenAI alias still


async def test_a_shared_voice_is_usable_by_every_key_and_removed_by_its_owner(real, clip) -> None:
    engine, server, _ = real
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
        made = await http.post(VOICES, **_form(clip, "house"), headers=ALICE)
        assert made.status_code == 201
        await asyncio.to_thread(engine.share_voice, "house")  # what `voices share` does
        listed = (await http.get(VOICES, headers=BOB)).json()
        assert listed["shared"] == ["house"] and listed["owned"] == []
        assert (await _speak(http, "house", BOB)).status_code == 200
        refused = await http.delete(f"{VOICES}/house", headers=BOB)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "voice_not_owned"
        assert (await http.delete(f"{VOICES}/house", headers=ALICE)).status_code == 200


async def test_the_cap_on_enrolled_voices(real, clip) -> None:
    engine, server, _ = real
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
        room = CAP - len(engine.enrolled_voices)
        names = [f"cap{i}" for i in range(room)]
        for name in names:
            assert (await http.post(VOICES, **_form(clip, name), headers=BOB)).status_code == 201
        full = await http.post(VOICES, **_form(clip, "onemore"), headers=BOB)
        assert full.status_code == 409 and full.json()["error"]["code"] == "too_many_voices"
        assert "--max-enrolled-voices" in full.json()["error"]["message"]
        for name in names:
            assert (await http.delete(f"{VOICES}/{name}", headers=BOB)).status_code == 200


async def test_cli_enrolment_overlapping_a_server_enrolment_loses_neither(
    real, clip, spark_tiny_checkpoint, tmp_path, monkeypatch
) -> None:
    """The CLI reads the file, encodes its clip (seconds on a real checkpoint), writes: a
    server enrolment made while it encodes must survive its write."""
    engine, server, path = real
    encoding, go_on = threading.Event(), threading.Event()
    tokenize = BiCodecSpeakerEncoder.tokenize

    def paused(self, wav):  # the CLI's encoding, held until the server has enrolled
        encoding.set()
        assert go_on.wait(60)
        return tokenize(self, wav)

    monkeypatch.setattr(BiCodecSpeakerEncoder, "tokenize", paused)
    samples = espeak(tmp_path, "en+m3", 150, 40, 2, rate=16000)
    cli = asyncio.ensure_future(asyncio.to_thread(
        enrol_into_file, spark_tiny_checkpoint, path, "from-cli", samples, 16000))  # fmt: skip
    try:
        assert await asyncio.to_thread(encoding.wait, 60)
        monkeypatch.setattr(BiCodecSpeakerEncoder, "tokenize", tokenize)  # the server's own
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as http:
            made = await http.post(VOICES, **_form(clip, "from-server"), headers=ALICE)
            assert made.status_code == 201, made.text
    finally:
        go_on.set()
        await cli
    assert {"from-cli", "from-server"} <= set(read_voices_file(path)["enrolled"])
    engine.refresh_voices(now=True)  # hands the reload to a worker thread
    for _ in range(100):
        if {"from-cli", "from-server"} <= set(engine.enrolled_voices):
            break
        await asyncio.sleep(0.05)
    assert {"from-cli", "from-server"} <= set(engine.enrolled_voices)
    await asyncio.to_thread(engine.remove_voice, "from-cli")
    await asyncio.to_thread(engine.remove_voice, "from-server")
