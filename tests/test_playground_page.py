"""The playground's files as the server serves them (no browser): routes, CSP, assets, voices.

The page in a real browser is tested in test_browser_playground.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
from server_fakes import FakeSpeechEngine

from pipecat_veena.demo import is_demo_checkpoint
from pipecat_veena.server import ServerHandle, ServerSettings, create_app
from pipecat_veena.server.playground import ASSETS_PATH, STATIC_DIR

PAGE_FILES = {"index.html", "playground.js", "player-worklet.js", "playground.css", "favicon.svg"}


async def _serve(engine, settings=None, *, demo=False) -> ServerHandle:
    handle = await ServerHandle(create_app(engine, settings, demo=demo)).start()
    await handle.state.wait_started()
    return handle


async def test_page_and_its_files_are_served_from_the_server_alone():
    handle = await _serve(FakeSpeechEngine())
    try:
        async with httpx.AsyncClient(base_url=handle.url) as http:
            page = await http.get("/")
            assert page.status_code == 200
            assert page.headers["content-type"].startswith("text/html")
            csp = page.headers["content-security-policy"]
            assert "default-src 'self'" in csp and "connect-src 'self'" in csp
            linked = re.findall(r'(?:src|href)="([^"]+)"', page.text)
            assert sorted(linked) == [
                f"{ASSETS_PATH}/favicon.svg",
                f"{ASSETS_PATH}/playground.css",
                f"{ASSETS_PATH}/playground.js",
            ]
            for name in ("playground.js", "player-worklet.js"):
                asset = await http.get(f"{ASSETS_PATH}/{name}")
                assert asset.status_code == 200
                assert "javascript" in asset.headers["content-type"]
                assert asset.text == (STATIC_DIR / name).read_text(encoding="utf-8")
            assert (await http.get(f"{ASSETS_PATH}/playground.css")).status_code == 200
            assert (await http.get(f"{ASSETS_PATH}/missing.js")).status_code == 404
    finally:
        await handle.stop()


def test_page_names_no_other_origin():
    assert {p.name for p in STATIC_DIR.iterdir()} == PAGE_FILES
    for path in STATIC_DIR.iterdir():
        # (SVG's namespace is a name, never fetched)
        text = path.read_text(encoding="utf-8").replace('xmlns="http://www.w3.org/2000/svg"', "")
        assert not re.search(r"https?://|wss?://|//[a-z0-9.-]+\.[a-z]{2,}/", text), path.name
    script = (STATIC_DIR / "playground.js").read_text(encoding="utf-8")
    assert f'"{ASSETS_PATH}/player-worklet.js"' in script


async def test_voices_say_model_and_demo_and_the_page_needs_no_key():
    keyed = ServerSettings(api_keys={"k1": "tester"})
    for demo in (False, True):
        handle = await _serve(FakeSpeechEngine(), keyed, demo=demo)
        try:
            async with httpx.AsyncClient(base_url=handle.url) as http:
                assert (await http.get("/")).status_code == 200
                assert (await http.get(f"{ASSETS_PATH}/playground.js")).status_code == 200
                refused = await http.get("/v1/audio/voices")
                assert refused.status_code == 401
                assert refused.json()["error"]["code"] == "unauthorized"
                voices = await http.get("/v1/audio/voices", headers={"Authorization": "Bearer k1"})
                body = voices.json()
                assert body["demo"] is demo and body["model"] == "fake-veena"
                assert body["voices"] == ["female", "male"] and body["default"] == "female"
        finally:
            await handle.stop()


def test_is_demo_checkpoint(spark_tiny_checkpoint: Path, tmp_path: Path):
    assert is_demo_checkpoint(spark_tiny_checkpoint)
    assert not is_demo_checkpoint(tmp_path)
    marker = tmp_path / "demo.json"
    for content in ("not json", json.dumps(["spark"]), json.dumps({"name": "my-model"})):
        marker.write_text(content)
        assert not is_demo_checkpoint(tmp_path)
    marker.write_text(json.dumps({"name": "veena"}))
    assert is_demo_checkpoint(tmp_path)
