"""The examples import (optional transports stay optional) and expose what their README says."""

import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["wav_bot", "twilio_bot", "daily_bot", "webrtc_bot"])
def test_example_imports(name):
    module = _load(name)
    assert module.__doc__


def test_twilio_app_routes_and_rate():
    module = _load("twilio_bot")
    paths = {route.path for route in module.app.routes}
    assert {"/", "/ws"} <= paths
    assert module.TWILIO_RATE == 8000


async def test_twilio_twiml_points_at_the_websocket():
    from starlette.requests import Request

    module = _load("twilio_bot")
    scope = {"type": "http", "method": "POST", "path": "/", "headers": [(b"host", b"bot.example")]}
    response = await module.twiml(Request(scope))
    assert b'<Stream url="wss://bot.example/ws">' in response.body


def test_webrtc_app_routes(tmp_path):
    module = _load("webrtc_bot")
    app = module.create_app(tmp_path)  # the engine only starts in the lifespan
    paths = {route.path for route in app.routes}
    assert {"/start", "/api/offer", "/sessions/{session_id}/api/offer", "/"} <= paths
    assert app.routes[-1].path == "/client"  # Pipecat's prebuilt client
    assert module.CLIENT_PAGE.is_file()


async def test_webrtc_replies_speak_typed_text_and_answer_turns():
    from pipecat.frames.frames import TTSSpeakFrame, VADUserStoppedSpeakingFrame
    from pipecat.processors.frameworks.rtvi.frames import RTVISendTextFrame
    from pipecat.tests.utils import run_test

    module = _load("webrtc_bot")
    frames = [
        RTVISendTextFrame(msg_id="1", text="नमस्ते"),
        RTVISendTextFrame(msg_id="2", text="  "),
        VADUserStoppedSpeakingFrame(),
    ]
    down, _ = await run_test(module.TextReplies(answer="ok"), frames_to_send=frames)
    spoken = [f.text for f in down if isinstance(f, TTSSpeakFrame)]
    assert spoken == ["नमस्ते", "ok"]
    down, _ = await run_test(module.TextReplies(answer=""), frames_to_send=frames[2:])
    assert not [f for f in down if isinstance(f, TTSSpeakFrame)]


def test_say_result_summary_without_audio_does_not_crash():
    from pipecat_veena.wav_sink import SayResult

    empty = SayResult(Path("call0.wav"), 16000, 0.0, None, None, errors=["engine died"])
    assert empty.summary() == "call0.wav: no audio was produced: engine died"
    full = SayResult(Path("call1.wav"), 8000, 2.0, 0.25, 1.0)
    assert "first audio after 250 ms" in full.summary() and "0.50" in full.summary()


async def test_twilio_bot_answers_each_spoken_turn():
    from pipecat.frames.frames import TTSSpeakFrame, VADUserStoppedSpeakingFrame
    from pipecat.tests.utils import run_test

    module = _load("twilio_bot")
    down, _ = await run_test(
        module.CannedAnswer("Got it."),
        frames_to_send=[VADUserStoppedSpeakingFrame(), VADUserStoppedSpeakingFrame()],
    )
    spoken = [f.text for f in down if isinstance(f, TTSSpeakFrame)]
    assert spoken == ["Got it.", "Got it."]


@pytest.mark.parametrize("name", ["twilio_bot", "daily_bot"])
def test_bots_take_a_speech_server_url(name, monkeypatch):
    from pipecat_veena.remote import RemoteVeenaEngine

    monkeypatch.setenv("VEENA_SERVER_URL", "http://tts-host:8000")
    monkeypatch.setenv("VEENA_API_KEY", "k")
    engine = _load(name).make_engine()
    assert isinstance(engine, RemoteVeenaEngine)
    assert engine.model_name == "tts-host:8000" and not engine.is_running
