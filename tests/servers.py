"""Run an ASGI app on a real loopback socket inside the test's event loop (uvicorn).

The app shares the test session's loop, so it can use the session's vLLM engine; the server is
stopped when the context exits, also when the test fails.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psutil
import uvicorn


@asynccontextmanager
async def serve_app(app, *, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Serve ``app`` on a free port; yields its base URL (``http://127.0.0.1:PORT``)."""
    config = uvicorn.Config(app, host=host, port=0, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve())
    try:
        async with asyncio.timeout(60):
            while not server.started:
                if task.done():
                    task.result()  # raises why the server could not start
                    raise RuntimeError("the server stopped before it started")
                await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=30)


@asynccontextmanager
async def round_robin_proxy(ports: list[int], *, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """A TCP proxy on a free port sending each new connection to the next of ``ports`` (one that
    refuses it is skipped), like a Kubernetes Service; yields its base URL."""
    turn = 0
    writers: set[asyncio.StreamWriter] = set()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal turn
        for _ in ports:
            port, turn = ports[turn % len(ports)], turn + 1
            try:
                up_reader, up_writer = await asyncio.open_connection(host, port)
                break
            except OSError:
                continue
        else:
            writer.close()
            return
        writers.update((writer, up_writer))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(handle, host, 0)
    try:
        yield f"http://{host}:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for writer in writers:
            writer.close()
        await server.wait_closed()


def assert_ended(children: list[psutil.Process]) -> None:
    """Check that a stopped server's processes (its vLLM engine) have ended too."""
    _, alive = psutil.wait_procs(children, timeout=15)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive


async def kill_leftovers(proc: asyncio.subprocess.Process, children: list[psutil.Process]) -> None:
    """A test's clean-up: kill a server process (and its engine) that is still running."""
    if proc.returncode is None:
        os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
    for child in children:
        if child.is_running():
            child.kill()


def assert_no_turn_lost(level: dict, handover_bound_s: float) -> None:
    """A rollout under load (``benchmarks.load.run_level``) lost nothing: turns completed, none
    failed, hung or got audio twice, none waited for first audio over ``handover_bound_s``,
    and nothing was left running on the servers."""
    outcomes = level["outcomes"]
    assert outcomes.get("completed", 0) > 10, outcomes
    assert not level["errors"] and "error" not in outcomes and "hung" not in outcomes, level
    assert level["replayed"] == 0  # no turn got audio twice
    assert level["ttfa_ms"]["max"] < handover_bound_s * 1000, level["ttfa_ms"]
    assert level["left_running"] == 0


@asynccontextmanager
async def engine_behind_server(
    config: Any, generator: Any, settings: Any = None
) -> AsyncIterator[tuple[Any, Any]]:
    """(engine, server handle): a ``VeenaEngine`` on ``generator`` (the session's vLLM engine,
    usually wrapped in a recorder) behind a real server on a free port; both stop on exit."""
    from pipecat_veena.engine import VeenaEngine
    from pipecat_veena.server import ServerHandle, create_app

    engine = VeenaEngine(config, generator=generator)
    await engine.start()
    handle = await ServerHandle(create_app(engine, settings, owns_engine=False)).start()
    try:
        await handle.state.wait_started()
        yield engine, handle
    finally:
        await handle.stop()
        await engine.shutdown()


def semantic_samples(engine: Any, outputs: dict[str, list[int]], rids: Any) -> int:
    """Samples the codec makes from the semantic tokens that the given engine requests
    generated (``outputs``: a recorder's ids per request)."""
    ids = engine._format.ids
    semantics = sum(
        1
        for rid in rids
        for t in outputs[rid]
        if 0 <= t - ids.semantic_base < ids.num_semantic_codes
    )
    return semantics * engine._codec.samples_per_frame


async def idle_after(engine: Any, server: Any, limit_s: float = 10.0) -> float:
    """Seconds until nothing is in flight in vLLM or on the server (``engine``: a VeenaEngine,
    ``server``: a ServerHandle); fails past ``limit_s``."""
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        if not engine.stats()["unfinished_requests"] and not server.state.slots.active:
            return time.monotonic() - start
        await asyncio.sleep(0.005)
    raise AssertionError(f"still in flight: {engine.stats()}, {server.state.slots.active}")
