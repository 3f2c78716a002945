"""Render the Grafana dashboard's panels from a real run: docs/observability-dashboard.png.

A real engine (vLLM CPU on a demo checkpoint) behind two speech server apps on loopback (two
``instance`` labels: the replicas of the dashboard), real Prometheus (Debian's ``prometheus``)
scraping both every second, and a short load of WebSocket calls through RemoteVeenaEngine (with
a cancel and a bad voice now and then, so that errors and cancels show). Then every query of
examples/observability/grafana-dashboard.json is asked of that Prometheus over the run
(``query_range``, ``$instance`` = all, ``$__rate_interval`` = 10 s) and drawn, panel by panel,
with matplotlib. No Grafana is needed; the figures are the dashboard's own queries.

    python -m benchmarks.observe --duration 90 --calls 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from contextlib import suppress
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "examples" / "observability" / "grafana-dashboard.json"
OUTPUT = ROOT / "docs" / "observability-dashboard.png"
SENTENCES = [
    "Your appointment is confirmed for Tuesday at four.",
    "I can help with that, one moment please.",
    "The total comes to three hundred and twenty rupees.",
    "Is there anything else I can do for you today?",
]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prometheus(targets: list[str], workdir: Path) -> tuple[subprocess.Popen, str]:
    """Start Prometheus scraping ``targets`` (host:port) every second; returns (process, URL)."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("prometheus is not installed (Debian: apt-get install prometheus)")
    config = workdir / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: veena\n    static_configs: [{{targets: {json.dumps(targets)}}}]\n"
    )
    port = _free_port()
    process = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(workdir / "prometheus.log").open("w"),
    )  # fmt: skip
    return process, f"http://127.0.0.1:{port}"


def _query_range(prometheus: str, expr: str, start: float, end: float) -> list[dict]:
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": 2})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{params}", timeout=30) as r:
        body = json.load(r)
    if body["status"] != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


async def _call(url: str, stop_at: float, seed: int) -> None:
    """One simulated caller: sentences with pauses, now and then a barge-in or a bad voice."""
    from pipecat_veena.remote import RemoteVeenaEngine

    rng = random.Random(seed)
    async with RemoteVeenaEngine(url, response_timeout_s=120) as remote:
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            voice = "robot" if rng.random() < 0.08 else None
            try:
                stream = remote.stream(rng.choice(SENTENCES), voice, request_id=f"c{seed}-{n}")
                barge = rng.random() < 0.15
                async for i, _ in _enumerate(stream):
                    if barge and i >= 2:
                        break  # the caller talks over the bot: the utterance is cancelled
                await stream.aclose()
            except Exception:  # an unknown voice: the error the dashboard counts
                pass
            await asyncio.sleep(rng.uniform(0.5, 2.0))


async def _enumerate(stream):  # noqa: ANN001, ANN202
    i = 0
    async for item in stream:
        yield i, item
        i += 1


async def _run(args: argparse.Namespace) -> None:
    from pipecat_veena.demo import build_demo_checkpoint
    from pipecat_veena.engine import EngineConfig, VeenaEngine
    from pipecat_veena.server import ServerHandle, ServerSettings, create_app

    engine = VeenaEngine(EngineConfig(checkpoint=build_demo_checkpoint(args.kind)))
    await engine.start()
    settings = ServerSettings(max_streams=args.max_streams)
    servers = [
        await ServerHandle(create_app(engine, settings, owns_engine=False)).start()
        for _ in range(2)
    ]
    workdir = Path(tempfile.mkdtemp(prefix="veena-observe-"))
    prometheus, prom_url = _prometheus([s.url.removeprefix("http://") for s in servers], workdir)
    try:
        for server in servers:
            await server.state.wait_started()
        await asyncio.sleep(5)  # a few scrapes of the idle servers first
        start = time.time()
        stop_at = time.monotonic() + args.duration
        calls = [_call(servers[i % 2].url, stop_at, seed=i) for i in range(args.calls)]
        await asyncio.gather(*calls)
        await asyncio.sleep(5)
        end = time.time()
        _plot(prom_url, start - 5, end, args.output)
        print(f"wrote {args.output}")
    finally:
        prometheus.terminate()
        with suppress(subprocess.TimeoutExpired):
            prometheus.wait(30)
        for server in servers:
            await server.stop()
        await engine.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)


def _plot(prometheus: str, start: float, end: float, output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] == "timeseries"]
    cols = 2
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(14, 3.2 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        for target in panel["targets"]:
            expr = target["expr"].replace("$instance", ".*").replace("$__rate_interval", "10s")
            for series in _query_range(prometheus, expr, start, end):
                xs = [float(t) - start for t, _ in series["values"]]
                ys = [float(v) for _, v in series["values"]]
                label = target["legendFormat"]
                for key, val in series["metric"].items():
                    label = label.replace("{{" + key + "}}", val)
                ax.plot(xs, ys, label=label, linewidth=1.4)
        unit = panel["fieldConfig"]["defaults"]["unit"]
        ax.set_title(panel["title"], fontsize=10, loc="left")
        ax.set_ylabel({"s": "seconds", "reqps": "per second", "short": ""}.get(unit, unit))
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left", ncol=3)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("seconds into the run")
    fig.suptitle(
        f"{dashboard['title']}: a real run (demo checkpoint on a shared CPU, slower than real "
        "time; two server apps over one engine, scraped by Prometheus every second)",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=90)


def main() -> None:
    """Parse the arguments and render the dashboard's panels."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="spark-tiny", help="demo checkpoint")
    parser.add_argument("--duration", type=float, default=90.0, help="seconds of load")
    parser.add_argument("--calls", type=int, default=4, help="concurrent callers")
    parser.add_argument("--max-streams", type=int, default=6, help="each server's cap")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="the PNG")
    asyncio.run(_run(parser.parse_args()))


if __name__ == "__main__":
    main()
