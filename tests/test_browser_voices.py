"""The playground as a first-time user meets it, in a real headless Chromium (issue 37 item 6).

Against a real server (real sockets): for voices, a VeenaEngine with a scripted generator and the
tiny random BiCodec checkpoint's real speaker encoder (as test_browser_enrol.py); for speech, the
fake engines of server_fakes.py (the real engine's page checks are in test_browser_playground.py).

- one's own voices are listed with a Delete control; the list follows a delete, a delete the
  server refused, and a refused key (which shows none of the voices of the key before);
- a success looks unlike an error; the enrol result is in view at 375 px (screenshot:
  artifacts/browser/enrol-375.png);
- no errno, FFmpeg or browser exception text in what the page says;
- re-enrolling one of one's own names asks first, and only then sends ``replace=true``;
- after Stop the state says "stopped", also when all the audio had come and was still playing;
- which of a recording and a chosen file Enrol sends is shown, and can be switched;
- the word being played is highlighted through emoji, blank lines and decomposed accents.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser import ARTIFACTS, console_errors, open_page
from server_fakes import RATE, FakeSpeechEngine, serving
from speech import SENTENCE, espeak_wav
from test_browser_playground import open_playground, speak, wait_for_end
from test_enrolment import _bicodec_checkpoint, _engine

from pipecat_veena.server import ServerSettings
from pipecat_veena.timing import split_words

pytestmark = pytest.mark.browser

KEYS = {"key-a": "alice", "key-b": "bob"}
#: What a message shown to a user must never hold (errno, FFmpeg, a browser's exception text).
INTERNALS = re.compile(
    r"errno|ffmpeg|avformat|libav|invalid data found|traceback|typeerror|failed to fetch|"
    r"networkerror|domexception|\[Errno",
    re.I,
)


async def result(page: Any) -> dict[str, str]:
    """What the voice section says: {text, kind}."""
    return await page.evaluate("() => window.playground.enrolResult || {text: '', kind: ''}")


async def wait_result(page: Any, pattern: str) -> dict[str, str]:
    await page.wait_for_function(
        "(p) => new RegExp(p).test(window.playground.enrolResult?.text || '')",
        arg=pattern,
        timeout=60_000,
    )
    return await result(page)


async def use_key(page: Any, key: str) -> None:
    await page.fill("#key", key)
    await page.locator("#key").blur()


async def owned_in_page(page: Any) -> list[str]:
    """The voices listed under "Your voices" (each with its Delete button)."""
    return await page.eval_on_selector_all(
        "#owned button.delete", "b => b.map(e => e.dataset.voice)"
    )


async def voice_options(page: Any) -> list[str]:
    return await page.eval_on_selector_all("#voice option", "o => o.map(e => e.value)")


async def shown_texts(page: Any) -> str:
    return await page.evaluate(
        "() => [document.querySelector('#message').textContent,"
        " document.querySelector('#enrol-result').textContent].join(' | ')"
    )


async def background(page: Any, selector: str) -> str:
    return await page.eval_on_selector(selector, "e => getComputedStyle(e).backgroundColor")


@pytest.fixture
async def voices_server(tmp_path: Path):
    """(server, engine, clip): a keyed real server over an engine that enrols voices."""
    engine, _ = await _engine(_bicodec_checkpoint(tmp_path / "ckpt"))
    clip = espeak_wav(tmp_path / "asha.wav", SENTENCE * 2, voice="en+f3", wpm=160)
    try:
        async with serving(engine, ServerSettings(api_keys=KEYS)) as server:
            yield server, engine, clip
    finally:
        await engine.shutdown()


async def test_own_voices_enrol_replace_delete_and_a_refused_key(chromium, voices_server):
    server, engine, clip = voices_server
    async with open_page(chromium) as browser_page:
        page = browser_page.page
        await page.set_viewport_size({"width": 375, "height": 740})  # a phone
        posts: list[bytes] = []
        page.on(
            "request",
            lambda r: r.method == "POST" and r.url.endswith("/v1/audio/voices")
            and posts.append(r.post_data_buffer or b""),
        )  # fmt: skip
        await open_playground(page, server.url, expect_voices=False)
        await use_key(page, "key-a")
        await page.wait_for_function("() => window.playground.ready !== null")
        await page.click("#enrol summary")
        assert await owned_in_page(page) == [] and await page.is_visible("#no-voices")

        await page.set_input_files("#clip", str(clip))
        await page.fill("#voice-name", "Asha")
        await page.click("#enrol-button")  # no consent: an error
        error = await result(page)
        assert error["kind"] == "error" and "consent" in error["text"]
        error_bg = await background(page, "#enrol-result")

        await page.check("#consent")
        await page.click("#enrol-button")
        done = await wait_result(page, 'Voice "asha" enrolled')
        assert done["kind"] == "success"
        assert await background(page, "#enrol-result") != error_bg  # a success looks different
        tick = "e => getComputedStyle(e, '::before').content"
        assert (await page.eval_on_selector("#enrol-result", tick)).startswith('"✓')
        # in view on a 375 px screen, nothing wider than it
        box = await page.eval_on_selector(
            "#enrol-result", "e => e.getBoundingClientRect().toJSON()"
        )
        assert box["top"] >= 0 and box["bottom"] <= 740 and box["right"] <= 375, box
        assert await page.evaluate("() => document.documentElement.scrollWidth") <= 375
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(ARTIFACTS / "enrol-375.png"))
        assert await owned_in_page(page) == ["asha"] and await page.is_hidden("#no-voices")
        assert "asha (yours)" in await page.inner_text("#voice")
        assert engine.enrolled_voices == ["asha"] and len(posts) == 1

        # Re-enrolling one's own name asks first: "no" sends nothing, "yes" sends replace=true.
        dialogs: list[str] = []

        def answer(accept: bool):
            async def on_dialog(dialog):
                dialogs.append(dialog.message)
                await (dialog.accept() if accept else dialog.dismiss())

            return on_dialog

        page.once("dialog", answer(False))
        await page.click("#enrol-button")
        kept = await wait_result(page, "Kept your voice")
        assert kept["kind"] == "info" and len(posts) == 1
        assert "already have a voice" in dialogs[-1] and "Replace" in dialogs[-1]
        page.once("dialog", answer(True))
        await page.click("#enrol-button")
        assert (await wait_result(page, 'Voice "asha" replaced'))["kind"] == "success"
        assert len(posts) == 2 and b'name="replace"\r\n\r\ntrue' in posts[1]
        assert b'name="replace"' not in posts[0]

        # Delete asks, deletes, and the lists follow.
        page.once("dialog", answer(True))
        await page.click("#owned button.delete[data-voice='asha']")
        assert (await wait_result(page, 'Voice "asha" deleted'))["kind"] == "success"
        assert "Delete your voice" in dialogs[-1]
        assert engine.enrolled_voices == [] and await owned_in_page(page) == []
        assert "asha" not in await voice_options(page)

        # A delete the server refuses (the voice went meanwhile): said, and the list refreshed.
        await page.set_input_files("#clip", str(clip))
        await page.fill("#voice-name", "meera")
        await page.click("#enrol-button")
        await wait_result(page, 'Voice "meera" enrolled')
        async with httpx.AsyncClient(base_url=server.url) as http:
            gone = await http.delete(
                "/v1/audio/voices/meera", headers={"Authorization": "Bearer key-a"}
            )
        assert gone.status_code == 200
        assert await owned_in_page(page) == ["meera"]  # (the page does not know yet)
        page.once("dialog", answer(True))
        await page.click("#owned button.delete[data-voice='meera']")
        refused = await wait_result(page, "Not deleted")
        assert refused["kind"] == "error" and "unknown_voice" in refused["text"]
        assert await owned_in_page(page) == [] and "meera" not in await voice_options(page)

        # A refused key shows none of the voices of the key before; another key not A's voices.
        await page.fill("#voice-name", "Asha")
        await page.click("#enrol-button")
        await wait_result(page, 'Voice "asha" enrolled')
        await use_key(page, "not-a-key")
        await page.wait_for_function("() => window.playground.connection === 'key_refused'")
        assert await voice_options(page) == [] and await owned_in_page(page) == []
        await use_key(page, "key-b")
        await page.wait_for_function("() => window.playground.ready !== null")
        assert "asha" not in await voice_options(page) and await owned_in_page(page) == []
        assert await voice_options(page) == engine.voices[: len(await voice_options(page))]
        assert not INTERNALS.search(await shown_texts(page))
        allowed = "the server responded with a status of"  # (Chromium logs each 4xx)
        assert not [e for e in console_errors(browser_page) if allowed not in e]


async def test_messages_hold_no_errno_ffmpeg_or_browser_internals(
    chromium, voices_server, tmp_path
):
    """A file that is not audio, a truncated one, an answer that is not the server's JSON, and
    a connection that fails: the page says what happened in words, never the internals."""
    server, engine, clip = voices_server
    garbage = tmp_path / "notes.mp3"
    garbage.write_bytes(b"ID3\x03\x00\x00\x00\x00\x00\x00" + bytes(range(256)) * 40)
    truncated = tmp_path / "cut.wav"
    truncated.write_bytes(clip.read_bytes()[:60])
    async with open_page(chromium) as browser_page:
        page = browser_page.page
        await open_playground(page, server.url, expect_voices=False)
        await use_key(page, "key-a")
        await page.wait_for_function("() => window.playground.ready !== null")
        await page.click("#enrol summary")
        await page.check("#consent")
        await page.fill("#voice-name", "asha")
        said = []
        for path in (garbage, truncated):
            await page.set_input_files("#clip", str(path))
            await page.click("#enrol-button")
            said.append(await wait_result(page, "Not enrolled"))

        await page.set_input_files("#clip", str(clip))

        async def not_json(route):
            await route.fulfill(
                status=500, content_type="text/plain",
                body="Traceback (most recent call last): av.error.InvalidDataError: [Errno "
                "1094995529] Invalid data found when processing input (avformat_open_input)",
            )  # fmt: skip

        await page.route("**/v1/audio/voices", not_json)
        await page.click("#enrol-button")
        said.append(await wait_result(page, "Not enrolled"))
        await page.unroute("**/v1/audio/voices")
        await page.route("**/v1/audio/voices", lambda route: route.abort("failed"))
        await page.click("#enrol-button")
        said.append(await wait_result(page, "did not reach the server"))
        await page.unroute("**/v1/audio/voices")
    print("what the page said:", *[s["text"] for s in said], sep="\n  ")
    assert all(s["kind"] == "error" for s in said)
    assert not [s for s in said if INTERNALS.search(s["text"])], said
    assert "HTTP 500" in said[2]["text"]
    assert engine.enrolled_voices == []


async def test_which_clip_enrol_sends_is_shown_and_can_be_switched(chromium, voices_server):
    server, engine, clip = voices_server
    async with open_page(chromium) as browser_page:
        page = browser_page.page
        sent: list[bytes] = []
        page.on(
            "request",
            lambda r: r.method == "POST" and sent.append(r.post_data_buffer or b""),
        )
        await open_playground(page, server.url, expect_voices=False)
        await use_key(page, "key-a")
        await page.wait_for_function("() => window.playground.ready !== null")
        await page.click("#enrol summary")
        source = "() => window.playground.source"
        assert await page.evaluate(source) is None
        assert await page.is_disabled("#use-recording") and await page.is_disabled("#use-file")

        await page.set_input_files("#clip", str(clip))
        assert await page.evaluate(source) == "file" and await page.is_checked("#use-file")
        assert "asha.wav" in await page.inner_text("#file-label")
        # a recording made after it is what goes, and says so
        await page.click("#record")
        await page.wait_for_timeout(1500)
        await page.click("#record")
        await page.wait_for_function(f"() => ({source[6:]}) === 'recording'")
        assert await page.is_checked("#use-recording") and not await page.is_checked("#use-file")
        assert re.search(
            r"the recording \(\d+ s, \d+ KB\)", await page.inner_text("#recording-label")
        )
        # the user picks the file again: that is sent
        await page.check("#use-file")
        assert await page.evaluate(source) == "file"
        await page.check("#consent")
        await page.fill("#voice-name", "asha")
        await page.click("#enrol-button")
        await wait_result(page, 'Voice "asha" enrolled|Not enrolled')
        assert len(sent) == 1 and b'filename="asha.wav"' in sent[0]
        await page.check("#use-recording")
        assert await page.evaluate(source) == "recording"
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(ARTIFACTS / "enrol-source.png"), full_page=True)


async def test_stop_says_stopped_when_all_audio_had_come(chromium):
    # 4 s of audio, all sent at once: the utterance is complete while most of it still plays
    engine = FakeSpeechEngine(chunks=8, chunk_samples=RATE // 2)
    async with serving(engine) as server, open_page(chromium) as browser_page:
        page = browser_page.page
        await open_playground(page, server.url)
        await speak(page, "All of it at once.")
        await page.wait_for_function(
            "() => { const u = window.playground.utterance;"
            " return u && u.state === 'completed' && u.playback === 'playing'; }"
        )
        assert await page.inner_text("#state") == "received, playing"
        await page.click("#stop")
        u = await wait_for_end(page, within=10)
        assert u["playback"] == "stopped" and u["played"] < u["samples"]
        assert await page.inner_text("#state") == "stopped"
        await page.wait_for_timeout(300)  # (no later report changes it)
        assert await page.inner_text("#state") == "stopped"


HIGHLIGHTED = "Hi 👋 there!\n\nCafe\u0301 is open 😀😀 today.\n\n\nनमस्ते 🙏🏽 दोस्तों।"


async def test_words_are_highlighted_through_emoji_blank_lines_and_accents(chromium):
    """Each word the server timed gets its span in the transcript, and each is highlighted in
    turn: before offset_utf16, every emoji put the page's slice one further off and it stopped
    highlighting at the first word after one."""
    words = split_words(HIGHLIGHTED)
    engine = FakeSpeechEngine(
        chunks=len(words), chunk_samples=round(0.35 * RATE), words=True, delay=0.05
    )
    async with serving(engine) as server, open_page(chromium) as browser_page:
        page = browser_page.page
        await open_playground(page, server.url)
        await speak(page, HIGHLIGHTED)
        u = await wait_for_end(page, within=30)
        spans = await page.eval_on_selector_all(
            "#transcript .word", "s => s.map(e => e.textContent)"
        )
        transcript = await page.inner_text("#transcript")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(ARTIFACTS / "highlight-emoji.png"), full_page=True)
    assert [w["word"] for w in u["words"]] == [HIGHLIGHTED[a:b] for a, b in words]
    assert spans == [w["word"] for w in u["words"]]
    assert "👋" in transcript and "🙏🏽" in transcript  # the text around the words stays
    shown = [h["index"] for h in u["highlights"] if h["index"] >= 0]
    assert shown == list(range(len(words)))
