"""Shared fixtures: demo checkpoints (built once, cached) and one vLLM engine per model per session.

Every engine started here is shut down at the end of the session, and the session fails if any
engine process is left behind.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest
import pytest_asyncio

os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def spark_checkpoint() -> Path:
    """The demo checkpoint in the Spark-TTS-0.5B layout with the real-size BiCodec."""
    from pipecat_veena.demo import build_demo_checkpoint

    return build_demo_checkpoint("spark")


@pytest.fixture(scope="session")
def spark_tiny_checkpoint() -> Path:
    """The same demo LLM with the reduced (fast) BiCodec config."""
    from pipecat_veena.demo import build_demo_checkpoint

    return build_demo_checkpoint("spark-tiny")


@pytest.fixture(scope="session")
def veena_checkpoint() -> Path:
    """The demo checkpoint in the Veena layout (Llama LLM with Orpheus ids + SNAC 24 kHz)."""
    from pipecat_veena.demo import build_demo_checkpoint

    return build_demo_checkpoint("veena")


async def _started_generator(model_dir: Path) -> AsyncIterator:
    from pipecat_veena.generation.vllm_local import VllmGenerator

    generator = VllmGenerator(model_dir, max_model_len=2048, max_num_seqs=32)
    try:
        await generator.start()
        yield generator
    finally:
        await generator.shutdown()


@pytest_asyncio.fixture(scope="session")
async def spark_generator(spark_tiny_checkpoint: Path) -> AsyncIterator:
    """A started vLLM CPU engine on the demo Spark LLM, shared by the whole session."""
    async for generator in _started_generator(spark_tiny_checkpoint / "LLM"):
        yield generator


@pytest.fixture(scope="session", autouse=True)
def _no_engine_left_behind() -> None:
    """Fail the session if a vLLM engine process outlives the tests."""
    yield
    engines = [
        p
        for p in psutil.Process().children(recursive=True)
        if "EngineCore" in " ".join(_cmdline(p)) or "VLLM" in _name(p)
    ]
    # An engine that exited but is not reaped yet is a zombie, not a leak: give them a moment.
    _, alive = psutil.wait_procs(engines, timeout=10)
    leftovers = [p for p in alive if _status(p) not in (psutil.STATUS_ZOMBIE, "")]
    for p in leftovers:
        p.kill()
    assert not leftovers, f"vLLM engine processes left behind: {[p.pid for p in leftovers]}"


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _status(p: psutil.Process) -> str:
    try:
        return p.status()
    except psutil.Error:
        return ""


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.Error:
        return ""


@pytest.fixture(scope="session")
def snac_random_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SNAC 24 kHz checkpoint directory with random weights (seed 0), built once per session."""
    from pipecat_veena.codecs.snac import write_random_checkpoint

    return write_random_checkpoint(tmp_path_factory.mktemp("snac_24khz"), seed=0)


@pytest.fixture
def caplog_loguru():
    """Capture loguru output (warnings and up) as text: ``caplog_loguru.text``."""
    from loguru import logger

    class _Sink:
        text = ""

        def write(self, message: str) -> None:
            _Sink.text += message

    sink = _Sink()
    handler = logger.add(sink.write, level="WARNING")
    yield sink
    logger.remove(handler)


@pytest_asyncio.fixture(scope="session")
async def veena_generator(veena_checkpoint: Path) -> AsyncIterator:
    """A started vLLM CPU engine on the demo Veena LLM (at the checkpoint root), session-wide."""
    async for generator in _started_generator(veena_checkpoint):
        yield generator


@pytest_asyncio.fixture(scope="session")
async def chromium():
    """One headless system Chromium (Playwright) for the whole session; browser tests only."""
    from browser import launch_chromium

    async for browser in launch_chromium():
        yield browser
