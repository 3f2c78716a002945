"""A local Ray cluster running the Serve application, for the tests and benchmarks/ray_serve.py.

``local_cluster()`` starts Ray with explicit small resources (no dashboard, no usage stats) and
makes the workers import this checkout (PYTHONPATH through the runtime environment);
``deploy()`` runs the application on it. Leaving the block shuts Serve and Ray down and fails if
any process Ray started (raylet, workers, a replica's vLLM EngineCore) outlives it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
APP = "veena"
DEPLOYMENT = "VeenaReplica"
#: CPU replicas: no GPU asked; one logical CPU each (Ray sets OMP_NUM_THREADS from it).
CPU_ACTOR_OPTIONS: dict[str, Any] = {"num_cpus": 1, "num_gpus": 0}


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def local_cluster(*, num_cpus: int = 2, env: dict[str, str] | None = None) -> Iterator[int]:
    """Start a local Ray cluster with Serve's proxy on a free port; yields the port.

    Args:
        num_cpus: logical CPUs of the cluster (each CPU replica takes one).
        env: environment variables for every worker, on top of PYTHONPATH (this checkout).
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from ray import serve

    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    before = {p.pid for p in psutil.Process().children()}
    ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path, **(env or {})}},
    )
    # Ray's own processes (GCS, raylet, ...): the children ray.init started. Other children of
    # this process (a test's engine started while the cluster runs) are not Ray's to end.
    roots = [p for p in psutil.Process().children() if p.pid not in before]
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield port
    finally:
        ray_processes = _tree(roots)  # workers, replicas and their vLLM EngineCores included
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
            _check_nothing_left(ray_processes)


def _tree(roots: list[psutil.Process]) -> dict[int, psutil.Process]:
    """The live processes among ``roots`` and their descendants, by pid."""
    found = {}
    for root in roots:
        try:
            found.update({p.pid: p for p in [root, *root.children(recursive=True)]})
        except psutil.Error:
            continue
    return found


def _check_nothing_left(ray_processes: dict[int, psutil.Process]) -> None:
    described = {pid: _describe(p) for pid, p in ray_processes.items()}
    _, alive = psutil.wait_procs(list(ray_processes.values()), timeout=30)
    alive = [p for p in alive if _status(p) not in (psutil.STATUS_ZOMBIE, "")]
    for p in alive:
        p.kill()
    assert not alive, f"Ray left processes behind: {[described[p.pid] for p in alive]}"


def deploy(args: dict[str, Any], *, replicas: int, **options: Any) -> None:
    """Run the application (name ``veena``, route ``/``) with ``replicas`` CPU replicas."""
    from ray import serve

    from pipecat_veena.deploy.ray import veena_app

    options.setdefault("ray_actor_options", CPU_ACTOR_OPTIONS)
    app = veena_app(args, num_replicas=replicas, **options)
    serve.run(app, name=APP, route_prefix="/")


def deploy_config(path: Path) -> None:
    """``serve run --non-blocking`` a config file on the running cluster (its own process)."""
    import ray

    serve_cli = Path(sys.executable).with_name("serve")
    command = [str(serve_cli), "run", "--non-blocking", "--address"]
    command += [ray.get_runtime_context().gcs_address, str(path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if result.returncode:
        raise RuntimeError(f"{' '.join(command)} failed: {result.stderr[-2000:]}")


def running_replicas() -> int:
    """How many replicas of the deployment Serve reports RUNNING (raises if deploying failed)."""
    from ray import serve

    status = serve.status().applications.get(APP)
    if status is None:
        return 0
    if status.status == "DEPLOY_FAILED":  # (UNHEALTHY: while a dead replica is replaced)
        raise RuntimeError(f"the application is {status.status}: {status.message}")
    deployment = status.deployments.get(DEPLOYMENT)
    return int(deployment.replica_states.get("RUNNING", 0)) if deployment else 0


def wait_running(replicas: int, timeout_s: float = 240.0) -> float:
    """Wait until ``replicas`` replicas run; returns the seconds it took."""
    start = time.monotonic()
    while running_replicas() < replicas:
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"Serve did not get {replicas} replicas running in {timeout_s} s")
        time.sleep(0.5)
    return time.monotonic() - start


def wait_replaced(victim: str, replicas: int, timeout_s: float = 300.0) -> float:
    """Wait until Serve runs ``replicas`` again after replica ``victim`` died; returns seconds.

    First until Serve itself counts fewer running replicas (it notices a death at its next
    health check), then until it runs ``replicas``, none of them the victim.
    """
    start = time.monotonic()
    noticed_by = start + 60.0
    while running_replicas() >= replicas and time.monotonic() < noticed_by:
        time.sleep(0.2)
    while running_replicas() < replicas or victim in replica_pids():
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"Serve did not replace replica {victim} in {timeout_s} s")
        time.sleep(0.5)
    return time.monotonic() - start


def replica_pids() -> dict[str, int]:
    """Replica tag -> the pid of its actor process (live replicas only), from Ray's GCS."""
    from ray._private.state import state  # no dashboard here, so not the state API

    pids = {}
    for actor in state.actor_table(None).values():
        name = actor.get("Name") or ""
        if actor.get("State") == "ALIVE" and name.startswith(f"SERVE_REPLICA::{APP}#"):
            pids[name.rsplit("#", 1)[-1]] = int(actor["Pid"])
    return pids


def _status(p: psutil.Process) -> str:
    try:
        return p.status()
    except psutil.Error:
        return ""


def _describe(p: psutil.Process) -> str:
    try:
        return f"{p.pid} {' '.join(p.cmdline())[:80]}"
    except psutil.Error:
        return str(p.pid)
