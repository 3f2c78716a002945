"""Load and fault harness for any speech server deployment: one server, Ray Serve, Kubernetes.

N concurrent simulated phone calls (benchmarks/_load_calls.py: each a RemoteVeenaEngine with its
own WebSocket; the caller pauses, the bot speaks a sentence played in real time, the caller
sometimes barges in) for D seconds, at each concurrency asked. Per level it reports time to
first audio p50/p95/p99, real-time factor, the longest playback underrun per call (a stream
that stalled after it started playing: a gap on the phone), audio throughput, errors by kind,
hung utterances, RemoteVeenaEngine's retries, requests per replica, and requests still running
on the servers once every call has ended (cancels that left work behind), read from /metrics of
every server the URL reaches (behind a proxy, each replica names itself in ``x-veena-replica``).

    python -m benchmarks.load --url http://tts-host:8000 --concurrency 1 4 16 --duration 60
    python -m benchmarks.load --spawn-server spark-tiny --concurrency 1 4 16 --report load_server
    python -m benchmarks.load --url ... --fault-at 10 --fault-cmd "kubectl delete pod tts-0"
    python -m benchmarks.load --roll spark-tiny --concurrency 3 --duration 240 --report rollout

``--roll KIND`` is a rolling restart behind one URL: two ``pipecat-veena serve`` processes behind
haproxy (round robin, health checks on ``/ready``), and from ``--fault-at`` seconds on each is
restarted in turn as a Deployment rolls (SIGTERM, drain, a new one on the same port, ``/ready``).

``--report NAME`` writes the figures into BENCHMARKS.md (section NAME) with this command and a
PNG plot of TTFA and underruns against concurrency (benchmarks/figures/NAME.png).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from tqdm import tqdm

from benchmarks._load_calls import JITTER_BUFFER_S, CallPlan, CallResult, Deadline, run_call
from benchmarks._report import percentile, update_section

REPLICA_HEADER = "x-veena-replica"
FIGURES = Path(__file__).resolve().parent / "figures"
_IDS = re.compile(r"\b(?:tts|ws|http)-[A-Za-z0-9_.:-]*[A-Za-z0-9_]|wss?://\S+|:\d{2,5}\b")


# -- the servers' own counters -------------------------------------------------------------------
async def scrape(url: str, *, tries: int = 12) -> dict[str, dict[str, float]]:
    """/metrics of each server ``url`` reaches: server name -> counters.

    Behind a proxy each request may reach another replica (named by its ``x-veena-replica``
    header), so the URL is asked ``tries`` times; a plain server answers once, as "server".
    """
    found: dict[str, dict[str, float]] = {}
    async with httpx.AsyncClient(timeout=10) as http:
        for _ in range(tries):
            try:
                response = await http.get(f"{url.rstrip('/')}/metrics")
            except httpx.HTTPError:
                continue
            if response.status_code != 200:
                continue
            name = response.headers.get(REPLICA_HEADER, "server")
            found[name] = _counters(response.text)
            if name == "server":
                break
    return found


def _counters(text: str) -> dict[str, float]:
    out = {"unfinished": 0.0, "active": 0.0, "requests": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "veena_engine_unfinished_requests":
                out["unfinished"] += sample.value
            elif sample.name == "veena_active_streams":
                out["active"] += sample.value
            elif sample.name == "veena_requests_total":
                out["requests"] += sample.value
    return out


async def settle(url: str, limit_s: float) -> tuple[float, float]:
    """Wait for the servers to hold no request; returns (requests still held, seconds waited)."""
    start = time.monotonic()
    while True:
        found = await scrape(url)
        left = sum(c["unfinished"] + c["active"] for c in found.values())
        if not left or time.monotonic() - start > limit_s:
            return left, time.monotonic() - start
        await asyncio.sleep(0.25)


# -- one concurrency level -----------------------------------------------------------------------
async def run_level(
    url: str,
    calls: int,
    duration_s: float,
    plan: CallPlan,
    *,
    seed: int = 0,
    api_key: str | None = None,
    fault: Callable[[], Awaitable[str]] | None = None,
    fault_at_s: float | None = None,
    settle_s: float = 10.0,
    progress: bool = True,
    after_fault_s: float | None = None,
) -> dict[str, Any]:
    """Run ``calls`` simulated calls for ``duration_s``; returns the level's summary.

    ``fault`` (awaited once, ``fault_at_s`` seconds in) injects a failure and describes it;
    with ``after_fault_s`` the calls end that long after the fault is over (if sooner).
    """
    before = await scrape(url)
    start = time.monotonic()
    deadline = Deadline(start + duration_s)
    done: list = []
    tasks = [
        asyncio.create_task(
            run_call(url, i, deadline, plan, seed=seed * 10_000 + i, api_key=api_key, done=done)
        )
        for i in range(calls)
    ]
    fault_note = fault_done_s = None
    bar = tqdm(total=int(duration_s), desc=f"{calls} calls", unit="s", disable=not progress)
    pending = set(tasks)
    while pending:
        _, pending = await asyncio.wait(pending, timeout=1.0)
        elapsed = time.monotonic() - start
        bar.n = min(int(elapsed), int(duration_s))
        failed = sum(u.outcome in ("error", "hung") for u in done)
        bar.set_postfix(utterances=len(done), failed=failed, refresh=False)
        bar.refresh()
        if fault is not None and fault_note is None and elapsed >= (fault_at_s or 0.0):
            what = await fault()
            fault_done_s = round(time.monotonic() - start, 1)
            fault_note = f"{what} at {fault_done_s:.1f} s"
            if after_fault_s is not None:
                deadline.at = min(deadline.at, time.monotonic() + after_fault_s)
    bar.close()
    wall = time.monotonic() - start
    left, waited = await settle(url, settle_s)
    after = await scrape(url)
    results = [t.result() for t in tasks]
    return summarize(results, calls=calls, wall_s=wall, before=before, after=after) | {
        "left_running": left,
        "settled_in_s": round(waited, 2),
        "fault": fault_note,
        "fault_done_s": fault_done_s,
    }


def summarize(
    results: list[CallResult],
    *,
    calls: int,
    wall_s: float,
    before: dict[str, dict[str, float]],
    after: dict[str, dict[str, float]],
) -> dict[str, Any]:
    """The figures of one level (times in ms)."""
    utterances = [u for r in results for u in r.utterances]
    ttfa = [u.ttfa_s * 1000 for u in utterances if u.ttfa_s is not None]
    rtf = [u.elapsed_s / u.audio_s for u in utterances if u.outcome == "completed" and u.audio_s]
    per_call = [max((u.underrun_s for u in r.utterances), default=0.0) * 1000 for r in results]
    buffered = [
        max((u.buffered_underrun_s for u in r.utterances), default=0.0) * 1000 for r in results
    ]
    errors = Counter(_IDS.sub("…", u.error) for u in utterances if u.error)
    starts = [_IDS.sub("…", r.start_error) for r in results if r.start_error]
    errors.update(f"call did not start: {message}" for message in starts)
    spread = {
        name: int(c["requests"] - before.get(name, {}).get("requests", 0.0))
        for name, c in sorted(after.items())
    }
    return {
        "calls": calls,
        "wall_s": round(wall_s, 1),
        "outcomes": dict(Counter(u.outcome for u in utterances)),
        "ttfa_ms": {
            **{q: percentile(ttfa, v) for q, v in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))},
            "max": max(ttfa, default=None),
        },
        "rtf": {q: percentile(rtf, v) for q, v in (("p50", 0.5), ("p95", 0.95))},
        "underrun_ms": {
            "p50": percentile(per_call, 0.5),
            "p95": percentile(per_call, 0.95),
            "max": max(per_call, default=None),
        },  # fmt: skip
        "buffered_underrun_ms": {
            "p95": percentile(buffered, 0.95),
            "max": max(buffered, default=None),
        },
        "calls_with_underrun_over_100ms": sum(v > 100 for v in per_call),
        "replayed": sum(u.replayed for u in utterances),
        "audio_s_per_s": round(sum(u.audio_s for u in utterances) / wall_s, 2),
        "errors": dict(errors),
        "retries": sum(r.retries for r in results),
        "requests_per_server": spread,
    }


# -- reporting -----------------------------------------------------------------------------------
def _f(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(levels: list[dict[str, Any]]) -> str:
    """A Markdown table, one row per level."""
    rows = [
        "| calls | utterances done / barged in / failed / hung | TTFA p50 / p95 / p99 ms "
        "| RTF p50 / p95 | longest underrun per call p50 / p95 / max ms "
        f"| ... behind a {JITTER_BUFFER_S * 1000:.0f} ms jitter buffer p95 / max ms "
        "| audio s per s | retries | left running | requests per server |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lv in levels:
        o, t, r, u = lv["outcomes"], lv["ttfa_ms"], lv["rtf"], lv["underrun_ms"]
        b = lv["buffered_underrun_ms"]
        spread = ", ".join(f"{k}: {v}" for k, v in lv["requests_per_server"].items())
        rows.append(
            f"| {lv['calls']} | {o.get('completed', 0)} / {o.get('cancelled', 0)} / "
            f"{o.get('error', 0)} / {o.get('hung', 0)} | {_f(t['p50'])} / {_f(t['p95'])} / "
            f"{_f(t['p99'])} | {_f(r['p50'], 2)} / {_f(r['p95'], 2)} | {_f(u['p50'])} / "
            f"{_f(u['p95'])} / {_f(u['max'])} | {_f(b['p95'])} / {_f(b['max'])} | "
            f"{lv['audio_s_per_s']} | {lv['retries']} | "
            f"{_f(lv['left_running'])} | {spread} |"
        )
    errors = Counter()
    for lv in levels:
        errors.update(lv["errors"])
    if errors:
        rows.append("")
        rows += [f"- {n} x `{message[:200]}`" for message, n in errors.most_common(8)]
    return "\n".join(rows)


def plot(series: dict[str, list[dict[str, Any]]], path: Path, title: str) -> Path:
    """A PNG of TTFA and longest underrun per call against concurrency, one line per series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for label, levels in series.items():
        x = [lv["calls"] for lv in levels]
        for q, style in (("p50", "-o"), ("p95", "--s"), ("p99", ":^")):
            y = [lv["ttfa_ms"][q] for lv in levels]
            left.plot(x, y, style, label=f"{label} {q}")
        for q, style in (("p95", "--s"), ("max", ":^")):
            y = [lv["underrun_ms"][q] for lv in levels]
            right.plot(x, y, style, label=f"{label} {q}")
        y = [lv["buffered_underrun_ms"]["p95"] for lv in levels]
        right.plot(x, y, "-.d", label=f"{label} p95, {JITTER_BUFFER_S * 1000:.0f} ms buffer")
    ticks = sorted({lv["calls"] for levels in series.values() for lv in levels})
    for ax, name in ((left, "time to first audio (ms)"), (right, "longest underrun per call (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("concurrent calls")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -- servers to point at -------------------------------------------------------------------------
class ServeProcess:
    """``pipecat-veena serve`` on a demo checkpoint (or a directory) in a process of its own.

    Args:
        kind: a demo kind (``spark-tiny``...) or a checkpoint directory.
        port: the port it listens on (kept across restarts).
        log: where its output goes (None: this process's).
        args: more ``serve`` arguments (e.g. ``--drain-timeout 300``).
    """

    def __init__(
        self, kind: str, port: int, log: Path | None = None, args: tuple[str, ...] = ()
    ) -> None:
        from pipecat_veena.demo import DEMO_KINDS, build_demo_checkpoint

        model = build_demo_checkpoint(kind) if kind in DEMO_KINDS else Path(kind)
        self.command = [sys.executable, "-c", "from pipecat_veena.cli import main; main()",
                        "serve", "--model", str(model), "--port", str(port), *args]  # fmt: skip
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self.process: subprocess.Popen | None = None

    def start(self, ready_within_s: float = 300.0) -> None:
        """Start it and wait until ``/ready`` is 200."""
        out = self.log.open("a") if self.log else None
        err = subprocess.STDOUT if out else None
        try:
            self.process = subprocess.Popen(
                self.command, start_new_session=True, stdout=out, stderr=err
            )
        finally:
            if out is not None:
                out.close()  # (the process has its own copy)
        deadline = time.monotonic() + ready_within_s
        while not _ready(self.url):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not get ready ({shlex.join(self.command)})")
            time.sleep(0.5)

    def stop(self, wait_s: float = 700.0) -> int | None:
        """SIGTERM (it drains), wait for it to exit (killed after ``wait_s``); its exit status."""
        if self.process is None:
            return None
        process, self.process = self.process, None
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(wait_s)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()


@contextmanager
def spawned_server(kind: str, port: int) -> Iterator[str]:
    """``pipecat-veena serve`` on a demo checkpoint (or a directory), stopped with SIGTERM."""
    server = ServeProcess(kind, port)
    try:
        server.start()
        yield server.url
    finally:
        server.stop()


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: haproxy in front of the servers, as a Kubernetes Service or cloud balancer would be: round
#: robin, a server out of rotation after one failed ``/ready`` check (every 500 ms) and back
#: after two good ones; a refused connection is retried on another server.
HAPROXY_CONFIG = """global
    maxconn 2000
defaults
    mode http
    timeout connect 2s
    timeout client 600s
    timeout server 600s
    timeout tunnel 1h
    retries 3
    option redispatch
frontend veena
    bind 127.0.0.1:{port}
    default_backend servers
backend servers
    balance roundrobin
    option httpchk GET /ready
    default-server inter 500ms fall 1 rise 2
{servers}
"""


@contextmanager
def haproxy(urls: list[str], port: int, binary: str = "/usr/sbin/haproxy") -> Iterator[str]:
    """Debian's haproxy on ``port`` in front of ``urls`` (``HAPROXY_CONFIG``); yields its URL."""
    servers = "\n".join(
        f"    server s{i} {url.split('://')[1]} check" for i, url in enumerate(urls)
    )
    with tempfile.NamedTemporaryFile("w", suffix=".cfg", delete=False) as f:
        f.write(HAPROXY_CONFIG.format(port=port, servers=servers))
    process = subprocess.Popen([binary, "-db", "-f", f.name], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not _ready(f"http://127.0.0.1:{port}"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"haproxy did not come up (exit {process.poll()})")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)
        Path(f.name).unlink()


def rolling_restart(servers: list[ServeProcess]) -> Callable[[], Awaitable[str]]:
    """A fault that restarts each server in turn as a Deployment rolls: SIGTERM (it drains),
    then a new one on the same port, ready (``/ready`` 200) before the next one goes."""

    async def roll() -> str:
        start = time.monotonic()
        statuses = []
        for server in servers:
            statuses.append(await asyncio.to_thread(server.stop))
            await asyncio.to_thread(server.start)
        took = time.monotonic() - start
        return f"rolled {len(servers)} servers (exit statuses {statuses}) in {took:.0f} s"

    return roll


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _shell_fault(command: str) -> Callable[[], Awaitable[str]]:
    async def fault() -> str:
        process = await asyncio.create_subprocess_shell(command)
        await process.wait()
        return f"`{command}` (exit {process.returncode})"

    return fault


# -- command line --------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="the deployment (http://host:port)")
    target.add_argument(
        "--spawn-server",
        metavar="KIND_OR_DIR",
        help="start `pipecat-veena serve` on a demo kind or checkpoint here",
    )
    target.add_argument(
        "--roll",
        metavar="KIND_OR_DIR",
        help="two servers on this behind haproxy, restarted in turn from --fault-at on",
    )
    p.add_argument("--port", type=int, default=8765, help="port for --spawn-server")
    p.add_argument("--api-key", default=None)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--duration", type=float, default=30.0, help="seconds per level")
    p.add_argument(
        "--pause",
        type=float,
        nargs=2,
        default=(0.5, 2.5),
        help="the caller's turn, min and max seconds",
    )
    p.add_argument("--barge-in", type=float, default=0.2, help="share of sentences interrupted")
    p.add_argument("--prebuffer", type=float, default=0.0, help="player's jitter buffer, seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fault-at", type=float, default=None, help="seconds into each level")
    p.add_argument("--fault-cmd", default=None, help="shell command run at --fault-at")
    p.add_argument("--json", type=Path, default=None, help="write the figures here too")
    p.add_argument("--report", default=None, help="BENCHMARKS.md section (and figure) name")
    p.add_argument("--title", default=None, help="the section's title")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)  # fmt: skip


async def run(
    args: argparse.Namespace, url: str, fault: Callable[[], Awaitable[str]] | None = None
) -> list[dict[str, Any]]:
    plan = CallPlan(pause_s=tuple(args.pause), barge_in=args.barge_in, prebuffer_s=args.prebuffer)
    if args.fault_cmd:
        fault = _shell_fault(args.fault_cmd)
    levels = []
    for calls in args.concurrency:
        level = await run_level(
            url, calls, args.duration, plan, seed=args.seed, api_key=args.api_key,
            fault=fault, fault_at_s=args.fault_at, progress=not args.no_progress,
        )  # fmt: skip
        levels.append(level)
        print(json.dumps(level), flush=True)
    return levels


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.spawn_server:
        with spawned_server(args.spawn_server, args.port) as url:
            levels = asyncio.run(run(args, url))
        where = f"`pipecat-veena serve` on {args.spawn_server}, on this machine"
    elif args.roll:
        servers = [ServeProcess(args.roll, free_port()) for _ in range(2)]
        try:
            for server in servers:
                server.start()
            with haproxy([s.url for s in servers], args.port) as url:
                levels = asyncio.run(run(args, url, rolling_restart(servers)))
        finally:
            for server in servers:
                server.stop()
        where = (
            f"haproxy in front of two `pipecat-veena serve` on {args.roll}, each restarted in "
            "turn (SIGTERM, drain, new process, /ready), on this machine"
        )
    else:
        levels = asyncio.run(run(args, args.url))
        where = args.url
    print(table(levels))
    if args.json:
        args.json.write_text(json.dumps(levels, indent=2))
    if args.report:
        title = args.title or f"Load: {where}"
        figure = plot({args.report: levels}, FIGURES / f"{args.report}.png", title)
        command = "python -m benchmarks.load " + shlex.join(sys.argv[1:] if argv is None else argv)
        body = (
            f"{args.duration:g} s per level; calls pause {args.pause[0]:g}-{args.pause[1]:g} s "
            f"between sentences, {args.barge_in:.0%} barged in; player prebuffer "
            f"{args.prebuffer * 1000:.0f} ms. Target: {where}.\n\n{table(levels)}\n\n"
            f"![TTFA and underruns]({figure.relative_to(FIGURES.parent.parent)})"
        )
        update_section(args.report, title, command, body)
    bad = sum(lv["outcomes"].get("hung", 0) + lv["left_running"] for lv in levels)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
