"""Browser tests' shared parts: Debian's Chromium under Playwright, WebRTC audio stats, servers.

- ``launch_chromium()``: the system Chromium (``/usr/bin/chromium``, installed by ``make browser``;
  Playwright never downloads a browser here), headless, with fake media devices. The session
  fixture ``chromium`` in conftest.py launches it once per test session.
- ``open_page()``: a fresh context and page that records every ``RTCPeerConnection`` the page
  makes and aborts any request that would leave this machine (listed in ``BrowserPage.blocked``).
- ``inbound_audio()`` / ``wait_for_audio()``: the audio a page receives over WebRTC, read from
  ``getStats()``. Silence counts in ``bytesReceived`` too, so audio "arrives" only when
  ``totalAudioEnergy`` grows.
- ``serve()``: a server subprocess on a free loopback port, stopped (with every process it
  started) however the test ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "artifacts" / "browser"
CHROMIUM = Path(os.environ.get("VEENA_CHROMIUM", "/usr/bin/chromium"))
# `make test` sets this: there a missing browser or driver is a failure, not a skip.
REQUIRED = os.environ.get("VEENA_BROWSER_TESTS") == "required"

# Chromium on these machines: no sandbox as root, no GPU, and none of the background services
# that dial Google (the closed network refuses them, many at a time). Fake media devices answer
# getUserMedia with a test tone, without a permission prompt.
LAUNCH_ARGS = [
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
]

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}

# Keeps every RTCPeerConnection a page creates, so tests can read its stats whatever the page's
# own code does with it (the page under test need not expose anything).
RECORD_PEER_CONNECTIONS = """
(() => {
  const Native = window.RTCPeerConnection;
  if (!Native || window.__peerConnections) return;
  window.__peerConnections = [];
  function Recorded(...args) {
    const pc = new Native(...args);
    window.__peerConnections.push(pc);
    return pc;
  }
  Recorded.prototype = Native.prototype;
  Object.setPrototypeOf(Recorded, Native);
  window.RTCPeerConnection = Recorded;
})();
"""

INBOUND_AUDIO = """
async () => {
  const reports = [];
  for (const pc of window.__peerConnections || []) {
    const stats = await pc.getStats();
    stats.forEach((r) => {
      if (r.type === "inbound-rtp" && r.kind === "audio") {
        reports.push({
          bytes_received: r.bytesReceived || 0,
          packets_received: r.packetsReceived || 0,
          total_audio_energy: r.totalAudioEnergy || 0,
          total_samples_duration: r.totalSamplesDuration || 0,
          audio_level: r.audioLevel || 0,
        });
      }
    });
  }
  return reports;
}
"""


def skip_or_fail(reason: str) -> None:
    """Skip a browser test (fail instead under ``make test``, where the browser must exist)."""
    if REQUIRED:
        pytest.fail(reason)
    pytest.skip(reason)


def chromium_args() -> list[str]:
    """The launch flags: ``LAUNCH_ARGS``, plus ``--no-sandbox`` when running as root."""
    return [*LAUNCH_ARGS, *(["--no-sandbox"] if os.geteuid() == 0 else [])]


async def launch_chromium() -> AsyncIterator[Any]:
    """Yield a headless system Chromium (a Playwright ``Browser``); close it at the end.

    Playwright gives the browser a new empty profile (user-data dir) and deletes it on close.
    """
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        skip_or_fail("playwright is not installed: pip install -e '.[dev]'")
    if not os.access(CHROMIUM, os.X_OK):
        skip_or_fail(f"{CHROMIUM} not found: run `make browser` (apt-get install -y chromium)")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=chromium_args()
        )
        try:
            yield browser
        finally:
            await browser.close()


@dataclass
class BrowserPage:
    """A page in its own browser context, and the off-machine requests it tried (aborted)."""

    page: Any
    blocked: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)


@contextlib.asynccontextmanager
async def open_page(browser: Any) -> AsyncIterator[BrowserPage]:
    """A fresh context and page: peer connections recorded, requests off this machine aborted."""
    context = await browser.new_context()
    result = BrowserPage(page=None)

    async def only_local(route: Any) -> None:
        url = route.request.url
        if urlsplit(url).hostname in LOCAL_HOSTS or not url.startswith(("http", "ws")):
            await route.continue_()
        else:
            result.blocked.append(url)
            await route.abort()

    try:
        await context.add_init_script(RECORD_PEER_CONNECTIONS)
        await context.route("**/*", only_local)
        result.page = await context.new_page()
        result.page.on("console", lambda m: result.console.append(f"{m.type}: {m.text}"))
        yield result
    finally:
        await context.close()


def console_errors(browser_page: BrowserPage) -> list[str]:
    """The console errors a page logged."""
    return [line for line in browser_page.console if line.startswith("error")]


@dataclass(frozen=True)
class AudioStats:
    """What a page has received over WebRTC audio, summed over its inbound audio streams.

    Parameters:
        bytes_received: RTP payload bytes (silence too: a connected bot always sends packets).
        packets_received: RTP packets.
        total_audio_energy: sum over decoded samples of level² × duration (level in [0, 1]):
            grows only while the audio is not silent.
        total_samples_duration: seconds of audio decoded.
        audio_level: the latest level (0..1) of the first stream.
        streams: how many inbound audio streams there were.
    """

    bytes_received: int = 0
    packets_received: int = 0
    total_audio_energy: float = 0.0
    total_samples_duration: float = 0.0
    audio_level: float = 0.0
    streams: int = 0

    @classmethod
    def from_reports(cls, reports: Sequence[dict[str, float]]) -> AudioStats:
        """Sum ``inbound-rtp`` audio reports (the dicts ``INBOUND_AUDIO`` returns)."""
        return cls(
            bytes_received=int(sum(r["bytes_received"] for r in reports)),
            packets_received=int(sum(r["packets_received"] for r in reports)),
            total_audio_energy=sum(r["total_audio_energy"] for r in reports),
            total_samples_duration=sum(r["total_samples_duration"] for r in reports),
            audio_level=reports[0]["audio_level"] if reports else 0.0,
            streams=len(reports),
        )

    def as_dict(self) -> dict[str, Any]:
        """The stats as a plain dict (for artefacts and messages)."""
        return asdict(self)


async def inbound_audio(page: Any) -> AudioStats:
    """The page's received WebRTC audio now (zeros before any peer connection exists)."""
    return AudioStats.from_reports(await page.evaluate(INBOUND_AUDIO))


def audio_arrived(stats: AudioStats, since: AudioStats, *, min_energy: float) -> bool:
    """Whether non-silent audio arrived between two readings (bytes alone may be silence)."""
    return (
        stats.bytes_received > since.bytes_received
        and stats.total_audio_energy - since.total_audio_energy >= min_energy
    )


async def wait_for_audio(
    page: Any,
    *,
    since: AudioStats | None = None,
    within: float = 30.0,
    min_energy: float = 1e-3,
    poll: float = 0.1,
) -> AudioStats:
    """Wait until the page receives audio with energy; fail naming what did arrive.

    Args:
        page: the Playwright page.
        since: a reading to compare with (None: nothing received yet).
        within: seconds to wait.
        min_energy: the growth of ``totalAudioEnergy`` that counts as audio; 1e-3 is 0.1 s at
            -20 dBFS, while silence adds exactly 0.
        poll: seconds between readings.

    Returns:
        The first reading with audio.

    Raises:
        AssertionError: no audio with energy within ``within`` seconds.
    """
    since = since or AudioStats()
    deadline = time.monotonic() + within
    stats = since
    while time.monotonic() < deadline:
        stats = await inbound_audio(page)
        if audio_arrived(stats, since, min_energy=min_energy):
            return stats
        await asyncio.sleep(poll)
    raise AssertionError(
        f"no audio arrived within {within:.0f} s: {stats.streams} inbound audio stream(s), "
        f"{stats.bytes_received - since.bytes_received} bytes and "
        f"{stats.total_audio_energy - since.total_audio_energy:.2g} audio energy since "
        f"{since.as_dict()} (silence carries bytes, not energy)"
    )


async def wait_for_quiet(
    page: Any, *, quiet: float = 0.5, within: float = 30.0, poll: float = 0.1
) -> AudioStats:
    """Wait until the received audio energy has not grown for ``quiet`` seconds; return it.

    Raises:
        AssertionError: the audio never went quiet within ``within`` seconds.
    """
    deadline = time.monotonic() + within
    stats = await inbound_audio(page)
    still_since = time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(poll)
        now = await inbound_audio(page)
        if now.total_audio_energy != stats.total_audio_energy:
            stats, still_since = now, time.monotonic()
        elif time.monotonic() - still_since >= quiet:
            return now
    raise AssertionError(f"audio still arriving after {within:.0f} s: {stats.as_dict()}")


async def wait_for_packets(page: Any, *, within: float = 30.0, poll: float = 0.1) -> AudioStats:
    """Wait until the page receives RTP audio packets (any content); return that reading.

    Raises:
        AssertionError: no audio packets within ``within`` seconds (no connection or track).
    """
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        stats = await inbound_audio(page)
        if stats.packets_received > 0:
            return stats
        await asyncio.sleep(poll)
    raise AssertionError(f"no audio packets within {within:.0f} s")


def save_artifact(name: str, data: dict[str, Any]) -> Path:
    """Write ``data`` as JSON under ``artifacts/browser/`` and return the path."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / name
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Server:
    """A running server subprocess and its base URL."""

    url: str
    process: subprocess.Popen
    log: Path


@contextlib.contextmanager
def serve(
    command: Sequence[str],
    *,
    port: int,
    log: Path,
    ready_path: str = "/",
    timeout: float = 240.0,
    env: dict[str, str] | None = None,
) -> Iterator[Server]:
    """Run ``command`` (a server listening on 127.0.0.1:``port``) until the block ends.

    The server runs in its own process group (in the caller's session, so CI still sees any
    leftover). On exit it gets SIGTERM (a graceful shutdown: a vLLM engine is stopped in the
    server's lifespan), then the whole group gets SIGKILL if anything is still running 30 s
    later. Output goes to ``log``.

    Raises:
        RuntimeError: the server exited or did not answer ``ready_path`` within ``timeout``
            (the message has the end of its log).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        process = subprocess.Popen(
            list(command),
            stdout=out,
            stderr=subprocess.STDOUT,
            process_group=0,
            env={**os.environ, **(env or {})},
        )
    try:
        _wait_ready(process, url + ready_path, log, timeout)
        yield Server(url=url, process=process, log=log)
    finally:
        _stop(process)


def _wait_ready(process: subprocess.Popen, url: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited ({process.returncode}):\n{_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    raise RuntimeError(f"server not ready at {url} after {timeout:.0f} s:\n{_tail(log)}")


def _stop(process: subprocess.Popen, grace: float = 30.0) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    # Whatever is left in its group (an engine process whose parent died, say) goes too.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _tail(log: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
