"""The package as a user gets it: sdist and wheel built, checked, and the wheel (not the tree)
installed in a fresh virtualenv outside the checkout, where it speaks, serves and imports.

The fresh virtualenv holds only the wheel; the wheel's dependencies are the ones this test
session runs on (a ``.pth`` line puts the dev virtualenv's site-packages behind it: a line in a
``.pth`` file adds a directory to ``sys.path`` without running that directory's own ``.pth``
files, so the checkout's editable install stays out). Every command runs with the temporary
folder as its working directory and no ``PYTHONPATH``: nothing can come from the checkout.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
import time
import wave
from pathlib import Path

import httpx
import psutil
import pytest
from browser import free_port
from server_fakes import ROOT

pytestmark = pytest.mark.slow

#: Extras a user installs, each named for what it brings (pyproject.toml).
USER_EXTRAS = ("cpu", "gpu", "server", "livekit", "ray", "otel", "twilio", "daily", "webrtc")
#: Extras whose requirements this session has installed (make setup), so they must resolve.
INSTALLED_EXTRAS = ("cpu", "server", "livekit", "ray", "otel")
#: Public modules a bot or a deployment imports (docs/layout.md).
PUBLIC_MODULES = (
    "pipecat_veena", "pipecat_veena.engine", "pipecat_veena.remote", "pipecat_veena.livekit",
    "pipecat_veena.normalize", "pipecat_veena.timing", "pipecat_veena.demo",
    "pipecat_veena.server", "pipecat_veena.deploy.ray", "pipecat_veena.service",
)  # fmt: skip
#: The example bot whose imports must work from the wheel.
EXAMPLE = ROOT / "examples" / "twilio_bot.py"
#: Longest a server start may take here (engine start and warm-up on a busy 2-core machine).
READY_S = 300.0


def _run(args: list[str | Path], cwd: Path, timeout: float = 600, **kw) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout, **kw,
    )  # fmt: skip
    assert out.returncode == 0, f"{args} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
    return out.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m build``: the sdist and the wheel, from the checkout."""
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT], cwd=out)
    return out


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv outside the checkout with the wheel installed; returns its bin/."""
    root = tmp_path_factory.mktemp("user")
    _run([sys.executable, "-m", "venv", "--without-pip", root / "venv"], cwd=root)
    bin_dir = root / "venv" / "bin"
    python = bin_dir / "python"
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   cwd=root).strip()  # fmt: skip
    Path(purelib, "dev-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (wheel,) = dist.glob("pipecat_veena-*.whl")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps",
          "--no-index", "--ignore-installed", wheel], cwd=root)  # fmt: skip
    return bin_dir


def test_sdist_and_wheel_pass_twine_check(dist: Path):
    files = sorted(dist.iterdir())
    assert {p.suffix for p in files} == {".whl", ".gz"}, files
    _run([sys.executable, "-m", "twine", "check", "--strict", *files], cwd=dist)


def test_the_wheel_carries_the_playground_and_no_tests(dist: Path):
    import zipfile

    (wheel,) = dist.glob("pipecat_veena-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for page in ("index.html", "playground.js", "playground.css", "player-worklet.js"):
        assert f"pipecat_veena/server/static/{page}" in names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "examples/"))]


def test_imports_come_from_the_wheel_and_every_public_name_works(venv: Path):
    code = (
        "import importlib, json, pipecat_veena\n"
        f"mods = {PUBLIC_MODULES!r}\n"
        "files = {m: importlib.import_module(m).__file__ for m in mods}\n"
        "missing = [n for n in pipecat_veena.__all__ if getattr(pipecat_veena, n, None) is None]\n"
        "print(json.dumps({'files': files, 'missing': missing}))\n"
    )
    seen = json.loads(_run([venv / "python", "-c", code], cwd=venv.parent))
    assert not seen["missing"], seen["missing"]
    for module, file in seen["files"].items():
        assert Path(file).is_relative_to(venv.parent), f"{module} imported from {file}"


def test_version_from_one_place(venv: Path, dist: Path):
    (wheel,) = dist.glob("pipecat_veena-*.whl")
    version = wheel.name.split("-")[1]
    assert _run([venv / "pipecat-veena", "--version"], cwd=venv.parent).strip() == (
        f"pipecat-veena {version}"
    )
    text = (ROOT / "pipecat_veena" / "__init__.py").read_text()
    assert f'__version__ = "{version}"' in text


def test_extras_resolve_from_the_wheel_metadata(venv: Path):
    code = (
        "import json; from importlib.metadata import distribution\n"
        "d = distribution('pipecat-veena')\n"
        "print(json.dumps({'extras': d.metadata.get_all('Provides-Extra'),\n"
        "                  'requires': d.requires, 'path': str(d._path)}))\n"
    )
    meta = json.loads(_run([venv / "python", "-c", code], cwd=venv.parent))
    assert Path(meta["path"]).is_relative_to(venv.parent), meta["path"]
    assert set(USER_EXTRAS) <= set(meta["extras"]), meta["extras"]
    check = (
        "import json, sys\n"
        "from importlib.metadata import PackageNotFoundError, version\n"
        "from packaging.requirements import Requirement\n"
        "requires, extras = json.loads(sys.argv[1]), json.loads(sys.argv[2])\n"
        "todo, done, wrong = list(extras), set(), []\n"
        "while todo:\n"
        "    extra = todo.pop()\n"
        "    if extra in done: continue\n"
        "    done.add(extra)\n"
        "    for line in requires:\n"
        "        req = Requirement(line)\n"
        "        if not req.marker or not req.marker.evaluate({'extra': extra}): continue\n"
        "        if req.name == 'pipecat-veena': todo += sorted(req.extras); continue\n"
        "        try: have = version(req.name)\n"
        "        except PackageNotFoundError: wrong.append(f'{extra}: {req} missing'); continue\n"
        "        if not req.specifier.contains(have, prereleases=True):\n"
        "            wrong.append(f'{extra}: {req} but {have}')\n"
        "print(json.dumps(wrong))\n"
    )
    args = [json.dumps(meta["requires"]), json.dumps(list(INSTALLED_EXTRAS))]
    wrong = json.loads(_run([venv / "python", "-c", check, *args], cwd=venv.parent))
    assert not wrong, wrong


def test_an_example_bots_imports_work_from_the_wheel(venv: Path):
    tree = ast.parse(EXAMPLE.read_text())
    modules = sorted(
        {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        | {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    )
    assert "pipecat_veena" in {m.split(".")[0] for m in modules}
    code = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)\n"
    _run([venv / "python", "-c", code, *modules], cwd=venv.parent)


@pytest.mark.vllm
def test_say_on_the_demo_checkpoint_from_the_wheel(venv: Path):
    out = venv.parent / "hello.wav"
    _run([venv / "pipecat-veena", "say", "नमस्ते! Hello from the wheel.", "-o", out],
         cwd=venv.parent)  # fmt: skip
    with wave.open(str(out)) as wav:
        assert wav.getnframes() > 0 and wav.getframerate() > 0


@pytest.mark.vllm
def test_serve_from_the_wheel_with_the_playground(venv: Path):
    port = free_port()
    log = venv.parent / "serve.log"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen(
        [str(venv / "pipecat-veena"), "serve", "--port", str(port)],
        cwd=venv.parent, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    children: list[psutil.Process] = []
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + READY_S
        with httpx.Client(base_url=base, timeout=30) as http:
            while True:
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "never ready:\n" + log.read_text()[-3000:]
                try:
                    if http.get("/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.5)
            children = psutil.Process(proc.pid).children(recursive=True)
            health = http.get("/health").json()
            assert health["status"] == "ok" and health["version"], health
            page = http.get("/")
            assert page.status_code == 200 and "<html" in page.text.lower()
            assets = re.findall(r'(?:src|href)="(/playground/[^"]+)"', page.text)
            assert any(a.endswith(".js") for a in assets), assets
            for asset in assets:
                assert http.get(asset).status_code == 200, asset
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0, log.read_text()[-3000:]
        psutil.wait_procs(children, timeout=30)
        assert not [c for c in children if c.is_running() and c.status() != "zombie"]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        for child in children:
            if child.is_running():
                child.kill()


def test_the_dockerfile_passes_hadolint_and_installs_the_wheel():
    dockerfile = ROOT / "examples" / "k8s" / "Dockerfile"
    hadolint = Path(sys.executable).with_name("hadolint")
    out = subprocess.run([str(hadolint), str(dockerfile)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    text = dockerfile.read_text()
    # the two steps this module proves: a wheel of the tree, then that wheel with its extras
    assert "pip wheel --no-deps" in text and "pipecat_veena-*.whl)[gpu,server]" in text
