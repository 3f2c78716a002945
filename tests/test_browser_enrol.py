"""The playground's "Record or upload a voice" in a real headless Chromium, against a real server
(real sockets) over a VeenaEngine with a scripted generator and the tiny random BiCodec
checkpoint's real speaker encoder: an espeak-ng clip uploaded through the file input (consent
required), and a recording from the browser's (fake) microphone through getUserMedia and
MediaRecorder, decoded by the server."""

from __future__ import annotations

from pathlib import Path

import pytest
from browser import console_errors, open_page
from server_fakes import serving
from speech import SENTENCE, espeak_wav
from test_browser_playground import open_playground
from test_enrolment import _bicodec_checkpoint, _engine

pytestmark = pytest.mark.browser


async def _message(page) -> str:
    """What the voice section says (its result line: enrol, delete, recording)."""
    return await page.evaluate("() => window.playground.enrolResult?.text || ''")


async def test_upload_and_record_a_voice_in_the_playground(chromium, tmp_path: Path) -> None:
    engine, _ = await _engine(_bicodec_checkpoint(tmp_path / "ckpt"))
    clip = espeak_wav(tmp_path / "asha.wav", SENTENCE * 2, voice="en+f3", wpm=160)
    try:
        async with serving(engine) as server, open_page(chromium) as browser_page:
            page = browser_page.page
            await open_playground(page, server.url)
            await page.click("#enrol summary")
            await page.set_input_files("#clip", str(clip))
            await page.fill("#voice-name", "Asha")
            await page.click("#enrol-button")  # no consent yet: refused in the page
            assert "consent" in await _message(page)
            assert engine.enrolled_voices == []

            await page.check("#consent")
            await page.click("#enrol-button")
            await page.wait_for_function("() => window.playground.enrolled === 'asha'")
            assert engine.enrolled_voices == ["asha"]
            assert await page.input_value("#voice") == "asha"  # selected for Speak
            assert "asha" in await page.inner_text("#voice")

            # the microphone: Chromium's fake device (a tone with beeps) through MediaRecorder
            await page.set_input_files("#clip", [])
            await page.click("#record")
            await page.wait_for_function("() => document.querySelector('#recording')"
                                         ".textContent.startsWith('recording')")  # fmt: skip
            await page.wait_for_timeout(4500)
            await page.click("#record")
            await page.wait_for_function(
                "() => document.querySelector('#recording').textContent.startsWith('recorded')"
            )
            await page.fill("#voice-name", "mic")
            await page.click("#enrol-button")
            await page.wait_for_function(
                '() => /"mic" enrolled|Not enrolled/.test(window.playground.enrolResult?.text)'
            )
            message = await _message(page)
            # the server decoded the browser's recording (WebM/Ogg Opus): it enrolled it, or
            # judged the fake device's beeps as a clip; never "not audio" or "codec"
            assert "not_audio" not in message and "unsupported_codec" not in message, message
            assert message.startswith('Voice "mic" enrolled') or "bad_voice_clip" in message
            print(f"the fake microphone's recording: {message}")
            refused = "Failed to load resource: the server responded with a status of 422"
            assert not [e for e in console_errors(browser_page) if refused not in e]
    finally:
        await engine.shutdown()
