"""The playground page (``/``) in a real headless Chromium: Hindi text in, streamed audio out.

The speech server runs in-process, on the session's vLLM engine (spark-tiny demo checkpoint)
through ``RecordingGenerator``, so the samples the page counts are checked against the tokens the
engine generated. The page's own figures (``window.playground.utterance``: samples received and
played, peak, first-audio time, underruns) are what the tests read. The audio check is shown to
fail on a server whose engine yields nothing, and on one that yields silence. Artefacts
(screenshots, figures) land in ``artifacts/browser/``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest
import pytest_asyncio
from browser import ARTIFACTS, console_errors, open_page, save_artifact
from recording import RecordingGenerator
from server_fakes import RATE, FakeSpeechEngine, RawClient, serving

from pipecat_veena.engine import AudioChunk, EngineConfig, VeenaEngine
from pipecat_veena.server import ServerHandle, ServerSettings, create_app

pytestmark = pytest.mark.browser

HINDI = "नमस्ते! आपका OTP 482913 है।"
EMOJI_ONLY = "🙏🎉👍"
LONG_HINDI = ("नमस्ते! आपका order आज सुबह ship हो गया है और यह तीन दिन में आपके घर पहुँच जाएगा। ") * 6
KEY = "playground-test-key"


@pytest_asyncio.fixture(scope="module")
async def real(spark_tiny_checkpoint, spark_generator) -> AsyncIterator[Any]:
    """(engine, recorder): a VeenaEngine on the session's vLLM engine, every token recorded."""
    recorder = RecordingGenerator(spark_generator)
    config = EngineConfig(checkpoint=spark_tiny_checkpoint, warmup=False, max_model_len=2048)
    engine = VeenaEngine(config, generator=recorder)
    await engine.start()
    try:
        yield engine, recorder
    finally:
        await engine.shutdown()


# -- reading the page ------------------------------------------------------------------------
async def utterance(page: Any) -> dict[str, Any] | None:
    """The page's figures for its current utterance (``window.playground.utterance``)."""
    return await page.evaluate("() => window.playground.utterance")


async def open_playground(page: Any, url: str, *, expect_voices: bool = True) -> None:
    """Open the page; wait for its voices (or, without ``expect_voices``, for its message)."""
    await page.goto(url + "/")
    ready = "window.playground.ready !== null" if expect_voices else "window.playground.message"
    await page.wait_for_function(f"() => {ready}", timeout=30_000)


async def speak(page: Any, text: str, *, seed: int | None = None) -> None:
    """Type ``text`` into the page and press Speak."""
    await page.fill("#text", text)
    await page.fill("#seed", "" if seed is None else str(seed))
    await page.click("#speak")


async def wait_for_page_audio(page: Any, *, within: float = 60.0) -> dict[str, Any]:
    """Wait until the page has received audio that is not silence; return its figures.

    Raises:
        AssertionError: no audio within ``within`` seconds (or the utterance ended without
            any), naming what the page saw.
    """
    deadline = time.monotonic() + within
    u = None
    while time.monotonic() < deadline:
        u = await utterance(page)
        if u and u["samples"] > 0 and u["peak"] > 0:
            return u
        if u and u["state"] in ("completed", "cancelled", "failed"):
            break
        await asyncio.sleep(0.05)
    message = await page.evaluate("() => window.playground.message")
    raise AssertionError(f"no audio arrived in the page within {within:.0f} s: {u}; {message!r}")


async def wait_for_end(page: Any, *, within: float = 120.0, played: bool = True) -> dict[str, Any]:
    """Wait until the utterance is over (and, with ``played``, has played out); its figures."""
    condition = "u && ['completed', 'cancelled', 'failed'].includes(u.state)"
    if played:
        condition += " && ['drained', 'stopped'].includes(u.playback)"
    await page.wait_for_function(
        f"() => {{ const u = window.playground.utterance; return {condition}; }}",
        timeout=within * 1000,
    )
    return await utterance(page)


def shown_ms(ms: float) -> str:
    """A time as the page shows it (JavaScript's Math.round, not Python's round-half-even)."""
    return f"{math.floor(ms + 0.5)} ms"


async def unfinished_on_metrics(url: str) -> float:
    """``veena_engine_unfinished_requests`` as the server's /metrics reports it."""
    async with httpx.AsyncClient(base_url=url) as http:
        text = (await http.get("/metrics")).text
    match = re.search(r"^veena_engine_unfinished_requests(?:\{[^}]*\})? (\S+)$", text, re.M)
    assert match, "veena_engine_unfinished_requests is not on /metrics"
    return float(match.group(1))


async def settled(engine: VeenaEngine, server: ServerHandle, *, within: float = 10.0) -> None:
    """Wait (bounded) until neither the server nor vLLM has anything in flight."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not engine.stats()["unfinished_requests"] and not server.state.slots.active:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"still in flight: {engine.stats()}, {server.state.slots.active} streams")


def samples_of(engine: VeenaEngine, recorder: RecordingGenerator, request_id: str) -> int:
    """Samples the codec makes from the semantic tokens of one server request."""
    ids = engine._format.ids
    semantics = sum(
        1
        for t in recorder.tokens_of(request_id)
        if 0 <= t - ids.semantic_base < ids.num_semantic_codes
    )
    return semantics * engine._codec.samples_per_frame


# -- the real engine -----------------------------------------------------------------------
@pytest.mark.vllm
async def test_hindi_text_streams_into_the_page(chromium, real):
    engine, recorder = real
    async with serving(engine, demo=True) as server, open_page(chromium) as browser_page:
        page = browser_page.page
        measured: dict[str, Any] = {}
        try:
            await open_playground(page, server.url)
            assert await page.is_visible("#demo")  # the demo checkpoint: sound, not words
            voices = await page.eval_on_selector_all("#voice option", "o => o.map(e => e.value)")
            assert voices == engine.voices
            await speak(page, HINDI, seed=3)
            first = await wait_for_page_audio(page)
            u = await wait_for_end(page)
            hint = await page.inner_text("#hint")
            assert re.fullmatch(r"\d+ ms", await page.inner_text("#ttfa"))
            measured = {"first_audio": first, "end": u}
        finally:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=str(ARTIFACTS / "playground.png"), full_page=True)
            measured["blocked_requests"] = browser_page.blocked
            measured["console"] = browser_page.console
            save_artifact("playground.json", measured)

        done = u["done"]
        assert u["state"] == "completed" and done["reason"] == "completed"
        # Every sample the engine made reached the page, and all of it played.
        assert u["samples"] == samples_of(engine, recorder, done["request_id"]) > 0
        assert u["samples"] == round(done["audio_seconds"] * done["sample_rate"])
        assert u["sampleRate"] == done["sample_rate"] == engine.sample_rate
        assert u["played"] == u["samples"] and u["buffered"] == 0
        assert u["tokens"] == done["tokens"] and u["peak"] > 0
        assert 0 < first["firstAudioMs"] <= u["lastAudioMs"]
        # First sound: when the player played the first sample that is not silence, after the
        # first frame arrived (the prebuffer at least), and that is the figure the page shows.
        assert u["firstSoundMs"] > u["firstAudioMs"]
        assert await page.inner_text("#ttfa") == shown_ms(u["firstSoundMs"])
        if u["underruns"] and u["rtf"] > 1:  # a busy machine: spark-tiny is already in use
            assert "busy" in hint and "--model" not in hint
        # The engine's word timings came with the audio, and the words were highlighted in turn
        # up to the last (on a machine slower than real time a word's timing may come after its
        # audio played: it is then never highlighted).
        assert [w["word"] for w in u["words"]] == HINDI.split()
        shown = [h["index"] for h in u["highlights"] if h["index"] >= 0]
        assert shown == sorted(set(shown)) and shown[-1] == len(u["words"]) - 1
        assert browser_page.blocked == [] and console_errors(browser_page) == []
    await settled(engine, server)


@pytest.mark.vllm
async def test_stop_cancels_on_the_server(chromium, real):
    engine, _ = real
    async with serving(engine, demo=True) as server, open_page(chromium) as browser_page:
        page = browser_page.page
        await open_playground(page, server.url)
        await speak(page, LONG_HINDI)
        await wait_for_page_audio(page)
        await page.click("#stop")
        u = await wait_for_end(page, within=30)
        assert u["state"] == "cancelled" and u["done"]["reason"] == "cancelled"
        assert u["playback"] == "stopped"
        assert await page.inner_text("#state") == "stopped"
        await settled(engine, server)
        assert await unfinished_on_metrics(server.url) == 0
        assert engine.stats()["unfinished_requests"] == 0
        # the page can speak again at once
        await speak(page, HINDI, seed=4)
        await wait_for_page_audio(page)
        await wait_for_end(page)
        assert console_errors(browser_page) == []
    await settled(engine, server)


@pytest.mark.vllm
async def test_api_key(chromium, real):
    engine, _ = real
    settings = ServerSettings(api_keys={KEY: "playground"})
    async with serving(engine, settings, demo=True) as server, open_page(chromium) as browser_page:
        page = browser_page.page
        await open_playground(page, server.url, expect_voices=False)
        assert "needs an API key" in await page.inner_text("#message")
        await page.click("#speak")  # the WebSocket refuses it too, and the page says the same
        await page.wait_for_function("() => window.playground.failure?.code === 'unauthorized'")
        assert "needs an API key" in await page.inner_text("#message")
        assert await utterance(page) is None

        await page.fill("#key", "not-the-key")
        await page.locator("#key").blur()
        await page.wait_for_function("() => window.playground.message.includes('did not accept')")

        await page.fill("#key", KEY)
        await page.locator("#key").blur()
        await page.wait_for_function("() => window.playground.ready !== null")
        await page.reload()  # the key was kept in localStorage
        await page.wait_for_function("() => window.playground.ready !== null")
        assert await page.input_value("#key") == KEY
        await speak(page, HINDI, seed=5)
        assert (await wait_for_page_audio(page))["samples"] > 0
        assert (await wait_for_end(page))["state"] == "completed"
        assert await page.is_hidden("#message")
    await settled(engine, server)


@pytest.mark.vllm
async def test_emoji_only_text_says_there_is_nothing_to_speak(chromium, real):
    engine, _ = real
    async with serving(engine, demo=True) as server, open_page(chromium) as browser_page:
        page = browser_page.page
        await open_playground(page, server.url)
        await speak(page, EMOJI_ONLY)
        u = await wait_for_end(page, within=30)
        assert u["state"] == "completed" and u["samples"] == 0
        assert u["done"]["warning"] == "nothing_to_speak"
        assert await page.inner_text("#state") == "nothing to speak"
        assert "nothing to speak" in await page.inner_text("#message")
        assert console_errors(browser_page) == []
    await settled(engine, server)


@pytest.mark.vllm
async def test_words_with_emoji_blank_lines_and_accents_get_their_spans(chromium, real):
    """The real engine's word timings through the real server: each word the page got has its
    span in the transcript (offset_utf16: emoji are two JavaScript units; the offsets count the
    text as typed, blank lines and a decomposed accent included), highlighted in order."""
    engine, _ = real
    text = "नमस्ते 🙏 दोस्तों!\n\nCafe\u0301 😀 is open today."
    async with serving(engine, demo=True) as server, open_page(chromium) as browser_page:
        page = browser_page.page
        await open_playground(page, server.url)
        await speak(page, text, seed=6)
        u = await wait_for_end(page)
        spans = await page.eval_on_selector_all(
            "#transcript .word", "s => s.map(e => e.textContent)"
        )
        assert u["state"] == "completed" and u["words"], u
        assert spans == [w["word"] for w in u["words"]]
        for w in u["words"]:
            assert text[w["offset"] : w["offset"] + len(w["word"])] == w["word"]
        shown = [h["index"] for h in u["highlights"] if h["index"] >= 0]
        assert shown == sorted(set(shown)) and shown
        assert console_errors(browser_page) == []
    await settled(engine, server)


@pytest.mark.vllm
async def test_a_part_cut_at_its_token_cap_is_not_a_clean_finish(real):
    """The server side of the page's "cut short": the real engine, a part capped by max_tokens."""
    engine, _ = real
    async with serving(engine) as server, RawClient.connect(server.ws_url) as client:
        options = {"max_tokens": 60, "seed": 1}
        text = LONG_HINDI[:200]
        await client.send({"type": "speak", "id": "c", "text": text, "options": options})
        _, end = await client.until_end("c")
        assert end.type == "done" and end.reason == "completed"
        assert end.warning == "token_cap"
        await client.send({"type": "speak", "id": "d", "text": HINDI, "options": {"seed": 1}})
        _, end = await client.until_end("d")
        assert end.type == "done" and end.warning is None
    await settled(engine, server)


# -- the check fails when no audio arrives (fake engines, no vLLM) ----------------------------
class SilentEngine(FakeSpeechEngine):
    """A fake engine whose first ``silent`` chunks (None: all) are digital silence.

    Samples arrive, sound does not (until the tone after the silent chunks).
    """

    def __init__(self, *, silent: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.silent = silent

    async def stream(self, text, voice=None, *, request_id=None, **options):
        i = 0
        async for chunk in super().stream(text, voice, request_id=request_id, **options):
            i += 1
            loud = self.silent is not None and i > self.silent
            yield chunk if loud else AudioChunk(bytes(len(chunk.pcm)), RATE, tokens=chunk.tokens)


@pytest.mark.parametrize(
    "make_engine",
    [lambda: FakeSpeechEngine(chunks=0), lambda: SilentEngine(chunks=3)],
    ids=["nothing", "silence"],
)
async def test_the_audio_check_fails_without_audio(chromium, make_engine):
    async with serving(make_engine()) as server, open_page(chromium) as browser_page:
        page = browser_page.page
        await open_playground(page, server.url)
        assert await page.is_hidden("#demo")
        await speak(page, HINDI)
        with pytest.raises(AssertionError, match="no audio arrived in the page"):
            await wait_for_page_audio(page, within=10)
        u = await wait_for_end(page, within=10)
        assert u["state"] == "completed" and u["peak"] == 0


async def test_the_audio_check_passes_on_a_tone(chromium):
    engine = FakeSpeechEngine(chunks=5, chunk_samples=RATE // 10)
    async with serving(engine) as server, open_page(chromium) as browser_page:
        page = browser_page.page
        await open_playground(page, server.url)
        await speak(page, "A tone.")
        await wait_for_page_audio(page, within=10)
        u = await wait_for_end(page, within=10)
        assert u["samples"] == u["played"] == 5 * RATE // 10
        # The page decoded the int16 frames as the server sent them: 8000/32768 peak.
        assert np.isclose(u["peak"], 8000 / 32768, atol=1e-3)


async def test_underruns_are_counted_and_every_sample_plays(chromium):
    # 0.1 s of audio every 0.4 s: the player runs dry after each chunk it starts on.
    engine = FakeSpeechEngine(chunks=4, chunk_samples=RATE // 10, delay=0.4)
    async with serving(engine) as server, open_page(chromium) as browser_page:
        page = browser_page.page
        await open_playground(page, server.url)
        await speak(page, "A slow tone.")
        u = await wait_for_end(page, within=20)
        assert u["underruns"] >= 1
        assert await page.inner_text("#underruns") == str(u["underruns"])
        assert u["samples"] == u["played"] == 4 * RATE // 10


async def test_the_page_keeps_the_prebuffer_an_underrun_taught_it(chromium):
    """An answer whose second chunk comes late runs dry; the next answer starts later by the
    time the player waited dry (up to 0.5 s) and plays through; clean answers shrink it back."""
    # 0.15 s chunks, the second 0.6 s after the first: a 0.1 s prebuffer runs dry for about
    # 0.45 s; any prebuffer over one chunk waits for the second and plays through.
    late = FakeSpeechEngine(chunks=4, chunk_samples=RATE * 15 // 100, delays=(0.0, 0.6))
    async with serving(late) as server, open_page(chromium) as browser_page:
        page = browser_page.page
        await open_playground(page, server.url)
        answers = []
        for _ in range(2):
            await speak(page, "A tone that starts late.")
            answers.append(await wait_for_end(page, within=20))
        first, second = answers
        assert first["prebuffer"] == pytest.approx(0.1) and first["underruns"] >= 1
        # (about 0.1 + 0.45 s, capped at 0.5 s; more than one chunk's 0.15 s plays through)
        assert 0.15 < second["prebuffer"] <= 0.5 and second["underruns"] == 0
        assert second["samples"] == second["played"] == 4 * RATE * 15 // 100
        learnt = await page.evaluate("() => window.playground.prebuffer")
        assert learnt == second["prebuffer"]
        late.delays = ()  # answers that keep up: three in a row halve it
        for _ in range(3):
            await speak(page, "A tone on time.")
            assert (await wait_for_end(page, within=20))["underruns"] == 0
        assert await page.evaluate("() => window.playground.prebuffer") == max(0.1, learnt / 2)


async def test_the_word_being_played_is_highlighted_in_time_with_playback(chromium):
    """Audio and word timings arrive faster than they play (the words while the first plays);
    the page highlights each word when the player plays its start (the player's own count of
    samples played), not when it arrives."""
    text, word_s = "one two three four five", 0.4
    engine = FakeSpeechEngine(chunks=5, chunk_samples=round(word_s * RATE), words=True, delay=0.1)
    async with serving(engine) as server, open_page(chromium) as browser_page:
        page = browser_page.page
        await open_playground(page, server.url)
        await speak(page, text)
        await page.wait_for_function("() => window.playground.utterance !== null")
        seen = []  # (highlighted word in the page, its index, samples the player had played)
        while True:
            now = await page.evaluate(
                """() => { const u = window.playground.utterance;
                           const span = document.querySelector('#transcript .current');
                           return [span && span.textContent, u.current, u.played, u.playback,
                                   u.state]; }"""
            )
            seen.append(now[:3])
            if now[3] in ("drained", "stopped") or now[4] == "failed":
                break
            await asyncio.sleep(0.02)
        u = await wait_for_end(page, within=10)
    words = u["words"]
    assert [w["word"] for w in words] == text.split()
    assert [w["start"] for w in words] == pytest.approx([0.0, 0.4, 0.8, 1.2, 1.6])
    assert [h["index"] for h in u["highlights"]] == [0, 1, 2, 3, 4, -1]
    for change in u["highlights"][:-1]:  # highlighted once its start played, and not late
        played_s = change["played"] / RATE
        start = words[change["index"]]["start"]
        assert start - 0.05 <= played_s <= start + 0.3, (change, start)
    for span, index, played in seen:
        if index >= 0:
            assert span == words[index]["word"]
            assert words[index]["start"] - 0.05 <= played / RATE
    assert [index for _, index, _ in seen if index >= 0]  # (polls may miss a word: load)


# -- what the page says (fake engines, no vLLM) ----------------------------------------------
class CutEngine(FakeSpeechEngine):
    """A fake engine that says its last chunks were cut short (``AudioChunk.cut``)."""

    async def stream(self, text, voice=None, *, request_id=None, **options):
        async for chunk in super().stream(text, voice, request_id=request_id, **options):
            yield dataclasses.replace(chunk, cut="loop_guard")


async def test_first_sound_is_when_sound_plays_not_when_the_first_frame_arrives(chromium):
    # 0.5 s between chunks, the first three silent: the first frame arrives about 1.5 s before
    # the first sound can play.
    engine = SilentEngine(silent=3, chunks=5, chunk_samples=RATE // 10, delay=0.5)
    async with serving(engine) as server, open_page(chromium) as browser_page:
        page = browser_page.page
        await open_playground(page, server.url)
        await speak(page, "Silence, then a tone.")
        u = await wait_for_end(page, within=20)
        assert u["firstSoundMs"] - u["firstAudioMs"] >= 500
        assert await page.inner_text("#ttfa") == shown_ms(u["firstSoundMs"])
        assert await page.inner_text("#ttff") == f"first frame: {shown_ms(u['firstAudioMs'])}"
    # Silence alone is never a first sound.
    silent = SilentEngine(chunks=3, chunk_samples=RATE // 10)
    async with serving(silent) as server, open_page(chromium) as browser_page:
        page = browser_page.page
        await open_playground(page, server.url)
        await speak(page, "Only silence.")
        u = await wait_for_end(page, within=20)
        assert u["samples"] == 3 * RATE // 10 and u["firstAudioMs"] is not None
        assert u["firstSoundMs"] is None and await page.inner_text("#ttfa") == "–"


async def test_stutter_says_why_and_what_keeps_up(chromium):
    # 0.1 s of audio every 0.4 s: slower than real time, so the player runs dry.
    slow = FakeSpeechEngine(chunks=4, chunk_samples=RATE // 10, delay=0.4)
    async with serving(slow, demo=True) as server, open_page(chromium) as browser_page:
        page = browser_page.page
        await open_playground(page, server.url)
        await speak(page, "A slow tone.")
        u = await wait_for_end(page, within=20)
        assert u["underruns"] >= 1 and u["rtf"] > 1
        hint = await page.inner_text("#hint")
        assert "slower than real time" in hint and f"{u['rtf']:.2f}" in hint
        assert "--model ~/.cache/pipecat_veena/demo/spark-tiny" in hint
    fast = FakeSpeechEngine(chunks=4, chunk_samples=RATE // 10)
    async with serving(fast, demo=True) as server, open_page(chromium) as browser_page:
        page = browser_page.page
        await open_playground(page, server.url)
        await speak(page, "A fast tone.")
        u = await wait_for_end(page, within=20)
        assert u["underruns"] == 0 and await page.is_hidden("#hint")


async def test_a_cut_short_utterance_looks_different_from_a_finish(chromium):
    async with serving(CutEngine(chunks=2)) as server, open_page(chromium) as browser_page:
        page = browser_page.page
        await open_playground(page, server.url)
        await speak(page, "A tone that loops.")
        u = await wait_for_end(page, within=20)
        assert u["done"]["reason"] == "completed" and u["done"]["warning"] == "loop_guard"
        state = await page.inner_text("#state")
        assert state.startswith("cut short: looping") and not state.startswith("done")
        assert await page.get_attribute("#state", "data-warning") == "loop_guard"
        assert "loop guard" in await page.inner_text("#message")


async def test_a_server_that_went_away_is_noticed_and_redialled(chromium):
    engine = FakeSpeechEngine(chunks=2)
    first = ServerHandle(create_app(engine))
    await first.start()
    port = first.port
    second = None
    try:
        async with open_page(chromium) as browser_page:
            page = browser_page.page
            await open_playground(page, first.url)
            await first.stop()
            # Noticed at once, without a Speak, in words rather than a close code.
            await page.wait_for_function(
                "() => window.playground.connection === 'unreachable'", timeout=15_000
            )
            header = await page.inner_text("#model")
            message = await page.inner_text("#message")
            assert "unreachable, reconnecting" in header
            assert "Reconnecting" in message and not re.search(r"code \d{4}", message)
            # The server comes back on the same address: the page redials by itself.
            second = ServerHandle(create_app(engine), port=port)
            await second.start()
            await page.wait_for_function(
                "() => window.playground.connection === 'connected'", timeout=40_000
            )
            assert await page.is_hidden("#message")
            await speak(page, "Back again.")
            assert (await wait_for_end(page, within=20))["state"] == "completed"
    finally:
        await first.stop()
        if second is not None:
            await second.stop()


async def test_the_header_asks_for_a_key_and_says_when_it_is_refused(chromium):
    settings = ServerSettings(api_keys={KEY: "playground"})
    async with serving(FakeSpeechEngine(), settings) as server, open_page(chromium) as browser_page:
        page = browser_page.page
        await open_playground(page, server.url, expect_voices=False)
        assert await page.evaluate("() => window.playground.connection") == "key_needed"
        assert "API key needed" in await page.inner_text("#model")
        await page.fill("#key", "not-the-key")
        await page.locator("#key").blur()
        await page.wait_for_function("() => window.playground.connection === 'key_refused'")
        assert "API key refused" in await page.inner_text("#model")
        await page.fill("#key", KEY)
        await page.locator("#key").blur()
        await page.wait_for_function("() => window.playground.connection === 'connected'")


async def test_keyboard_focus_stays_on_speak(chromium):
    async with serving(FakeSpeechEngine(chunks=2)) as server, open_page(chromium) as browser_page:
        page = browser_page.page
        await open_playground(page, server.url)
        await page.focus("#speak")
        for n in (1, 2):  # Enter, Enter: a keyboard user speaks twice without reaching for a mouse
            await page.keyboard.press("Enter")
            u = await wait_for_end(page, within=20)
            assert u["id"] == f"u{n}" and u["state"] == "completed"
            assert await page.evaluate("() => document.activeElement.id") == "speak"


async def test_the_page_loads_with_an_icon_and_no_console_errors(chromium):
    async with serving(FakeSpeechEngine()) as server, open_page(chromium) as browser_page:
        page = browser_page.page
        failed: list[str] = []
        page.on("response", lambda r: r.status >= 400 and failed.append(f"{r.status} {r.url}"))
        await open_playground(page, server.url)
        await page.wait_for_load_state("networkidle")
        assert failed == [] and console_errors(browser_page) == []
        async with httpx.AsyncClient(base_url=server.url) as http:
            icon = await http.get("/favicon.ico")
            linked = await http.get(await page.get_attribute("link[rel=icon]", "href"))
        assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
        assert linked.status_code == 200 and linked.content == icon.content
