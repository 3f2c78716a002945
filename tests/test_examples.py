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


@pytest.mark.parametrize("name", ["wav_bot", "twilio_bot", "daily_bot"])
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


@pytest.mark.parametrize("name", ["twilio_bot", "daily_bot"])
def test_bots_take_a_speech_server_url(name, monkeypatch):
    from pipecat_veena.remote import RemoteVeenaEngine

    monkeypatch.setenv("VEENA_SERVER_URL", "http://tts-host:8000")
    monkeypatch.setenv("VEENA_API_KEY", "k")
    engine = _load(name).make_engine()
    assert isinstance(engine, RemoteVeenaEngine)
    assert engine.model_name == "tts-host:8000" and not engine.is_running
