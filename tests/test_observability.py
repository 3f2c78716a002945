"""What an operator watches, without the real engine: the server's own metrics on a real socket
(over the fake engine, where the values are the server's), Prometheus naming conventions, the
alert rules under ``promtool test rules``, and the dashboard's shape.

The dashboard's and the rules' metric names are checked against a real engine's scrape in
test_observability_real.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from server_fakes import FakeSpeechEngine, RawClient, serving

from pipecat_veena.remote.protocol import AudioFrame
from pipecat_veena.server import ServerSettings

ROOT = Path(__file__).resolve().parents[1]
OBSERVABILITY = ROOT / "examples" / "observability"
DASHBOARD = OBSERVABILITY / "grafana-dashboard.json"
ALERTS = OBSERVABILITY / "alerts.yaml"
ALERT_TESTS = OBSERVABILITY / "alerts_test.yaml"
PROMTOOL = shutil.which("promtool")
#: The label names the server may use: bounded sets, never a request id.
BOUNDED_LABELS = {"api", "outcome", "code", "by", "le"}


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of a scrape: (name, labels) -> value."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    """One sample's value (KeyError naming it when the scrape lacks it)."""
    return samples(text)[(name, frozenset(labels.items()))]


def dashboard_queries() -> list[str]:
    """Every PromQL expression of the dashboard's panels."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p["targets"]]


def alert_queries() -> dict[str, str]:
    """Alert name -> its PromQL expression."""
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return {r["alert"]: r["expr"] for g in groups for r in g["rules"]}


def metric_names(expr: str) -> set[str]:
    """The server's metric names a PromQL expression reads (``up`` is Prometheus's own)."""
    return set(re.findall(r"\bveena_[a-z0-9_]+\b", expr))


# -- the server's own figures, over the fake engine -----------------------------------------
async def test_operator_metrics_of_a_real_server_over_the_fake_engine():
    """Stream capacity, per-chunk real-time margin, tokens, errors by code and cancels, scraped
    from a served app after a completed, a cancelled and a refused utterance."""
    settings = ServerSettings(max_streams=7)
    # 4 chunks of 0.1 s, produced 0.1 s faster than real time: the margin stays above 0
    async with serving(FakeSpeechEngine(chunks=4), settings) as server:
        async with RawClient.connect(server.ws_url) as client:
            await client.send({"type": "speak", "id": "ok", "text": "Hello there."})
            frames, end = await client.until_end("ok")
            assert end.type == "done" and len(frames) == 4
            await client.send({"type": "speak", "id": "bad", "text": "Hi.", "voice": "robot"})
            assert (await client.until_end("bad"))[1].code == "unknown_voice"
        endless = FakeSpeechEngine(endless=True, delay=0.01)
        async with serving(endless, settings) as other:
            async with RawClient.connect(other.ws_url) as client:
                await client.send({"type": "speak", "id": "long", "text": "On and on."})
                assert isinstance(await client.recv(), AudioFrame)
                await client.send({"type": "cancel", "id": "long"})
                assert (await client.until_end("long"))[1].reason == "cancelled"
            async with httpx.AsyncClient(base_url=other.url) as http:
                cancelled = (await http.get("/metrics")).text
        async with httpx.AsyncClient(base_url=server.url) as http:
            text = (await http.get("/metrics")).text
    assert value(text, "veena_stream_capacity") == 7
    assert value(text, "veena_errors_total", api="ws", code="unknown_voice") == 1
    assert value(text, "veena_errors_total", api="ws", code="generation_failed") == 0
    assert value(text, "veena_llm_tokens_total", api="ws") == 40  # the fake counts 10 a chunk
    # one margin per chunk, every one above 0 (the fake is faster than real time)
    assert value(text, "veena_real_time_margin_seconds_count", api="ws") == 4
    assert value(text, "veena_real_time_margin_seconds_bucket", api="ws", le="0.0") == 0
    assert value(text, "veena_llm_tokens_per_second_count", api="ws") == 1
    assert value(cancelled, "veena_cancels_total", api="ws", by="client") == 1
    assert value(cancelled, "veena_cancels_total", api="ws", by="drain") == 0
    assert value(cancelled, "veena_requests_total", api="ws", outcome="cancelled") == 1


async def test_metric_names_and_labels_follow_prometheus_conventions():
    async with serving(FakeSpeechEngine()) as server, httpx.AsyncClient() as http:
        await http.post(f"{server.url}/v1/audio/speech", json={"input": "Hi.", "voice": "female"})
        text = (await http.get(f"{server.url}/metrics")).text
    families = list(text_string_to_metric_families(text))
    assert families
    for family in families:
        assert family.name.startswith("veena_"), family.name
        for sample in family.samples:
            assert set(sample.labels) <= BOUNDED_LABELS, (sample.name, sample.labels)
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples)
        if family.type == "histogram" and "seconds" not in family.name:
            # unitless histograms name what they count
            assert family.name.endswith(("_factor", "_per_second", "_size")), family.name


# -- alert rules and dashboard --------------------------------------------------------------
@pytest.mark.skipif(PROMTOOL is None, reason="promtool is missing (Debian: apt-get install "
                    "prometheus; `make test` installs it)")  # fmt: skip
def test_alert_rules_pass_promtool_check_and_their_unit_tests():
    for args in (["check", "rules", ALERTS.name], ["test", "rules", ALERT_TESTS.name]):
        run = subprocess.run(
            [PROMTOOL, *args], cwd=OBSERVABILITY, capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 0, run.stdout + run.stderr


def test_every_alert_rule_has_a_unit_test_that_fires_it_and_one_that_does_not():
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    cases = [case for t in tests for case in t["alert_rule_test"]]
    for name in alert_queries():
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c["exp_alerts"] for c in mine), f"{name}: no test where it fires"
        assert any(not c["exp_alerts"] for c in mine), f"{name}: no test where it stays quiet"


def test_dashboard_has_the_operator_panels_per_replica():
    dashboard = json.loads(DASHBOARD.read_text())
    titles = [p["title"] for p in dashboard["panels"]]
    for wanted in ("Time to first audio (p50, p95, p99)", "Streams vs capacity",
                   "Real-time margin (p5, p50)", "Errors by code"):  # fmt: skip
        assert wanted in titles
    ttfa = next(p for p in dashboard["panels"] if p["title"].startswith("Time to first audio ("))
    assert [t["legendFormat"] for t in ttfa["targets"]] == ["p50", "p95", "p99"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert "instance" in variables["instance"]["query"]["query"]
    for expr in dashboard_queries():  # every query follows the replica picker
        assert 'instance=~"$instance"' in expr, expr
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(set(ids)) == len(ids)
