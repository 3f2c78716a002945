"""The engine comes back by itself (issue 37 item 3), through the real parts: the vLLM CPU engine
on the demo checkpoint, whose ``EngineCore`` process is SIGKILLed (as a GPU fault or the OOM
killer would end it), under the in-process engine, the real server on a socket, a
RemoteVeenaEngine and a real Pipecat pipeline. One engine (its own vLLM) serves the module and
is killed once per test; a ``serve`` process whose restarts fail shows the exit. Each start of
vLLM costs about 20 s here, so they are few.

Before this, a killed engine stayed dead: in-flight streams ended, then ``/health`` said 503
and every later request failed until the process was replaced (an in-process Pipecat bot had no
engine for the rest of its life)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
import pytest_asyncio
from pipecat.frames.frames import EndFrame, ErrorFrame, TTSAudioRawFrame, TTSSpeakFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection
from pipecat.tests.utils import QueuedFrameProcessor
from pipecat.workers.runner import WorkerRunner
from server_fakes import RawClient, until_ready
from servers import assert_ended, kill_leftovers
from test_generation_lifecycle import _engine_processes
from websockets.exceptions import ConnectionClosed, InvalidStatus

from pipecat_veena.engine import EngineConfig, VeenaEngine
from pipecat_veena.errors import EngineDeadError, RemoteError
from pipecat_veena.remote import RemoteVeenaEngine
from pipecat_veena.remote.protocol import AudioFrame, ErrorCode
from pipecat_veena.server import ServerHandle, create_app
from pipecat_veena.server.settings import ServerSettings
from pipecat_veena.service import VeenaTTSService

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parent.parent
LONG = "This sentence keeps the engine busy for a while, long enough to be cut. " * 4
#: Bounds, not timings: a restart of the CPU engine takes about 20 s on a quiet machine.
RESTART_BOUND_S = 180


class _Engine:
    """The module's engine and the vLLM processes it started (not the session's)."""

    def __init__(self, engine: VeenaEngine, others: set[int]) -> None:
        self.engine = engine
        self.others = others  # engine processes that are not this engine's

    def cores(self) -> list[psutil.Process]:
        return [p for p in _engine_processes() if p.pid not in self.others]

    def kill(self) -> list[psutil.Process]:
        """SIGKILL this engine's vLLM process(es); returns them."""
        cores = self.cores()
        assert cores, "no engine process to kill"
        for p in cores:
            p.kill()
        return cores

    async def back(self) -> None:
        assert await asyncio.wait_for(self.engine.wait_running(), RESTART_BOUND_S)


@pytest_asyncio.fixture(scope="module")
async def victim(spark_tiny_checkpoint) -> _Engine:
    others = {p.pid for p in _engine_processes()}
    engine = VeenaEngine(
        EngineConfig(
            checkpoint=spark_tiny_checkpoint,
            warmup=False,
            max_model_len=1024,
            max_num_seqs=8,
            restart_backoff_s=0.2,
            codec_dtype="bfloat16",  # (no timed probe at start)
        )
    )
    await engine.start()
    victim = _Engine(engine, others)
    try:
        yield victim
    finally:
        cores = victim.cores()
        await engine.shutdown()
    assert await asyncio.to_thread(_ended, cores)  # nothing left: not the last one either


def _ended(processes: list[psutil.Process]) -> bool:
    """True when each process exited and was reaped (no zombie left either)."""
    _, alive = psutil.wait_procs(processes, timeout=15)
    return not alive


async def _speak(engine, text: str = "After the restart.") -> int:
    return sum([len(c.pcm) async for c in engine.stream(text, seed=3)])


async def test_in_process_engine_fails_in_flight_streams_then_comes_back(victim):
    engine = victim.engine
    restarts = engine.restarts
    stream = engine.stream(LONG, seed=1)
    await anext(stream)  # in flight, audio flowing
    killed = victim.kill()
    with pytest.raises(EngineDeadError) as caught:
        async with asyncio.timeout(30):  # a bound, not a timing: it ends "at once"
            async for _ in stream:
                pass
    assert caught.value.retryable
    assert engine.state == "restarting" and not engine.is_running
    with pytest.raises(EngineDeadError, match="restarting") as refused:
        await _speak(engine)
    assert refused.value.retryable
    await victim.back()
    assert engine.state == "running" and engine.restarts == restarts + 1
    assert await _speak(engine) > 0
    # the dead engine was reaped by the engine itself (a zombie would still have its pid)
    assert not [p.pid for p in killed if psutil.pid_exists(p.pid)]
    assert len(victim.cores()) == len(killed)  # one new engine, nothing more


async def test_server_probes_clients_and_remote_engine_through_a_restart(victim):
    engine = victim.engine
    app = create_app(engine, ServerSettings(), owns_engine=False, demo=True)
    handle = await ServerHandle(app).start()
    remote = RemoteVeenaEngine(handle.ws_url, connect_timeout_s=RESTART_BOUND_S)
    try:
        await handle.state.wait_started()
        await remote.start()
        async with (
            httpx.AsyncClient(base_url=handle.url, timeout=30) as http,
            RawClient.connect(handle.ws_url) as client,
        ):
            await client.send({"type": "speak", "id": "inflight", "text": LONG})
            assert isinstance(await client.recv(), AudioFrame)
            remote_first = asyncio.ensure_future(_speak(remote, LONG))
            victim.kill()
            _, end = await client.until_end("inflight")
            assert end.type == "error" and end.code == ErrorCode.ENGINE_UNAVAILABLE and end.ended
            # restarting: alive (liveness must not kill the pod) but not ready, and says so
            assert engine.state == "restarting"
            ready = await http.get("/ready")
            assert ready.status_code == 503 and ready.json()["status"] == "engine_unavailable"
            assert "restarting" in ready.json()["detail"]
            assert (await http.get("/health")).status_code == 200
            speech = await http.post("/v1/audio/speech", json={"input": "During the restart."})
            assert speech.status_code == 503 and speech.headers["retry-after"]
            assert speech.json()["error"]["code"] == "engine_unavailable"
            await client.send({"type": "speak", "id": "early", "text": "Too early."})
            _, refused = await client.until_end("early")
            assert refused.code == ErrorCode.ENGINE_UNAVAILABLE
            await victim.back()
            assert (await http.get("/ready")).status_code == 200
            assert (await http.get("/health")).status_code == 200
            await client.send({"type": "speak", "id": "after", "text": "After the restart."})
            frames, done = await client.until_end("after", wait_s=120)
            assert done.type == "done" and done.reason == "completed" and frames
        # The remote engine: what it had in flight either failed after its first audio (said
        # so) or was handed over and spoken once the engine was back; it dialed again.
        try:
            assert await remote_first > 0
        except RemoteError as e:
            assert "after the first audio" in str(e), e
        assert await _speak(remote) > 0
        assert remote.stats()["connects"] >= 2
    finally:
        await remote.shutdown()
        await handle.stop()


async def test_pipecat_bot_loses_the_turn_in_progress_and_speaks_the_next(victim):
    engine = victim.engine
    tts = VeenaTTSService(engine, seed=7)
    up: asyncio.Queue = asyncio.Queue()
    down: asyncio.Queue = asyncio.Queue()
    pipeline = Pipeline([
        QueuedFrameProcessor(queue=up, queue_direction=FrameDirection.UPSTREAM),
        tts,
        QueuedFrameProcessor(queue=down, queue_direction=FrameDirection.DOWNSTREAM),
    ])  # fmt: skip
    worker = PipelineWorker(
        pipeline,
        cancel_on_idle_timeout=False,
        params=PipelineParams(audio_out_sample_rate=16000),
    )
    started = asyncio.Event()
    seen_up: list = []
    seen_down: list = []

    @worker.event_handler("on_pipeline_started")
    async def _started(worker, frame):
        started.set()

    async def first(queue: asyncio.Queue, into: list, kind: type):
        while True:
            frame = await queue.get()
            into.append(frame)
            if isinstance(frame, kind):
                return frame

    async def drive() -> None:
        await asyncio.wait_for(started.wait(), 30)
        await worker.queue_frame(TTSSpeakFrame(LONG))
        turn1 = await asyncio.wait_for(first(down, seen_down, TTSAudioRawFrame), 60)
        victim.kill()
        error = await asyncio.wait_for(first(up, seen_up, ErrorFrame), 60)
        assert not error.fatal and isinstance(error.exception, EngineDeadError)
        await victim.back()  # the bot lives on; its next turn comes after the restart
        await worker.queue_frame(TTSSpeakFrame("The next turn speaks."))
        while True:
            frame = await asyncio.wait_for(first(down, seen_down, TTSAudioRawFrame), 120)
            if frame.context_id != turn1.context_id:
                break
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner()
    await runner.add_workers(worker)
    await asyncio.gather(runner.run(), drive())
    assert not [f for f in seen_up if isinstance(f, ErrorFrame) and f.fatal]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_serve_exits_non_zero_when_the_engine_cannot_come_back(
    spark_tiny_checkpoint, tmp_path
):
    """``pipecat-veena serve`` whose checkpoint broke after its start: every restart fails, then
    ``/health`` says 503 and the process exits 1, leaving no engine process behind."""
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(spark_tiny_checkpoint, checkpoint)
    port = _free_port()
    log = tmp_path / "serve.log"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pipecat_veena.cli", "serve", "--model", str(checkpoint),
        "--port", str(port), "--voices-file", str(tmp_path / "voices.json"),
        stdout=log.open("w"), stderr=subprocess.STDOUT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    children: list[psutil.Process] = []
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            await until_ready(http, proc, log)
            children = psutil.Process(proc.pid).children(recursive=True)
            (checkpoint / "LLM" / "config.json").unlink()  # no restart can load it now
            cores = _engine_processes(psutil.Process(proc.pid))
            assert cores
            for p in cores:
                p.kill()
            health = []
            while proc.returncode is None:  # 200 while it restarts, 503 once it gave up
                try:
                    health.append((await http.get("/health")).status_code)
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
        assert await asyncio.wait_for(proc.wait(), RESTART_BOUND_S) == 1
        out = log.read_text()
        assert "restart 3 of 3 failed" in out, out[-3000:]
        # it gave up: liveness failed ("the engine stopped"), and so it exited
        assert "could not be restarted" in out
        assert "the engine stopped; exiting with status 1" in out
        assert 200 in health  # while it restarted
        assert await asyncio.to_thread(_ended, children)
    finally:
        await kill_leftovers(proc, children)


async def test_health_answers_while_the_connection_cap_is_full(victim):
    """Finding: the connection cap answered 503 on /health too, so a flood of idle connections
    made the liveness probe kill a healthy pod. Now the probes still answer over the cap; any
    other request, WebSocket or HTTP, gets the 503."""
    settings = ServerSettings(max_connections=8)
    handle = await ServerHandle(create_app(victim.engine, settings, owns_engine=False)).start()
    try:
        await handle.state.wait_started()
        async with contextlib.AsyncExitStack() as idle:
            for _ in range(settings.max_connections):  # idle WebSockets fill the cap
                await idle.enter_async_context(RawClient.connect(handle.ws_url))
            # the bound: a probe answers within 1 s (old main: 503 at once)
            async with httpx.AsyncClient(base_url=handle.url, timeout=1.0) as http:
                health = await http.get("/health")
                assert health.status_code == 200, health.text
                assert (await http.get("/ready")).status_code == 200
                assert (await http.get("/metrics")).status_code == 200
                speech = await http.post("/v1/audio/speech", json={"input": "Over the cap."})
                assert speech.status_code == 503
                assert speech.json()["error"]["code"] == "too_many_connections"
            with pytest.raises(InvalidStatus) as refused:
                async with RawClient.connect(handle.ws_url):
                    pass
            assert refused.value.response.status_code == 503
    finally:
        await handle.stop()


async def test_second_sigterm_ends_every_utterance_before_the_close(
    spark_tiny_checkpoint, tmp_path
):
    """Finding: after a second SIGTERM, in 1 run of 4, in-flight WebSocket utterances got
    neither ``done`` nor an ended error before the close (uvicorn's forced exit closed the
    connections while the cancelled utterances' errors were still queued). Now each one ends
    with a message, then its connection closes."""
    port = _free_port()
    log = tmp_path / "serve.log"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pipecat_veena.cli", "serve", "--model", str(spark_tiny_checkpoint),
        "--port", str(port), "--drain-timeout", "120", "--voices-file", str(tmp_path / "v.json"),
        stdout=log.open("w"), stderr=subprocess.STDOUT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    children: list[psutil.Process] = []
    ws_url = f"ws://127.0.0.1:{port}/v1/audio/stream"
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            await until_ready(http, proc, log)
        children = psutil.Process(proc.pid).children(recursive=True)
        async with contextlib.AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(RawClient.connect(ws_url)) for _ in range(3)]
            for i, client in enumerate(clients):
                for j in range(2):
                    await client.send({"type": "speak", "id": f"u{i}{j}", "text": LONG})
            for client in clients:
                assert isinstance(await client.recv(wait_s=120), AudioFrame)
            proc.send_signal(signal.SIGTERM)
            for _ in range(400):
                if "draining" in log.read_text():
                    break
                await asyncio.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            for i, client in enumerate(clients):
                ends = {}
                with contextlib.suppress(ConnectionClosed):
                    while True:
                        message = await client.recv(wait_s=60)
                        uid = getattr(message, "id", None)
                        if (
                            not isinstance(message, AudioFrame)
                            and uid is not None
                            and (message.type == "done" or getattr(message, "ended", False))
                        ):
                            ends[uid] = message
                assert set(ends) == {f"u{i}0", f"u{i}1"}, (i, ends)
        await asyncio.wait_for(proc.wait(), 120)
        assert_ended(children)
    finally:
        await kill_leftovers(proc, children)
