"""examples/webrtc_bot.py in a real headless Chromium: the greeting and typed text arrive as audio.

The bot runs as a subprocess (its own vLLM engine, spark-tiny demo checkpoint) on a free loopback
port. Chromium opens the bot's self-contained page (``/``), connects with fake media
devices, and the audio it receives is read from ``RTCPeerConnection.getStats()``: the greeting
must raise ``totalAudioEnergy`` (silence only adds bytes). The check itself is shown to fail on
silence in ``test_silence_is_not_audio``. Artefacts (screenshot, stats, bot log) land in
``artifacts/browser/``.
"""

from __future__ import annotations

import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import (
    ARTIFACTS,
    AudioStats,
    Server,
    console_errors,
    free_port,
    inbound_audio,
    open_page,
    save_artifact,
    serve,
    skip_or_fail,
    wait_for_audio,
    wait_for_packets,
    wait_for_quiet,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

BOT = Path(__file__).resolve().parent.parent / "examples" / "webrtc_bot.py"
CLIENT_PAGE = BOT.with_name("webrtc_client.html")
GREETING = "नमस्ते! Welcome to the WebRTC test."
TYPED = "आपका order ship हो गया है।"


@pytest.fixture(scope="module")
def webrtc_bot(spark_tiny_checkpoint: Path) -> Iterator[Server]:
    """The example bot on the demo checkpoint, stopped (engine included) however tests end."""
    try:
        import aiortc  # noqa: F401
    except ImportError:
        skip_or_fail("the WebRTC transport is not installed: pip install -e '.[webrtc]'")
    port = free_port()
    command = [sys.executable, str(BOT), "--host", "127.0.0.1", "--port", str(port)]
    command += ["--model", str(spark_tiny_checkpoint), "--greeting", GREETING, "--answer", ""]
    with serve(command, port=port, log=ARTIFACTS / "webrtc_bot.log") as server:
        yield server


#: The page's RTVI bot-output lines joined: the service reports each word as it plays (word
#: timestamps), so a sentence arrives as consecutive "bot said: <word>" lines.
_SAID = """text => document.getElementById('log').textContent.split('\\n')
    .filter(line => line.includes('bot said: '))
    .map(line => line.slice(line.indexOf('bot said: ') + 10).trim())
    .join(' ').includes(text)"""


async def _bot_said(page, text: str, within: float) -> None:
    """Wait for the page's log to show the bot finished speaking ``text`` (RTVI bot-output)."""
    await page.wait_for_function(_SAID, arg=text, timeout=within * 1000)


async def test_greeting_and_typed_text_arrive_as_audio(chromium, webrtc_bot: Server):
    async with open_page(chromium) as browser_page:
        page = browser_page.page
        measured: dict = {}
        try:
            await page.goto(webrtc_bot.url + "/")
            clicked = time.monotonic()
            await page.get_by_role("button", name="Connect").click()

            greeting = await wait_for_audio(page, within=60)
            measured["first_greeting_audio_after_connect_s"] = time.monotonic() - clicked
            await _bot_said(page, GREETING, within=60)
            after_greeting = await wait_for_quiet(page)  # its last packets played out
            measured["greeting"] = after_greeting.as_dict()

            await page.fill("#text", TYPED)
            await page.get_by_role("button", name="Speak").click()
            typed = await wait_for_audio(page, since=after_greeting, within=60)
            await _bot_said(page, TYPED, within=60)
            measured["after_typed_text"] = (await inbound_audio(page)).as_dict()
        finally:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=str(ARTIFACTS / "webrtc_bot.png"))
            measured["page_log"] = await page.inner_text("#log")
            measured["blocked_requests"] = browser_page.blocked
            save_artifact("webrtc_bot.json", measured)

        assert greeting.total_audio_energy > 0 and greeting.bytes_received > 0
        assert typed.total_audio_energy > after_greeting.total_audio_energy
        # The page needs nothing from outside this machine.
        assert browser_page.blocked == []


def test_prebuilt_client_is_served(webrtc_bot: Server):
    with urllib.request.urlopen(webrtc_bot.url + "/client/") as response:
        index = response.read().decode()
    assert '<div id="root"></div>' in index
    request = urllib.request.Request(webrtc_bot.url + "/start", data=b"{}", method="POST")
    with urllib.request.urlopen(request) as response:
        assert response.status == 200


# A page that sends itself audio over a loopback pair of peer connections: a 440 Hz tone at
# `gain` (0: digital silence). Same getStats path as the bot test, no server needed.
LOOPBACK_PAGE = """
<script>
async function loopback(gain) {
  const ctx = new AudioContext();
  const osc = ctx.createOscillator();
  const amp = ctx.createGain();
  amp.gain.value = gain;
  const out = ctx.createMediaStreamDestination();
  osc.connect(amp).connect(out);
  osc.start();
  const a = new RTCPeerConnection(), b = new RTCPeerConnection();
  a.onicecandidate = (e) => e.candidate && b.addIceCandidate(e.candidate);
  b.onicecandidate = (e) => e.candidate && a.addIceCandidate(e.candidate);
  b.ontrack = (e) => { const el = new Audio(); el.srcObject = e.streams[0]; el.play(); };
  a.addTrack(out.stream.getAudioTracks()[0], out.stream);
  await a.setLocalDescription(await a.createOffer());
  await b.setRemoteDescription(a.localDescription);
  await b.setLocalDescription(await b.createAnswer());
  await a.setRemoteDescription(b.localDescription);
}
</script>
"""


@pytest.mark.parametrize("gain", [0.0, 0.3])
async def test_silence_is_not_audio(chromium, gain: float):
    """The audio check fails on a connection that carries only silence, passes on a tone."""
    async with open_page(chromium) as browser_page:
        page = browser_page.page
        await page.set_content(LOOPBACK_PAGE)
        await page.evaluate("gain => loopback(gain)", gain)
        flowing = await wait_for_packets(page, within=10)
        if gain == 0:
            with pytest.raises(AssertionError, match="no audio arrived"):
                await wait_for_audio(page, since=flowing, within=3)
            stats = await inbound_audio(page)
            assert stats.bytes_received > flowing.bytes_received  # silence, not a dead link
        else:
            stats = await wait_for_audio(page, since=flowing, within=10)
            assert stats.total_audio_energy > flowing.total_audio_energy


async def test_the_text_box_has_a_label(chromium):
    """The page's text box has an accessible name from a label, not only a placeholder."""
    async with open_page(chromium) as browser_page:
        page = browser_page.page
        await page.goto(CLIENT_PAGE.as_uri())
        box = page.get_by_label("Text to speak")
        assert await box.count() == 1 and await box.get_attribute("id") == "text"
        assert await page.eval_on_selector("#text", "e => e.labels.length") == 1
        assert browser_page.blocked == [] and console_errors(browser_page) == []


def test_audio_stats_sum_streams():
    reports = [
        {
            "bytes_received": 10,
            "packets_received": 1,
            "total_audio_energy": 0.5,
            "total_samples_duration": 1.0,
            "audio_level": 0.2,
        },
        {
            "bytes_received": 5,
            "packets_received": 2,
            "total_audio_energy": 0.25,
            "total_samples_duration": 2.0,
            "audio_level": 0.9,
        },
    ]
    stats = AudioStats.from_reports(reports)
    assert (stats.bytes_received, stats.packets_received, stats.streams) == (15, 3, 2)
    assert stats.total_audio_energy == 0.75 and stats.audio_level == 0.2
    assert AudioStats.from_reports([]) == AudioStats()
