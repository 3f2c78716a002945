"""The Ray Serve application on a local Ray cluster: 2 CPU replicas on the spark-tiny demo.

One cluster for the session (``ray_local``), given examples/ray_serve_cpu.yaml by ``serve run``
as the README says. Checked: the same API as ``pipecat-veena serve`` through Serve's proxy
(WebSocket, OpenAI route, /health, /ready, /metrics), calls spread over both replicas and
staying on theirs, failover (a replica's actor process killed under load: no hang, clear
errors after first audio, the utterance that had none retried on the live replica, and Serve
bringing the dead one back), a replica whose engine process died being replaced (Serve's
health probe), and a redeploy replacing both replicas one at a time under phone-call-like load
(each old replica drains: goaway, in-flight utterances finish, close 1012; no turn fails or
replays audio). Nothing Ray started may outlive the session.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter

import httpx
import openai
import psutil
import pytest
import yaml
from ray_local import (
    ROOT,
    deploy_config,
    local_cluster,
    replica_pids,
    running_replicas,
    wait_replaced,
    wait_running,
)
from server_fakes import RawClient, pcm_of
from servers import assert_no_turn_lost
from websockets.exceptions import ConnectionClosed

from pipecat_veena.errors import RemoteError
from pipecat_veena.remote import RemoteVeenaEngine
from pipecat_veena.remote.protocol import CLOSE_GOING_AWAY, STREAM_PATH, ErrorCode, GoAway

sys.path.insert(0, str(ROOT))

from benchmarks._load_calls import CallPlan  # noqa: E402
from benchmarks.load import run_level  # noqa: E402

pytest.importorskip("ray.serve")

pytestmark = [pytest.mark.ray, pytest.mark.vllm, pytest.mark.slow]

HEADER = "x-veena-replica"
SENTENCE = "Your order has shipped and will reach you by Monday evening. "


@pytest.fixture(scope="session")
def serve_url(spark_tiny_checkpoint) -> str:
    """examples/ray_serve_cpu.yaml (2 CPU replicas on spark-tiny) deployed with ``serve run`` on
    a local Ray cluster; the proxy's base URL."""
    with local_cluster(num_cpus=2) as port:
        deploy_config(ROOT / "examples" / "ray_serve_cpu.yaml")
        wait_running(2)
        yield f"http://127.0.0.1:{port}"


def _ws(url: str) -> str:
    return url.replace("http://", "ws://") + STREAM_PATH


def _server_tag(request_id: str) -> str:
    """The server's tag in a request id (``ws-<tag>-<n>``): one per replica."""
    return request_id.split("-")[1]


def _replica_of(engine: RemoteVeenaEngine) -> str:
    """The replica a RemoteVeenaEngine's connection reached (the proxy's handshake header)."""
    return engine._links[0]._conn.ws.response.headers[HEADER]  # (a test may look inside)


def _all_ended(procs: list[psutil.Process], timeout_s: float) -> bool:
    """Wait until every process has ended (a zombie has: only its exit status is left)."""

    def ended(p: psutil.Process) -> bool:
        try:
            return p.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    deadline = time.monotonic() + timeout_s
    while not all(ended(p) for p in procs):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


async def test_the_same_api_through_serve(serve_url):
    async with httpx.AsyncClient(base_url=serve_url, timeout=30) as http:
        health = await http.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        ready = await http.get("/ready")
        assert ready.status_code == 200 and ready.json()["status"] == "ready"
        assert ready.headers[HEADER]
        metrics = await http.get("/metrics")
        assert metrics.status_code == 200
        assert "veena_active_streams" in metrics.text and "veena_ready 1.0" in metrics.text
        voices = (await http.get("/v1/audio/voices")).json()
        assert voices["voices"] and "alloy" in str(voices) and voices["demo"] is True
        page = await http.get("/")  # the playground
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert (await http.get("/v1/models")).status_code == 200
        bad = await http.post(
            "/v1/audio/speech",
            json={"model": "tts-1", "input": "Hi.", "voice": "alloy", "response_format": "ogg"},
        )
        assert bad.status_code == 400 and "pcm" in bad.text  # the server's own error

    client = openai.AsyncOpenAI(base_url=f"{serve_url}/v1", api_key="unused")
    async with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=SENTENCE, response_format="pcm"
    ) as response:
        pcm = await response.read()
    assert len(pcm) > 24000 and len(pcm) % 2 == 0  # > 0.5 s at 24 kHz

    async with RawClient.connect(_ws(serve_url)) as ws:
        assert ws.ws.response.headers[HEADER]
        assert ws.ready.sample_rate == 16000 and ws.ready.voices
        await ws.send({"type": "speak", "id": "u1", "text": SENTENCE, "options": {"seed": 3}})
        frames, done = await ws.until_end("u1")
        assert done.type == "done" and done.reason == "completed"
        assert len(pcm_of(frames)) // 2 == round(done.audio_seconds * 16000)
        await ws.send({"type": "speak", "id": "u2", "text": "Hi.", "voice": "robot"})
        _, error = await ws.until_end("u2")
        assert error.code == ErrorCode.UNKNOWN_VOICE and error.ended

    async with RemoteVeenaEngine(serve_url) as engine:
        chunks = [c async for c in engine.stream(SENTENCE, seed=3)]
    assert sum(len(c.pcm) for c in chunks) == len(pcm_of(frames))  # same seed, same audio


async def test_calls_spread_over_replicas_and_stay_on_theirs(serve_url):
    async with asyncio.timeout(120):
        calls = []
        try:
            for _ in range(6):  # held open together, like six calls in progress
                cm = RawClient.connect(_ws(serve_url))
                calls.append((cm, await cm.__aenter__()))
            landed = Counter(ws.ws.response.headers[HEADER] for _, ws in calls)
            assert len(landed) == 2 and min(landed.values()) >= 2, landed

            async def two_utterances(ws) -> set[str]:
                tags = set()
                for n in range(2):
                    await ws.send({"type": "speak", "id": f"u{n}", "text": SENTENCE})
                    _, done = await ws.until_end(f"u{n}")
                    assert done.type == "done", done
                    tags.add(_server_tag(done.request_id))
                return tags

            per_call = await asyncio.gather(*(two_utterances(ws) for _, ws in calls))
        finally:
            for cm, _ in calls:
                await cm.__aexit__(None, None, None)
    assert all(len(tags) == 1 for tags in per_call)  # a call's utterances stay on its replica
    assert len(set().union(*per_call)) == 2


async def test_a_killed_replica_fails_clearly_retries_and_comes_back(serve_url):
    engines = [RemoteVeenaEngine(serve_url, connect_timeout_s=30) for _ in range(4)]
    for engine in engines:
        await engine.start()
    try:
        landed = [_replica_of(e) for e in engines]
        pids = replica_pids()
        assert set(landed) == set(pids) and len(pids) == 2, (landed, pids)
        victim = landed[0]
        # vLLM's EngineCore of the victim: it must not outlive its replica (Ray ends the dead
        # worker's process group; an orphan would no longer be a child of this process)
        engine_cores = psutil.Process(pids[victim]).children(recursive=True)
        assert engine_cores
        outcomes: list[tuple[str, bool, BaseException | None]] = []
        stop = asyncio.Event()

        async def utter(engine: RemoteVeenaEngine, text: str):
            audio = False
            try:
                async with asyncio.timeout(60):  # a hang shows as "hung", never blocks the test
                    async for _ in engine.stream(text):
                        audio = True
                return "ok", audio, None
            except TimeoutError:
                return "hung", audio, None
            except Exception as e:
                return "error", audio, e

        async def call(i: int, engine: RemoteVeenaEngine) -> None:
            n = 0
            while not stop.is_set():
                outcomes.append(await utter(engine, f"Caller {i}, sentence {n}. " + SENTENCE * 2))
                n += 1

        load = [asyncio.create_task(call(i, e)) for i, e in enumerate(engines)]
        await asyncio.sleep(2.0)
        # Freeze the victim, start an utterance on a call it holds (no audio can come), kill it.
        os.kill(pids[victim], signal.SIGSTOP)
        early = asyncio.create_task(utter(engines[0], "This starts while its replica is frozen."))
        await asyncio.sleep(1.0)
        os.kill(pids[victim], signal.SIGKILL)
        assert await early == ("ok", True, None)  # retried, on the live replica
        assert await asyncio.to_thread(_all_ended, engine_cores, 15.0)
        assert engines[0].stats()["retries"] >= 1
        await asyncio.sleep(3.0)  # the load goes on, on the live replica
        stop.set()
        await asyncio.gather(*load)
    finally:
        for engine in engines:
            await engine.shutdown()

    kinds = Counter(kind for kind, _, _ in outcomes)
    assert kinds["hung"] == 0 and kinds["ok"] > 0, kinds
    for kind, audio, error in outcomes:
        if kind == "error":  # only what was cut after its first audio; said plainly
            assert audio and isinstance(error, RemoteError), error
            assert "after the first audio" in str(error), error

    # Serve brings the dead replica back (a new actor), and new calls reach it.
    await asyncio.to_thread(wait_replaced, victim, 2)
    revived = replica_pids()
    assert len(revived) == 2 and victim not in revived, revived
    await test_calls_spread_over_replicas_and_stay_on_theirs(serve_url)
    assert running_replicas() == 2


async def test_a_replica_whose_engine_died_is_replaced(serve_url):
    tag, pid = sorted(replica_pids().items())[0]
    replica = psutil.Process(pid)
    engine_cores = [p for p in replica.children(recursive=True) if "EngineCore" in p.name()]
    assert engine_cores
    for proc in engine_cores:  # vLLM's engine process dies; the replica's process lives on
        proc.kill()
    async with httpx.AsyncClient(base_url=serve_url, timeout=10) as http:
        async with asyncio.timeout(30):
            while True:  # the proxy asks either replica; vLLM notices its engine gone in ~1 s
                health = await http.get("/health")
                if health.headers[HEADER] == tag and health.status_code != 200:
                    break
                await asyncio.sleep(0.1)
    assert health.status_code == 503 and health.json()["detail"] == "the engine stopped"
    # Serve's health probe fails too, so Serve replaces the replica (its process ends)
    await asyncio.to_thread(wait_replaced, tag, 2)
    assert tag not in replica_pids() and len(replica_pids()) == 2
    assert await asyncio.to_thread(_all_ended, [replica], 30.0)


#: The replicas' drain deadline in the redeploy: longer than any utterance takes on this shared
#: CPU, so that no in-flight utterance is cut by the deadline itself (Serve's grace follows it).
ROLL_DRAIN_TIMEOUT_S = 300.0
#: The longest a turn may wait for its first audio during the roll: a turn that meets a draining
#: replica is refused at once and goes to a new connection, which the proxy routes to the live
#: replica; with one replica serving three calls on a shared 2-core CPU, first audio takes
#: seconds. Generous, so that it cannot flake (the report gives the measured figure).
ROLL_HANDOVER_BOUND_S = 20.0


def _wait_rolled(old: set[str], replicas: int, timeout_s: float = 600.0) -> float:
    """Wait until ``replicas`` replicas run and none of ``old`` is alive; returns seconds."""
    start = time.monotonic()
    while running_replicas() < replicas or old & set(replica_pids()):
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"Serve did not replace replicas {old} in {timeout_s} s")
        time.sleep(0.5)
    return time.monotonic() - start


async def _watch(ws: RawClient, start: float) -> tuple[float | None, int | None, float | None]:
    """An idle call's connection during the roll: when it got ``goaway``, its close code and
    when it closed (seconds after ``start``). It says ``cancel`` now and then (not idle)."""
    told = None
    try:
        while True:
            try:
                message = await ws.recv(wait_s=20.0)
            except TimeoutError:
                await ws.send({"type": "cancel", "id": "keepalive"})
                continue
            if isinstance(message, GoAway) and told is None:
                told = time.monotonic() - start
    except ConnectionClosed:
        return told, ws.ws.close_code, time.monotonic() - start


async def test_a_redeploy_replaces_replicas_without_losing_a_turn(serve_url, tmp_path):
    """A new version (changed args: Serve replaces every replica, one at a time) under three
    calls through the proxy: each old replica drains, and no turn fails or gets audio twice."""
    config = yaml.safe_load((ROOT / "examples" / "ray_serve_cpu.yaml").read_text())
    (app,) = config["applications"]
    app["args"]["server"] = {"drain_timeout_s": ROLL_DRAIN_TIMEOUT_S}
    new_version = tmp_path / "ray_serve_cpu_v2.yaml"
    new_version.write_text(yaml.safe_dump(config))
    old = replica_pids()
    assert len(old) == 2
    # Idle calls held open on the old replicas: each must be told to go and closed with 1012.
    watchers = []
    for _ in range(4):
        cm = RawClient.connect(_ws(serve_url))
        watchers.append((cm, await cm.__aenter__()))
    on = Counter(ws.ws.response.headers[HEADER] for _, ws in watchers)
    start = time.monotonic()
    watching = [asyncio.create_task(_watch(ws, start)) for _, ws in watchers]
    took: dict[str, float] = {}

    async def redeploy() -> str:
        begun = time.monotonic()
        await asyncio.to_thread(deploy_config, new_version)
        took["rolled_s"] = await asyncio.to_thread(_wait_rolled, set(old), 2)
        took["redeploy_s"] = time.monotonic() - begun
        return f"replaced {sorted(old)} by {sorted(replica_pids())}"

    plan = CallPlan(pause_s=(0.3, 1.5), hang_s=300.0)
    try:
        level = await run_level(
            serve_url, 3, 900.0, plan, seed=11, fault=redeploy, fault_at_s=5.0,
            progress=False, after_fault_s=10.0,
        )  # fmt: skip
        async with asyncio.timeout(30):
            watched = await asyncio.gather(*watching)
    finally:
        for task in watching:
            task.cancel()
        for cm, _ in watchers:
            await cm.__aexit__(None, None, None)
    print({**level, **took, "watchers_on": dict(on), "watched": watched})  # for the report
    assert level["fault"].startswith("replaced"), level["fault"]
    assert not set(old) & set(replica_pids()) and running_replicas() == 2
    for told, code, closed in watched:  # every idle call was told and let go, not cut
        assert told is not None and code == CLOSE_GOING_AWAY, watched
        assert closed - told < 10.0, watched
    assert_no_turn_lost(level, ROLL_HANDOVER_BOUND_S)
