"""The docs site (mkdocs.yml): it builds with --strict (a broken link, a missing page or an API
reference that names nothing fails), and its pages render in a real browser."""

from __future__ import annotations

import functools
import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from browser import ARTIFACTS, console_errors, open_page
from server_fakes import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    mkdocs = Path(sys.executable).with_name("mkdocs")
    done = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
        capture_output=True, text=True, timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": str(mkdocs.parent) + ":/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _pages(value)]
    return [page for item in nav for page in _pages(item)]  # type: ignore[union-attr]


def test_every_guide_and_reference_page_is_built(site: Path):
    pages = _pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    assert len(pages) >= 20, pages
    for page in pages:
        built = site / page.removesuffix(".md") / "index.html"
        if page == "index.md":
            built = site / "index.html"
        assert built.is_file(), page


def test_the_api_reference_comes_from_the_docstrings(site: Path):
    from pipecat_veena.engine.config import EngineConfig
    from pipecat_veena.service import VeenaTTSService

    service = (site / "reference" / "service" / "index.html").read_text()
    first_line = VeenaTTSService.__doc__.strip().splitlines()[0]
    assert "VeenaTTSService" in service and first_line.split()[0] in service
    engine = (site / "reference" / "engine" / "index.html").read_text()
    assert "EngineConfig" in engine and "VeenaEngine" in engine
    assert EngineConfig.__doc__.strip().split()[0] in engine


def test_nothing_moved_out_of_the_readme_was_lost(site: Path):
    # each README heading before the split lives on as a guide page's title or section
    for title in (
        "Configuration",
        "Word timings",
        "Checkpoints, voices and enrolment",
        "Deploying",
        "A LiveKit agent",
        "A Pipecat bot",
        "The playground page",
    ):
        assert any(title in p.read_text() for p in (ROOT / "docs" / "guides").glob("*.md")), title


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def site_url(site: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


@pytest.mark.browser
@pytest.mark.parametrize(
    "path, shot, heading",
    [("/", "docs-home.png", "pipecat-veena"),
     ("/guides/pipecat/", "docs-guide-pipecat.png", "A Pipecat bot")],
)  # fmt: skip
async def test_pages_render_in_chromium(chromium, site_url: str, path: str, shot: str,
                                        heading: str):  # fmt: skip
    async with open_page(chromium) as browser_page:
        page = browser_page.page
        await page.set_viewport_size({"width": 1280, "height": 900})
        response = await page.goto(site_url + path)
        assert response is not None and response.status == 200
        assert (await page.locator("article h1").first.inner_text()).strip(" ¶\n") == heading
        nav = await page.locator("nav.md-nav--primary").inner_text()
        assert "API reference" in nav and "Guides" in nav
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(ARTIFACTS / shot))
        assert not browser_page.blocked, browser_page.blocked  # nothing from off this machine
        assert not console_errors(browser_page)


def test_the_support_policy_states_the_pins():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    page = (ROOT / "docs" / "support.md").read_text()
    pins = {
        "python": project["requires-python"],
        "pipecat": next(d for d in project["dependencies"] if d.startswith("pipecat-ai")),
        "gpu": project["optional-dependencies"]["gpu"][0],
        "cpu": project["optional-dependencies"]["cpu"][0],
        "livekit": project["optional-dependencies"]["livekit"][0],
        "ray": next(d for d in project["optional-dependencies"]["ray"] if d.startswith("ray")),
        "otel": project["optional-dependencies"]["otel"][0],
    }
    for name, pin in pins.items():
        spec = pin.removeprefix("pipecat-ai").removeprefix("livekit-agents")
        assert spec in page, f"docs/support.md does not state the {name} pin {pin!r}"
