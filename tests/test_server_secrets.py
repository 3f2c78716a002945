"""Secrets and what errors reveal: no API key in any log line at any level, no traceback that
prints variables, no internal exception text sent to clients, no open API docs on a keyed
server, and client-caused events logged as one line. Over the fake engine and real sockets; the
same through ``pipecat-veena serve`` on the real engine is in test_server_real.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap

import httpx
import pytest
from loguru import logger
from server_fakes import (
    ROOT,
    FakeSpeechEngine,
    RawClient,
    cut_off_body,
    send_invalid_utf8,
    until,
)

from pipecat_veena.errors import GenerationError
from pipecat_veena.remote.protocol import ErrorCode
from pipecat_veena.server import ServerHandle, ServerSettings, create_app

KEY = "sk-veena-7f3a9c0d2b1e"
#: Text of an unexpected engine error: the server's log keeps it, clients never see it.
INTERNAL_DETAIL = "cuda context lost at /srv/models/private-checkpoint"
#: loguru's diagnose mode draws these under a traceback line to show each variable's value.
VARIABLE_MARKS = ("│ ", "└ ")


#: uvicorn's loggers that its default log config stops from propagating.
_UVICORN = ("uvicorn", "uvicorn.access")


class _Captured:
    """Every log line at every level: a loguru sink with loguru's defaults (what a program that
    embeds ``create_app`` has, ``diagnose`` on) and a stdlib handler for uvicorn's loggers."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.std: list[logging.LogRecord] = []

    def __enter__(self) -> _Captured:
        self._sink = logger.add(self.lines.append, level="TRACE")
        self._handler = _Records(self.std)
        root = logging.getLogger()
        self._level = root.level
        root.addHandler(self._handler)
        root.setLevel(1)
        # uvicorn's default log config (any uvicorn.Config an earlier test or library made in
        # this process) stops its loggers propagating to the root: let them, while capturing.
        self._propagate = {name: logging.getLogger(name).propagate for name in _UVICORN}
        for name in _UVICORN:
            logging.getLogger(name).propagate = True
        return self

    def __exit__(self, *exc: object) -> None:
        logger.remove(self._sink)
        root = logging.getLogger()
        root.removeHandler(self._handler)
        root.setLevel(self._level)
        for name, propagate in self._propagate.items():
            logging.getLogger(name).propagate = propagate

    @property
    def text(self) -> str:
        formatter = logging.Formatter("%(levelname)s %(name)s %(message)s")
        return "".join(self.lines) + "\n".join(formatter.format(r) for r in self.std)


#: The test's own clients log too (the URL they dial, at DEBUG): not the server's log.
_CLIENT_LOGGERS = ("websockets.client", "httpx", "httpcore")


class _Records(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__(level=1)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(_CLIENT_LOGGERS):
            return
        self.format(record)  # renders the message and traceback now, as a real handler does
        self.records.append(record)


async def _served(engine, settings: ServerSettings) -> ServerHandle:
    app = create_app(engine, settings, owns_engine=False)
    return await ServerHandle(app, log_level="trace").start()


def test_settings_print_key_names_never_keys():
    settings = ServerSettings(api_keys={KEY: "alice", "sk-other-1234": "bob"})
    for text in (repr(settings), str(settings), repr(settings.api_keys), f"{settings!r}"):
        assert KEY not in text and "sk-other" not in text and "alice" in text, text
    assert dict(settings.api_keys) == {KEY: "alice", "sk-other-1234": "bob"}
    assert settings == ServerSettings(api_keys={KEY: "alice", "sk-other-1234": "bob"})


async def test_no_error_path_writes_a_key_or_a_variable_to_the_log():
    """Keys configured, the WebSocket keyed by ``?api_key=`` (as browsers do), uvicorn at trace:
    internal errors and generation failures on both APIs (before and after first audio), bad
    keys, disconnects mid-utterance and mid-body, invalid UTF-8. The key appears nowhere, no
    traceback shows variables, the internal error's detail is logged but not sent, and what
    clients caused is not an ERROR."""
    engine = FakeSpeechEngine(chunks=4, delay=0.01, fail_at=1, failures=0)
    settings = ServerSettings(api_keys={KEY: "alice"})
    bearer = {"Authorization": f"Bearer {KEY}"}
    told: list[str] = []  # what clients were told about the failures
    with _Captured() as log:
        handle = await _served(engine, settings)
        try:
            await handle.state.wait_started()
            keyed_ws = f"{handle.ws_url}?api_key={KEY}"
            async with (
                RawClient.connect(keyed_ws) as client,
                httpx.AsyncClient(base_url=handle.url, headers=bearer) as http,
            ):
                for error, code in (
                    (RuntimeError(INTERNAL_DETAIL), ErrorCode.INTERNAL),
                    (GenerationError(f"vLLM: {INTERNAL_DETAIL}"), ErrorCode.GENERATION_FAILED),
                ):
                    engine.error, engine.failures = error, len(engine.calls) + 4
                    for fail_at in (0, 1):  # before and after the first audio
                        engine.fail_at = fail_at
                        uid = f"{code}-{fail_at}"
                        await client.send({"type": "speak", "id": uid, "text": "Hello there."})
                        _, end = await client.until_end(uid)
                        assert end.code == code, end
                        told.append(end.message)
                    engine.fail_at = 0
                    r = await http.post("/v1/audio/speech", json={"input": "Hello there."})
                    body = r.json()["error"]
                    assert r.status_code == 500 and body["code"] == code, r.text
                    told.append(body["message"])
                    engine.fail_at = 1
                    lines = []
                    sse = {"input": "Hello.", "stream_format": "sse"}
                    with contextlib.suppress(httpx.RemoteProtocolError):  # (aborted transfer)
                        async with http.stream("POST", "/v1/audio/speech", json=sse) as r:
                            async for line in r.aiter_lines():
                                lines.append(line)
                    event = json.loads([x for x in lines if x.startswith("data: ")][-1][6:])
                    assert event["error"]["code"] == code, event
                    told.append(event["error"]["message"])
                engine.failures = 0
                # a client that leaves mid-utterance
                async with RawClient.connect(keyed_ws) as leaving:
                    await leaving.send({"type": "speak", "id": "gone", "text": "Hello there."})
                    await leaving.recv()
            # bad keys, in the header and in the URL
            async with httpx.AsyncClient(base_url=handle.url) as http:
                r = await http.post(
                    "/v1/audio/speech",
                    headers={"Authorization": f"Bearer {KEY}-wrong"},
                    json={"input": "Hi."},
                )
                assert r.status_code == 401
            async with RawClient.connect(f"{keyed_ws}-wrong", ready=False) as refused:
                assert (await refused.recv()).code == ErrorCode.UNAUTHORIZED
            # a request body cut off, an invalid UTF-8 text frame
            await cut_off_body(handle.port, bearer)
            await send_invalid_utf8(handle.port, f"/v1/audio/stream?api_key={KEY}")
            await until(lambda: handle.state.slots.active == 0 and not engine.open)
            # (wait until the server noticed the cut-off body, however it logs it)
            await until(lambda: "ClientDisconnect" in log.text or "whole request body" in log.text)
        finally:
            await handle.stop()
    text = log.text
    assert "api_key=<redacted>" in text  # uvicorn did log the URL (at INFO)
    leaks = [line for line in text.splitlines() if KEY in line]
    assert not leaks, f"the key is in the log {text.count(KEY)} times: {leaks}"
    assert not [m for m in VARIABLE_MARKS if m in text], "a traceback printed variables"
    assert text.count(INTERNAL_DETAIL) >= 6 and "Traceback" in text  # the operator's detail
    assert len(told) == 8 and not [m for m in told if INTERNAL_DETAIL in m], told
    assert all("(request " in m for m in told), told  # the id to find the detail by
    errors = [r for r in log.std if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    assert "Invalid UTF-8" in text and "ClientDisconnect" not in text


async def test_a_failed_start_tells_clients_and_probes_no_detail():
    class _Broken(FakeSpeechEngine):
        async def start(self) -> None:
            raise RuntimeError(INTERNAL_DETAIL)

    settings = ServerSettings(api_keys={KEY: "alice"})
    with _Captured() as log:
        handle = await _served(_Broken(), settings)
        try:
            await asyncio.gather(handle.state.wait_started(), return_exceptions=True)
            async with httpx.AsyncClient(base_url=handle.url) as http:
                health = await http.get("/health")
                speech = await http.post(
                    "/v1/audio/speech",
                    headers={"Authorization": f"Bearer {KEY}"},
                    json={"input": "Hi."},
                )
            async with RawClient.connect(f"{handle.ws_url}?api_key={KEY}", ready=False) as c:
                refused = await c.recv()
        finally:
            await handle.stop()
    assert health.status_code == 503 and speech.status_code == 503
    assert refused.code == speech.json()["error"]["code"] == ErrorCode.ENGINE_UNAVAILABLE
    for told in (health.json()["detail"], speech.json()["error"]["message"], refused.message):
        assert "failed to start" in told and INTERNAL_DETAIL not in told, told
    assert INTERNAL_DETAIL in log.text and KEY not in log.text
    assert handle.state.failed and INTERNAL_DETAIL in handle.state.failed  # for the CLI


@pytest.mark.parametrize("keyed", [False, True])
async def test_api_docs_are_off_when_the_server_has_keys(keyed):
    settings = ServerSettings(api_keys={KEY: "alice"} if keyed else {})
    handle = await _served(FakeSpeechEngine(), settings)
    try:
        async with httpx.AsyncClient(base_url=handle.url) as http:
            for path in ("/docs", "/redoc", "/openapi.json"):
                assert (await http.get(path)).status_code == (404 if keyed else 200), path
                assert (await http.get(path, params={"api_key": KEY})).status_code in (200, 404)
    finally:
        await handle.stop()


_SERVE_FAKE = textwrap.dedent(
    """
    import asyncio, sys
    from server_fakes import FakeSpeechEngine
    from pipecat_veena.server import ServerHandle, ServerSettings, create_app
    from pipecat_veena.server.runner import serve_until_signalled

    settings = ServerSettings(api_keys={sys.argv[2]: "alice"}, drain_timeout_s=60)
    app = create_app(FakeSpeechEngine(endless=True, delay=0.02), settings)
    handle = ServerHandle(app, port=int(sys.argv[1]), log_level="info", configure_logging=True)
    ready = lambda: print("READY", flush=True)
    sys.exit(asyncio.run(serve_until_signalled(handle, on_ready=ready)))
    """
)


async def test_a_second_signal_ends_the_server_without_an_error_traceback(tmp_path):
    """SIGTERM drains; a second one cancels what is left: the app still shuts down (its
    lifespan ends), and nothing is logged as an ERROR."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "serve.log"
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _SERVE_FAKE, str(port), KEY,
        stdout=out.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        await until(lambda: "READY" in out.read_text(), wait_s=60)
        async with RawClient.connect(f"ws://127.0.0.1:{port}/v1/audio/stream?api_key={KEY}") as c:
            await c.send({"type": "speak", "id": "long", "text": "Hello there."})
            await c.recv()
            proc.send_signal(signal.SIGTERM)
            await until(lambda: "draining" in out.read_text())
            proc.send_signal(signal.SIGTERM)
            assert await c.closed() in (1000, 1001, 1006, 1012)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = out.read_text()
    assert "second signal" in text and "Application shutdown complete" in text, text
    assert "ERROR" not in text and "Traceback" not in text, text
    assert KEY not in text and "api_key=<redacted>" in text, text
