"""The vLLM engine process never outlives its owner: shut down on SIGTERM (and at exit)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.vllm

SCRIPT = """
import asyncio, os, sys
from pipecat_veena.generation.vllm_local import VllmGenerator

async def main():
    generator = VllmGenerator(sys.argv[1], max_model_len=512, max_num_seqs=2)
    await generator.start()
    print("ready", flush=True)
    await asyncio.sleep(600)

if __name__ == "__main__":
    asyncio.run(main())
"""


@pytest.mark.parametrize("how", ["sigterm", "exit"])
def test_engine_process_ends_with_its_owner(tmp_path: Path, spark_tiny_checkpoint: Path, how):
    script = tmp_path / "owner.py"
    body = SCRIPT if how == "sigterm" else SCRIPT.replace("await asyncio.sleep(600)", "pass")
    script.write_text(body)
    env = dict(os.environ, VLLM_LOGGING_LEVEL="WARNING")
    owner = subprocess.Popen(
        [sys.executable, str(script), str(spark_tiny_checkpoint / "LLM")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        # vLLM logs to stdout too: read up to our marker (or EOF if the owner died).
        assert any(line.strip() == "ready" for line in owner.stdout), "the engine never started"
        engines = [
            p for p in psutil.Process(owner.pid).children(recursive=True) if "python" in p.name()
        ]
        assert engines, "no engine process was started"
        if how == "sigterm":
            owner.send_signal(signal.SIGTERM)
        owner.wait(timeout=60)
        assert owner.returncode in (0, -signal.SIGTERM, 128 + signal.SIGTERM)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_alive(p) for p in engines):
            time.sleep(0.2)
        assert not [p.pid for p in engines if _alive(p)], "engine process orphaned"
    finally:
        if owner.poll() is None:
            owner.kill()


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
