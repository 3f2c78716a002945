"""The engine comes back by itself: how long from a killed vLLM engine to ``/ready`` 200 again.

Starts ``pipecat-veena serve`` on a demo checkpoint (``--kind``, default ``spark-tiny``), then
``--runs`` times: SIGKILLs vLLM's ``EngineCore`` process (as a GPU fault or the OOM killer ends
it) and polls ``/health`` and ``/ready`` every 20 ms until ``/ready`` says 200 again, then times
the first audio of one ``POST /v1/audio/speech``. Reports when the server noticed (``/ready``
503), the recovery (kill to ``/ready`` 200: the restart backoff, 0.5-1 s with the default
``restart_backoff_s`` of 1 s, plus a new vLLM engine's start), whether ``/health`` stayed 200
throughout, the first audio after it, and whether the killed processes were reaped. The first
start of the server (its codec, voices and vLLM) is shown beside it: a restart loads only vLLM.

    .venv/bin/python -m benchmarks.engine_restart [--kind spark-tiny] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the server runner

from benchmarks._report import publish  # noqa: E402
from pipecat_veena.demo import build_demo_checkpoint  # noqa: E402

COMMAND = ".venv/bin/python -m benchmarks.engine_restart"
TEXT = "Your appointment is confirmed for Monday at ten in the morning."
#: How often the probes are polled after a kill.
POLL_S = 0.02
#: The longest a restart may take before the run is called failed.
BOUND_S = 300.0


def _engine_cores(pid: int) -> list[psutil.Process]:
    found = []
    for p in psutil.Process(pid).children(recursive=True):
        try:
            if "VLLM" in p.name() or "EngineCore" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:
            pass
    return found


def _first_audio_ms(http: httpx.Client) -> float:
    began = time.perf_counter()
    body = {"input": TEXT, "response_format": "pcm"}
    with http.stream("POST", "/v1/audio/speech", json=body) as r:
        r.raise_for_status()
        first = None
        for piece in r.iter_bytes():
            if first is None and piece:
                first = time.perf_counter()
    return (first - began) * 1000


def _one_restart(http: httpx.Client, pid: int) -> dict:
    cores = _engine_cores(pid)
    assert cores, "no vLLM engine process under the server"
    killed = time.perf_counter()
    for p in cores:
        p.kill()
    noticed = None
    health = set()
    while time.perf_counter() - killed < BOUND_S:
        health.add(http.get("/health").status_code)
        ready = http.get("/ready").status_code
        now = time.perf_counter() - killed
        if ready != 200 and noticed is None:
            noticed = now
        elif ready == 200 and noticed is not None:
            back = now
            break
        time.sleep(POLL_S)
    else:
        raise RuntimeError(f"/ready not 200 again within {BOUND_S:g} s of the kill")
    _, alive = psutil.wait_procs(cores, timeout=15)
    return {
        "load": os.getloadavg()[0],
        "noticed_s": noticed,
        "back_s": back,
        "health": sorted(health),
        "first_audio_ms": _first_audio_ms(http),
        "reaped": not alive,
        "cores": len(_engine_cores(pid)),
    }


def _section(kind: str, started_s: float, idle_ms: float, runs: list[dict]) -> str:
    backs = [r["back_s"] for r in runs]
    lines = [
        f"`pipecat-veena serve` on the `{kind}` demo checkpoint, defaults (`restart_attempts` 3, "
        "`restart_backoff_s` 1.0: the first attempt waits 0.5-1 s). Each run SIGKILLs vLLM's "
        "`EngineCore` process and polls `/health` and `/ready` every 20 ms.",
        "",
        "| run | noticed (`/ready` 503) | recovered (`/ready` 200) | `/health` meanwhile | first "
        "audio after | killed process reaped | load average (1 min) |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(runs, 1):
        lines.append(
            f"| {i} | {r['noticed_s'] * 1000:.0f} ms | {r['back_s']:.1f} s | "
            f"{', '.join(map(str, r['health']))} | {r['first_audio_ms']:.0f} ms | "
            f"{'yes' if r['reaped'] else 'NO'} ({r['cores']} engine process after) | "
            f"{r['load']:.1f} |"
        )
    lines += [
        "",
        f"- Recovery, kill to `/ready` 200: median **{statistics.median(backs):.1f} s** "
        f"(min {min(backs):.1f}, max {max(backs):.1f}) over {len(runs)} runs; the server's "
        f"first start took {started_s:.1f} s (codec, voices, vLLM and warm-up). On a GPU a "
        "restart costs the model load and CUDA graph capture of vLLM (the codec stays loaded).",
        "- The machine is shared: the load average column says how busy it was (2 cores); "
        "a restart is a vLLM start, and its time grows with the load.",
        f"- First audio before the kills: {idle_ms:.0f} ms. `/health` during the restarts: "
        + (
            "200 throughout (a liveness probe does not kill the pod)"
            if all(r["health"] == [200] for r in runs)
            else "NOT always 200"
        )
        + "; `/ready` said 503 from the kill's notice until the engine was back.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="spark-tiny", help="demo checkpoint (spark-tiny, spark)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()

    from browser import free_port, serve

    checkpoint = build_demo_checkpoint(args.kind)
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            str(ROOT / ".venv/bin/pipecat-veena"), "serve", "--model", str(checkpoint),
            "--voices-file", str(Path(tmp) / "voices.json"), "--port", str(port),
        ]  # fmt: skip
        began = time.perf_counter()
        with serve(command, port=port, log=Path(tmp) / "serve.log", ready_path="/ready") as server:
            started_s = time.perf_counter() - began
            with httpx.Client(base_url=server.url, timeout=60) as http:
                idle_ms = _first_audio_ms(http)
                runs = []
                for i in range(args.runs):
                    runs.append(_one_restart(http, server.process.pid))
                    print(f"run {i + 1}: {runs[-1]}", flush=True)
    title = "Engine restart after its vLLM process died (CPU)"
    publish("engine_restart", title, COMMAND, _section(args.kind, started_s, idle_ms, runs),
            not args.no_write)  # fmt: skip


if __name__ == "__main__":
    main()
