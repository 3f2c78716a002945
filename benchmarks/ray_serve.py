"""Ray Serve on CPU (spark-tiny demo checkpoint) against one direct server, all on this machine.

1. Time to first audio added by Serve's proxy: one call, utterances one after another, through
   the raw protocol; each utterance's transport time is the client's time to first audio minus
   the server's own (``done.ttfa_ms``), so engine noise cancels; direct server vs Serve.
2. Throughput on a load that saturates one replica (benchmarks/load.py's calls, short pauses, no
   barge-in): the direct server, Serve with 1 replica and with 2, each unpinned (any replica may
   use both cores) and pinned (each replica's processes on a core of their own, as a GPU is).
3. Failover: 4 calls on 2 replicas; one replica freezes (SIGSTOP, 1.5 s: utterances on it get
   no audio) and its actor process is then killed (SIGKILL). Hung calls, errors, retries, time
   until Serve runs 2 replicas again, and a second run's requests per replica.

    python -m benchmarks.ray_serve [--calls 24] [--duration 40] [--rounds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from websockets.asyncio.client import connect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import ray_local  # noqa: E402

from benchmarks._load_calls import CallPlan  # noqa: E402
from benchmarks._report import percentile, update_section  # noqa: E402
from benchmarks.load import run_level, spawned_server  # noqa: E402
from pipecat_veena.remote.protocol import STREAM_PATH, parse_server_message  # noqa: E402

TEXTS = [
    "Your appointment is confirmed for Monday at ten in the morning.",
    "नमस्ते! आपका order आज शाम तक deliver हो जाएगा।",
    "I have booked a table for four at eight thirty tonight.",
    "क्या मैं आपको किसी और चीज़ में मदद कर सकती हूँ?",
]
PHONE = CallPlan()  # pauses 0.5-2.5 s, 20% barged in
SATURATE = CallPlan(pause_s=(0.1, 0.3), barge_in=0.0)


# -- 1. transport time ---------------------------------------------------------------------------
async def transport_rounds(url: str, rounds: int) -> dict[str, list[float]]:
    """Client and server time to first audio (ms) of ``rounds`` utterances on one connection."""
    ws_url = url.replace("http://", "ws://") + STREAM_PATH
    client, server = [], []
    async with connect(ws_url, compression=None, max_size=None) as ws:
        await ws.recv()  # ready
        for i in range(rounds + len(TEXTS)):  # the first of each text is not counted (warm-up)
            speak = {"type": "speak", "id": f"u{i}", "text": TEXTS[i % len(TEXTS)]}
            speak["options"] = {"seed": 100 + i}
            start = time.perf_counter()
            await ws.send(json.dumps(speak))
            first = None
            while True:
                message = await ws.recv()
                if isinstance(message, bytes):
                    first = first or time.perf_counter() - start
                    continue
                done = parse_server_message(message)
                if done.type in ("done", "error"):
                    break
            if i >= len(TEXTS) and done.type == "done" and first is not None:
                client.append(first * 1000)
                server.append(done.ttfa_ms)
            await asyncio.sleep(0.2)
    return {"client": client, "server": server}


def _transport_summary(rounds: dict[str, list[float]]) -> dict[str, float]:
    transport = [c - s for c, s in zip(rounds["client"], rounds["server"], strict=True)]
    return {
        "ttfa_p50": percentile(rounds["client"], 0.5),
        "server_ttfa_p50": percentile(rounds["server"], 0.5),
        "transport_p50": percentile(transport, 0.5),
        "transport_p95": percentile(transport, 0.95),
        "n": len(transport),
    }


# -- 2. pinning replicas to cores ----------------------------------------------------------------
def pin(pid: int, cores: set[int]) -> None:
    """Put every thread of ``pid`` and of its children (vLLM's EngineCore) on ``cores``."""
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    for proc in procs:
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            try:
                os.sched_setaffinity(int(tid), cores)
            except OSError:
                pass  # a thread that just ended


def pin_replicas(pinned: bool) -> dict[str, list[int]]:
    """Each replica on a core of its own (``pinned``), or all on every core; returns the map."""
    every = set(range(os.cpu_count() or 1))
    placement = {}
    for i, (tag, pid) in enumerate(sorted(ray_local.replica_pids().items())):
        cores = {i % len(every)} if pinned else every
        pin(pid, cores)
        placement[tag] = sorted(cores)
    return placement


def cpu_groups() -> dict[str, list[psutil.Process]]:
    """This machine's processes by role: the engines' (replicas or the direct server, with vLLM's
    EngineCore), Serve's proxy, the load's clients (this process), Ray's other processes."""
    me = psutil.Process()
    below = me.children(recursive=True)
    groups: dict[str, list[psutil.Process]] = {"engines": [], "proxy": [], "clients": [me]}
    try:
        from ray._private.state import state

        actors = {int(a["Pid"]): a.get("Name") or "" for a in state.actor_table(None).values()
                  if a.get("State") == "ALIVE"}  # fmt: skip
    except Exception:  # no Ray here: the direct server and its children are the engine
        return groups | {"engines": below, "ray": []}
    taken = {me.pid}
    for proc in below:
        name = actors.get(proc.pid, "")
        if name.startswith("SERVE_REPLICA::"):
            group = [proc, *proc.children(recursive=True)]
            groups["engines"] += group
            taken |= {p.pid for p in group}
        elif name.startswith("SERVE_PROXY_ACTOR"):
            groups["proxy"].append(proc)
            taken.add(proc.pid)
    groups["ray"] = [p for p in below if p.pid not in taken]
    return groups


def _cpu_s(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


async def throughput(url: str, calls: int, duration: float) -> dict[str, Any]:
    """A saturating load's figures, and the share of the machine's cores each role used."""
    groups = cpu_groups()
    before = {name: _cpu_s(procs) for name, procs in groups.items()}
    level = await run_level(url, calls, duration, SATURATE, seed=7, progress=False)
    cores = (os.cpu_count() or 1) * level["wall_s"]
    cpu = {name: round((_cpu_s(procs) - before[name]) / cores, 3) for name, procs in groups.items()}
    figures = ("audio_s_per_s", "ttfa_ms", "rtf", "outcomes", "errors")
    engine_cpu_per_audio_s = (
        cpu["engines"] * cores / max(level["audio_s_per_s"] * level["wall_s"], 1e-9)
    )
    return {k: level[k] for k in figures} | {
        "cpu_share": cpu,
        "engine_cpu_s_per_audio_s": round(engine_cpu_per_audio_s, 4),
    }


# -- 3. failover ---------------------------------------------------------------------------------
class Killer:
    """Freezes one replica for ``freeze_s``, then SIGKILLs its actor process; times the revival."""

    def __init__(self, freeze_s: float = 1.5) -> None:
        self.freeze_s = freeze_s
        self.victim: str | None = None
        self.recovered_s: float | None = None
        self._thread: threading.Thread | None = None

    async def __call__(self) -> str:
        self.victim, pid = sorted(ray_local.replica_pids().items())[0]
        os.kill(pid, signal.SIGSTOP)
        await asyncio.sleep(self.freeze_s)
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()

        def watch() -> None:
            ray_local.wait_replaced(self.victim, 2)
            self.recovered_s = time.monotonic() - killed

        self._thread = threading.Thread(target=watch, daemon=True)
        self._thread.start()
        return f"replica {self.victim} frozen {self.freeze_s:g} s, then killed"

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()


# -- the run -------------------------------------------------------------------------------------
async def direct_phase(url: str, a: argparse.Namespace) -> dict[str, Any]:
    return {
        "transport": _transport_summary(await transport_rounds(url, a.rounds)),
        "throughput": await throughput(url, a.calls, a.duration),
    }


async def serve_phase(url: str, a: argparse.Namespace, args: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pinned in (False, True):
        out[f"1 replica {'pinned' if pinned else 'unpinned'}"] = pin_replicas(pinned)
        out[f"throughput 1 {pinned}"] = await throughput(url, a.calls, a.duration)
    await asyncio.to_thread(ray_local.deploy, args, replicas=2)
    await asyncio.to_thread(ray_local.wait_running, 2)
    for pinned in (True, False):
        out[f"2 replicas {'pinned' if pinned else 'unpinned'}"] = pin_replicas(pinned)
        out[f"throughput 2 {pinned}"] = await throughput(url, a.calls, a.duration)
    out["transport"] = _transport_summary(await transport_rounds(url, a.rounds))
    killer = Killer()
    out["failover"] = await run_level(
        url, 4, a.failover_duration, PHONE, seed=11, fault=killer, fault_at_s=8.0, progress=False
    )
    await asyncio.to_thread(killer.join)
    out["recovered_s"] = killer.recovered_s
    out["victim"] = killer.victim
    out["second_run"] = await run_level(url, 4, 20.0, PHONE, seed=12, progress=False)
    out["replicas_after"] = sorted(ray_local.replica_pids())
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--calls", type=int, default=24, help="calls of the saturating load")
    p.add_argument("--duration", type=float, default=40.0, help="seconds per throughput run")
    p.add_argument("--rounds", type=int, default=30, help="utterances for the transport time")
    p.add_argument("--failover-duration", type=float, default=30.0)
    p.add_argument("--port", type=int, default=8766)
    p.add_argument(
        "--from-log",
        type=Path,
        default=None,
        help="only write the section, from the two JSON lines a run printed",
    )
    a = p.parse_args()
    if a.from_log is not None:
        direct, served = [json.loads(x) for x in a.from_log.read_text().splitlines()
                          if x.startswith("{")][:2]  # fmt: skip
        update_section("ray_serve", TITLE, COMMAND, report(direct, served, a))
        return 0
    from pipecat_veena.demo import build_demo_checkpoint

    model = build_demo_checkpoint("spark-tiny")
    with spawned_server("spark-tiny", a.port) as url:
        direct = asyncio.run(direct_phase(url, a))
    print(json.dumps(direct), flush=True)
    args = {"model": str(model), "device": "cpu"}
    with ray_local.local_cluster(num_cpus=2) as port:
        ray_local.deploy(args, replicas=1)
        ray_local.wait_running(1)
        served = asyncio.run(serve_phase(f"http://127.0.0.1:{port}", a, args))
    print(json.dumps(served, default=str), flush=True)
    update_section("ray_serve", TITLE, COMMAND, report(direct, served, a))
    return 0


TITLE = "Ray Serve (2 CPU replicas, spark-tiny) against one direct server"
COMMAND = "python -m benchmarks.ray_serve --calls 24 --duration 40 --rounds 30"


def report(direct: dict[str, Any], served: dict[str, Any], a: argparse.Namespace) -> str:
    """The BENCHMARKS.md section from the two phases' figures."""
    from benchmarks.load import table

    d, s = direct["transport"], served["transport"]
    added = s["transport_p50"] - d["transport_p50"]
    tput = {
        "direct server": direct["throughput"],
        "Serve, 1 replica, unpinned": served["throughput 1 False"],
        "Serve, 2 replicas, unpinned": served["throughput 2 False"],
        "Serve, 1 replica on 1 core": served["throughput 1 True"],
        "Serve, 2 replicas, 1 core each": served["throughput 2 True"],
    }
    rows = [
        f"| {name} | {t['audio_s_per_s']:.2f} | {t['ttfa_ms']['p50']:.0f} / "
        f"{t['ttfa_ms']['p95']:.0f} | {t['rtf']['p50']:.2f} | {sum(t['errors'].values())} | "
        f"{t['engine_cpu_s_per_audio_s'] * 1000:.0f} ms | "
        + " / ".join(f"{t['cpu_share'][g]:.0%}" for g in ("engines", "proxy", "clients", "ray"))
        + " |"
        for name, t in tput.items()
    ]
    one, two = tput["Serve, 1 replica, unpinned"], tput["Serve, 2 replicas, unpinned"]
    one_core, two_core = tput["Serve, 1 replica on 1 core"], tput["Serve, 2 replicas, 1 core each"]
    unpinned_x = two["audio_s_per_s"] / one["audio_s_per_s"]
    pinned_x = two_core["audio_s_per_s"] / one_core["audio_s_per_s"]
    cpu_one = one_core["engine_cpu_s_per_audio_s"] * 1000
    cpu_two = two_core["engine_cpu_s_per_audio_s"] * 1000
    overhead = sum(two_core["cpu_share"][g] for g in ("proxy", "clients", "ray"))
    fail, after = served["failover"], served["second_run"]
    transport_rows = "\n".join(
        f"| {name} | {t['ttfa_p50']:.1f} ms | {t['server_ttfa_p50']:.1f} ms | "
        f"{t['transport_p50']:.1f} / {t['transport_p95']:.1f} ms |"
        for name, t in (("direct server", d), ("Serve (2 replicas)", s))
    )
    return f"""
One machine: the clients, Serve's proxy, Ray's own processes and the replicas share its 2
cores. Each replica is given 1 logical CPU (`ray_actor_options`); "unpinned", the OS lets any
process run on either core; "1 core each", each replica's processes (its actor and vLLM's
EngineCore) are pinned to a core of their own, as a GPU replica owns its GPU.

**Time to first audio through Serve's proxy** ({s["n"]} utterances on one call, one at a time;
transport = the client's time to first audio minus the server's own):

| path | TTFA p50 | server's own p50 | transport p50 / p95 |
|---|---|---|---|
{transport_rows}

Added by the proxy, p50: **{added:.1f} ms** (target <= 10 ms).

**Throughput** ({a.calls} calls for {a.duration:g} s, 0.1-0.3 s pauses, no barge-in: more than
one replica can serve in real time; audio seconds delivered per second):

| deployment | audio s per s | TTFA p50 / p95 ms | RTF p50 | errors | engines' CPU per audio second | share of the 2 cores: engines / proxy / clients / Ray's other processes |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}

The direct server keeps vLLM's own CPU binding (its EngineCore's OpenMP thread on core 0, the
other core for the server); "unpinned" replicas are released from it, which is why one of them
can do more than the direct server here.

2 replicas against 1: **{unpinned_x:.2f}x** unpinned, **{pinned_x:.2f}x** with one core each
(target >= 1.7x). Why not 1.7x here: (1) two engines each batch half the calls, and on the tiny
model a decode step costs about the same for 12 streams as for 24: the engines needed
{cpu_one:.0f} ms of CPU per audio second as one replica on one core and {cpu_two:.0f} ms as two
on one core each ({cpu_two / cpu_one - 1:+.0%}); (2) the proxy, the clients and Ray's own
processes took {overhead:.0%} of the machine, from the same two cores the replicas run on. A GPU
replica brings its own GPU, and the proxy runs on CPU cores the engines do not use: the 1.7x
target needs a machine with two GPUs, which this one is not.

**Failover** (4 phone-like calls, {a.failover_duration:g} s; {fail["fault"]}): Serve ran 2
replicas again {served["recovered_s"]:.1f} s after the kill (noticing the death, starting a new
actor and its engine). First row: the run with the kill (the killed replica's counters died
with it); second row: a run after it (4 calls, 20 s), spread over {len(after["requests_per_server"])} replicas:

{table([fail, after])}
"""  # noqa: E501


if __name__ == "__main__":
    sys.exit(main())
