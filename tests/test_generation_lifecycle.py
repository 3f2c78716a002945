"""The vLLM engine process never outlives its owner: shut down on SIGTERM (and at exit), also
when the engine runs on a thread of its own (EngineThread, the LiveKit path); and a reader in
another event loop is told when that thread's engine shuts down under it."""

from __future__ import annotations

import asyncio
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
    print("ready", os.environ.get("OMP_NUM_THREADS"), os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
          flush=True)
    await asyncio.sleep(600)

if __name__ == "__main__":
    asyncio.run(main())
"""


THREAD_SCRIPT = """
import asyncio, sys, time
from pathlib import Path
from pipecat_veena.engine import EngineConfig
from pipecat_veena.engine_thread import EngineThread
from pipecat_veena.errors import EngineNotRunningError

async def read_while_shutting_down(host):
    stream = host.stream("A long answer that keeps going on and on. " * 4, seed=1)
    await anext(stream)
    reader = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0.1)
    await host.shutdown()
    try:
        async with asyncio.timeout(30):
            while True:
                await reader
                reader = asyncio.ensure_future(stream.__anext__())
    except EngineNotRunningError as e:
        print("reader-ended:", e, flush=True)

if __name__ == "__main__":
    config = EngineConfig(checkpoint=Path(sys.argv[1]), warmup=False, max_model_len=1024,
                          max_num_seqs=4)
    host = EngineThread.launch(config)
    print("ready", flush=True)
    if sys.argv[2] == "reader":
        asyncio.run(read_while_shutting_down(host))
    else:
        time.sleep(600)
"""


#: What the generator sets for vLLM's processes on a CPU unless the user set it.
_OMP_NAMES = ("OMP_WAIT_POLICY", "VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS")


@pytest.mark.parametrize("how", ["sigterm", "exit", "thread-sigterm", "thread-reader"])
def test_engine_process_ends_with_its_owner(tmp_path: Path, spark_tiny_checkpoint: Path, how):
    if how.startswith("thread"):
        body = THREAD_SCRIPT
        args = [str(spark_tiny_checkpoint), how.removeprefix("thread-")]
    else:
        body = SCRIPT if how == "sigterm" else SCRIPT.replace("await asyncio.sleep(600)", "pass")
        args = [str(spark_tiny_checkpoint / "LLM")]
    env = {k: v for k, v in os.environ.items() if k not in _OMP_NAMES}
    owner = _spawn_owner(tmp_path, body, args, env)
    children: list[psutil.Process] = []
    try:
        # vLLM logs to stdout too: read up to our marker (or EOF if the owner died).
        ready = next((line.split() for line in owner.stdout if line.startswith("ready")), None)
        assert ready is not None, "the engine never started"
        children = psutil.Process(owner.pid).children(recursive=True)
        engines = _engine_processes(psutil.Process(owner.pid))
        assert engines, "no engine process was started"
        if how == "sigterm":  # one engine start checks the OpenMP settings too
            _assert_openmp_settings(owner, ready, {})
        if how.endswith("sigterm"):
            owner.send_signal(signal.SIGTERM)
        if how == "thread-reader":
            rest = owner.stdout.read()
            assert "reader-ended:" in rest and "shut down" in rest, rest[-500:]
        owner.wait(timeout=60)
        assert owner.returncode in (0, -signal.SIGTERM, 128 + signal.SIGTERM)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_alive(p) for p in children):
            time.sleep(0.2)
        assert not [p.pid for p in engines if _alive(p)], "engine process orphaned"
        assert not [p.pid for p in children if _alive(p)], "a process of the engine orphaned"
    finally:
        _stop(owner, children)


def test_engine_processes_keep_the_openmp_settings_the_user_chose(
    tmp_path: Path, spark_tiny_checkpoint: Path
):
    # (Our own settings are checked by test_engine_process_ends_with_its_owner[sigterm].)
    chosen = {"OMP_WAIT_POLICY": "ACTIVE", "VLLM_CPU_OMP_THREADS_BIND": "0"}
    env = {k: v for k, v in os.environ.items() if k not in _OMP_NAMES} | chosen
    owner = _spawn_owner(tmp_path, SCRIPT, [str(spark_tiny_checkpoint / "LLM")], env)
    children: list[psutil.Process] = []
    try:
        ready = next((line.split() for line in owner.stdout if line.startswith("ready")), None)
        assert ready is not None, "the engine never started"
        children = psutil.Process(owner.pid).children(recursive=True)
        _assert_openmp_settings(owner, ready, chosen)
    finally:
        _stop(owner, children)


def _stop(owner: subprocess.Popen, children: list[psutil.Process]) -> None:
    """End an owner still running (SIGTERM, SIGKILL after 60 s), then any of its ``children``
    still alive 15 s later: nothing a test started outlives it, also when it failed."""
    if owner.poll() is None:
        owner.send_signal(signal.SIGTERM)
        try:
            owner.wait(timeout=60)
        except subprocess.TimeoutExpired:
            owner.kill()
            owner.wait()
    _, alive = psutil.wait_procs(children, timeout=15)
    for child in alive:
        child.kill()


def _assert_openmp_settings(owner: subprocess.Popen, ready: list[str], chosen: dict) -> None:
    """The engine's processes got our OpenMP settings, or the ones the user ``chosen``.

    vLLM's EngineCore runs OpenMP threads on the cores the codec shares: busy-waiting there
    takes CPU the codec needs, and vLLM's own binding (its threads pinned, its helper threads
    with them) halved the token rate on 2 cores (BENCHMARKS.md, threads). The generator sets
    OMP_WAIT_POLICY=PASSIVE, VLLM_CPU_OMP_THREADS_BIND=nobind and OMP_NUM_THREADS=cores - 1
    while vLLM spawns its processes, unless the user set them; the owner's own environment
    (``ready``: what the owner printed once its engine started) keeps none of the last two.
    EngineCore renames itself (setproctitle), which blanks its /proc environ; the process
    spawned beside it (multiprocessing's resource tracker) shows the environment they got.
    """
    cores = len(os.sched_getaffinity(0))
    ours = {"OMP_WAIT_POLICY": "PASSIVE", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": str(max(1, cores - 1))}  # fmt: skip
    compared = _OMP_NAMES if not chosen else tuple(chosen)  # vLLM's own binding sets the count
    assert ready[1:] == ["None", chosen.get("VLLM_CPU_OMP_THREADS_BIND", "None")]
    seen = []
    for child in psutil.Process(owner.pid).children(recursive=True):
        try:
            child_env = child.environ()
        except psutil.Error:
            continue
        if child_env:  # not blanked by a process title
            seen.append({name: child_env.get(name) for name in compared})
    assert seen, "no process spawned by the engine shows its environment"
    expected = {name: (chosen or ours)[name] for name in compared}
    assert all(got == expected for got in seen), seen
    if not chosen:  # unpinned: the engine may run on every core its owner may
        engine = _engine_processes(psutil.Process(owner.pid))
        assert engine and all(set(c.cpu_affinity()) == os.sched_getaffinity(0) for c in engine), [
            c.cpu_affinity() for c in engine
        ]


def _spawn_owner(
    tmp_path: Path, body: str, args: list[str], env: dict[str, str]
) -> subprocess.Popen:
    """Run the owner script ``body`` (it prints "ready" once its engine started), vLLM quiet."""
    script = tmp_path / "owner.py"
    script.write_text(body)
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**env, "VLLM_LOGGING_LEVEL": "WARNING"},
    )


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_the_engine_starts_off_the_event_loop_and_a_shutdown_meanwhile_releases_it(
    spark_tiny_checkpoint: Path,
):
    """vLLM's blocking construction runs on a worker thread: the loop keeps turning (a server's
    /health answers) and a shutdown during the start waits for the build, then ends its
    engine process; the start then says why it did not finish."""
    from pipecat_veena.errors import EngineNotRunningError
    from pipecat_veena.generation.vllm_local import VllmGenerator

    loop = asyncio.get_running_loop()
    gaps: list[float] = []
    engines: dict[int, psutil.Process] = {}
    # Engines of the session's shared fixtures are children too: only new ones are this start's.
    earlier = {p.pid for p in _engine_processes()}

    async def tick() -> None:
        last = loop.time()
        while True:
            await asyncio.sleep(0.05)
            gaps.append(loop.time() - last)
            last = loop.time()
            if len(gaps) % 10 == 0:  # the engine processes vLLM has started so far
                engines.update((p.pid, p) for p in _engine_processes() if p.pid not in earlier)

    generator = VllmGenerator(spark_tiny_checkpoint / "LLM", max_model_len=512, max_num_seqs=2)
    ticker = asyncio.ensure_future(tick())
    began = loop.time()
    start = asyncio.ensure_future(generator.start())
    try:
        await asyncio.sleep(1.0)  # well inside the build (seconds on CPU)
        assert not start.done()
        await generator.shutdown()
        with pytest.raises(EngineNotRunningError, match="shut down while it started"):
            await start
        took = loop.time() - began
    finally:
        ticker.cancel()
        await generator.shutdown()
    assert not generator.is_running
    # Blocking, the start held the loop for all of its build; now the loop turns throughout.
    assert max(gaps) < max(1.0, took / 10), f"the loop stalled {max(gaps):.1f} s of {took:.1f} s"
    assert engines, "no engine process was seen during the start"
    _, alive = psutil.wait_procs(list(engines.values()), timeout=15)
    assert not [p.pid for p in alive if _alive(p)], "engine process left running"
    assert not [p for p in _engine_processes() if p.pid not in earlier]


def _engine_processes(root: psutil.Process | None = None) -> list[psutil.Process]:
    """The live vLLM engine processes under ``root`` (this process by default)."""
    found = []
    for p in (root or psutil.Process()).children(recursive=True):
        try:
            if "VLLM" in p.name() or "EngineCore" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:
            pass
    return [p for p in found if _alive(p)]
