"""The playground's speed slider in a real headless Chromium: its value reaches the engine as the
WebSocket's ``options.speed`` (none at 1.0: the audio untouched), and the page says the speed."""

from __future__ import annotations

import pytest
from browser import open_page
from server_fakes import RATE, FakeSpeechEngine, serving
from test_browser_playground import open_playground, speak, wait_for_end

pytestmark = pytest.mark.browser


async def _set_speed(page, value: float) -> None:
    await page.evaluate(
        "(v) => { const s = document.getElementById('speed'); s.value = String(v);"
        " s.dispatchEvent(new Event('input', { bubbles: true })); }",
        value,
    )


async def test_the_speed_slider_sets_options_speed(chromium):
    engine = FakeSpeechEngine(chunks=2, chunk_samples=RATE // 10)
    async with serving(engine) as server, open_page(chromium) as browser_page:
        page = browser_page.page
        await open_playground(page, server.url)
        assert await page.get_attribute("#speed", "min") == "0.5"
        assert await page.get_attribute("#speed", "max") == "2"
        await speak(page, "At the model's pace.")
        await wait_for_end(page, within=10)
        assert "speed" not in engine.calls[-1][2]
        await _set_speed(page, 1.5)
        assert "1.5" in await page.inner_text("#speed-value")
        await speak(page, "Faster.")
        await wait_for_end(page, within=10)
        assert engine.calls[-1][2]["speed"] == 1.5
