"""The deployment recipes, checked without a cluster: Kubernetes YAML and the Ray Serve configs.

Core Kubernetes kinds are validated against the Kubernetes JSON schemas (kubernetes-validate,
bundled, offline); the KEDA and Prometheus Operator objects, which it has no schema for, are
checked field by field. Both recipes are tied to the code: probe paths and metric names must be
the server's, grace periods must cover its drain, Serve configs must build with ``ReplicaArgs``.
Also the Ray application's pieces that need no cluster: its args, its replica header and its
health probe.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
import yaml
from server_fakes import ROOT, FakeSpeechEngine

from pipecat_veena.deploy.replica_args import REPLICA_SERVER_DEFAULTS, ReplicaArgs
from pipecat_veena.errors import CheckpointError
from pipecat_veena.server import create_app
from pipecat_veena.server.metrics import ServerMetrics

K8S = ROOT / "examples" / "k8s"
RAY_CONFIGS = [ROOT / "examples" / "ray_serve.yaml", ROOT / "examples" / "ray_serve_cpu.yaml"]
CORE_KINDS = {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"}
#: The oldest and newest Kubernetes versions the recipe is checked against.
K8S_VERSIONS = ("1.29.0", "1.37.0")
#: The longest a ``/health`` poll may wait for its answer, also during a start (checked on a real
#: start in test_server_start.py).
HEALTH_ANSWER_S = 1.0
#: ``pipecat-veena serve`` from launch to ready (warm) on the 2-vCPU test machine without a GPU,
#: shared and heavily loaded (load average 20-37), measured with test_server_start.py's
#: ``observe_start``: the slowest of the runs on either side of the change.
MEASURED_CPU_START_S = {"spark-tiny": 165.0, "spark": 147.0}
#: A cold GPU start of Spark-TTS-0.5B, launch to warm (an estimate: no GPU measurement here):
#: vLLM import, weights from the volume, profiling, torch.compile (no compile cache in a fresh
#: pod), CUDA graph capture, the codec and the warm-up. About 3 minutes.
GPU_START_ESTIMATE_S = 180.0


def _resources() -> list[tuple[Path, dict]]:
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and "kind" in doc:
                found.append((path, doc))
    return found


def _one(kind: str) -> dict:
    (doc,) = [d for _, d in _resources() if d["kind"] == kind]
    return doc


def _container() -> dict:
    (container,) = _one("Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def startup_budget_s() -> float:
    """How long the Deployment lets a pod start before the kubelet restarts it."""
    probe = _container()["startupProbe"]
    return probe.get("initialDelaySeconds", 0) + probe["periodSeconds"] * probe["failureThreshold"]


def _server_metric_names() -> set[str]:
    text = ServerMetrics(FakeSpeechEngine()).render().decode()
    return set(re.findall(r"^# TYPE (\S+) ", text, re.M))


# -- Kubernetes ----------------------------------------------------------------------------------
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_core_kinds_validate_against_the_kubernetes_schemas(version):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kinds = set()
    for _, doc in _resources():
        if doc["kind"] in CORE_KINDS:
            kubernetes_validate.validate(doc, version, strict=True)  # raises what is wrong
            kinds.add(doc["kind"])
    assert kinds == CORE_KINDS


def test_the_validator_catches_a_broken_deployment():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    doc = _one("Deployment")
    doc["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)


def test_the_deployment_matches_the_server():
    pod = _one("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "1"
    requests = container["resources"]["requests"]
    assert requests["cpu"] and requests["memory"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8000}
    assert '--port", "8000' in (K8S / "Dockerfile").read_text()  # the image listens there
    app_paths = {route.path for route in create_app(FakeSpeechEngine()).routes}
    for probe, path in (
        ("startupProbe", "/ready"),
        ("readinessProbe", "/ready"),
        ("livenessProbe", "/health"),
    ):
        assert container[probe]["httpGet"] == {"path": path, "port": "http"}
        assert path in app_paths
    # SIGTERM drains: the grace period covers the preStop wait, the drain and the shutdown.
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    (drain,) = [float(a.split("=")[1]) for a in container["args"] if "--drain-timeout=" in a]
    assert pod["terminationGracePeriodSeconds"] >= float(pre_stop[1]) + drain + 15
    annotations = _one("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] == "/metrics" and "/metrics" in app_paths


def test_the_probes_let_a_gpu_start_finish_and_ride_out_a_short_stall():
    container = _container()
    startup, live, ready = (
        container[k] for k in ("startupProbe", "livenessProbe", "readinessProbe")
    )
    # Liveness runs only once the startup probe passed, and that needs a warm engine (/ready):
    # no restart while the model loads, within a budget sized for a GPU start and far above the
    # measured CPU starts.
    assert startup["httpGet"]["path"] == "/ready"
    budget = startup_budget_s()
    assert budget >= 3 * GPU_START_ESTIMATE_S, budget
    assert budget >= 3 * max(MEASURED_CPU_START_S.values()), budget
    assert min(MEASURED_CPU_START_S.values()) > 0  # (recorded, not a placeholder)
    # Each poll waits longer than /health ever takes; one missed readiness poll (a short stall
    # of the event loop) does not take the pod out of the Service.
    for probe in (startup, live, ready):
        assert probe["timeoutSeconds"] > 2 * HEALTH_ANSWER_S, probe
    assert live["failureThreshold"] >= 3
    assert ready["failureThreshold"] >= 2
    # The README says what the probes allow, with the figures they rest on.
    text = " ".join((K8S / "README.md").read_text(encoding="utf-8").split())
    for figure in (
        f"{budget / 60:g} min",
        f"about {GPU_START_ESTIMATE_S / 60:g} min",
        f"{MEASURED_CPU_START_S['spark-tiny']:g} s",
        f"{MEASURED_CPU_START_S['spark']:g} s",
        f"within {HEALTH_ANSWER_S:g} s",
    ):
        assert figure in text, f"examples/k8s/README.md does not say {figure!r}"


def test_the_service_and_the_autoscalers_point_at_the_deployment():
    deployment = _one("Deployment")
    name = deployment["metadata"]["name"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = _one("Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert _one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for kind in ("HorizontalPodAutoscaler", "ScaledObject"):
        target = _one(kind)["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) == ("Deployment", name)


def test_keda_scales_on_the_servers_active_streams():
    spec = _one("ScaledObject")
    assert spec["apiVersion"] == "keda.sh/v1alpha1"
    spec = spec["spec"]
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    meta = trigger["metadata"]
    assert meta["serverAddress"].startswith("http")
    assert float(meta["threshold"]) > 0 and isinstance(meta["threshold"], str)  # KEDA: a string
    metric = re.search(r"(veena_\w+)\{", meta["query"]).group(1)
    assert metric == "veena_active_streams" and metric in _server_metric_names()
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 60


def test_the_hpa_and_the_adapter_agree_on_the_metric():
    (metric,) = _one("HorizontalPodAutoscaler")["spec"]["metrics"]
    assert metric["type"] == "Pods"
    name = metric["pods"]["metric"]["name"]
    values = yaml.safe_load((K8S / "prometheus-adapter-values.yaml").read_text())
    (rule,) = values["rules"]["custom"]
    assert rule["name"]["as"] == name and name in rule["seriesQuery"]
    assert "<<.Series>>" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]
    assert name in _server_metric_names()


def test_the_pod_monitor_scrapes_the_metrics_port():
    monitor = _one("PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    labels = _one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")


# -- Ray Serve -----------------------------------------------------------------------------------
@pytest.mark.parametrize("path", RAY_CONFIGS, ids=lambda p: p.name)
def test_the_serve_configs_build(path):
    pytest.importorskip("ray.serve")
    from ray.serve.schema import ServeDeploySchema

    from pipecat_veena.deploy.ray import VeenaReplica, build_app

    config = ServeDeploySchema.model_validate(yaml.safe_load(path.read_text()))
    (app,) = config.applications
    module, _, name = app.import_path.partition(":")
    assert (module, name) == ("pipecat_veena.deploy.ray", "build_app") and build_app
    ReplicaArgs.model_validate(app.args)  # the replicas' args are valid
    (deployment,) = app.deployments
    assert deployment.name == VeenaReplica.name


def test_the_gpu_config_spells_out_the_code_defaults():
    pytest.importorskip("ray.serve")
    from pipecat_veena.deploy import ray as deploy

    (app,) = yaml.safe_load(RAY_CONFIGS[0].read_text())["applications"]
    (options,) = app["deployments"]
    assert options["max_ongoing_requests"] == deploy.MAX_ONGOING_REQUESTS
    assert options["max_queued_requests"] == deploy.MAX_QUEUED_REQUESTS
    assert options["autoscaling_config"] == deploy.AUTOSCALING_CONFIG
    assert options["ray_actor_options"] == deploy.RAY_ACTOR_OPTIONS
    # the replicas' whole drain fits before Serve kills one (and no longer: a dead replica's
    # calls redial only once it is gone)
    args = ReplicaArgs.model_validate(app["args"])
    assert options["graceful_shutdown_timeout_s"] == deploy.shutdown_timeout_s(args)
    assert options["health_check_period_s"] == deploy.HEALTH_CHECK_PERIOD_S
    assert options["health_check_timeout_s"] == deploy.HEALTH_CHECK_TIMEOUT_S
    assert app["args"]["server"]["idle_timeout_s"] == REPLICA_SERVER_DEFAULTS["idle_timeout_s"]


def test_serve_waits_for_a_replicas_whole_drain_before_killing_it():
    pytest.importorskip("ray.serve")
    from pipecat_veena.deploy.ray import VeenaReplica, veena_app
    from pipecat_veena.server.state import drain_bound_s

    def grace(app) -> float:
        return app._bound_deployment._deployment_config.graceful_shutdown_timeout_s

    for server in ({}, {"drain_timeout_s": 300}, {"drain_timeout_s": 5}):
        args = ReplicaArgs(server=server)
        bound = drain_bound_s(args.server_settings())
        assert bound >= args.server_settings().drain_timeout_s
        # the drain and the engine's shutdown fit, and not much more: a replica's calls redial
        # at the drain's start, the grace only bounds a drain that hangs
        assert bound + 10 <= grace(veena_app(args)) <= bound + 30
    defaults = VeenaReplica._deployment_config.graceful_shutdown_timeout_s
    assert defaults == grace(veena_app(ReplicaArgs()))
    assert grace(veena_app(ReplicaArgs(), graceful_shutdown_timeout_s=9)) == 9  # options win


def test_replica_args_refuse_what_would_fail_on_every_replica(tmp_path):
    with pytest.raises(ValueError, match="engine: unknown field.*max_num_seq.*valid:"):
        ReplicaArgs(engine={"max_num_seq": 8})
    with pytest.raises(ValueError, match="server: unknown field.*api_keys"):
        ReplicaArgs(server={"api_keys": {"k": "n"}})  # keys come from a file, not the config
    with pytest.raises(ValueError, match="max_streams must be >= 1"):
        ReplicaArgs(server={"max_streams": 0})
    with pytest.raises(ValueError, match="cannot read the API key file"):
        ReplicaArgs(api_key_file=str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="Extra inputs"):
        ReplicaArgs(modle="/models/x")
    with pytest.raises(CheckpointError, match="does not exist"):  # (checked on the replica)
        ReplicaArgs(model=str(tmp_path / "nowhere")).engine_config()
    (tmp_path / "keys.txt").write_text("bot sk-1\n")
    args = ReplicaArgs(api_key_file=str(tmp_path / "keys.txt"), server={"max_streams": 8})
    settings = args.server_settings()
    assert dict(settings.api_keys) == {"sk-1": "bot"} and settings.max_streams == 8
    assert settings.idle_timeout_s == REPLICA_SERVER_DEFAULTS["idle_timeout_s"]


async def test_the_replica_names_itself_in_responses_and_handshakes():
    pytest.importorskip("ray.serve")
    from starlette.testclient import TestClient

    from pipecat_veena.deploy.ray import REPLICA_HEADER, ReplicaHeader

    engine = FakeSpeechEngine()
    app = create_app(engine)
    app.add_middleware(ReplicaHeader, name="r1")
    with TestClient(app) as client:
        assert client.get("/health").headers[REPLICA_HEADER] == "r1"
        with client.websocket_connect("/v1/audio/stream") as ws:
            assert ws.receive_json()["type"] in ("ready", "error")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as http:
        assert (await http.get("http://t/metrics")).headers[REPLICA_HEADER] == "r1"


async def test_the_health_probe_fails_once_the_engine_is_gone():
    pytest.importorskip("ray.serve")
    from pipecat_veena.deploy.ray import SpeechReplica

    replica = SpeechReplica(ReplicaArgs())
    await replica.check_health()  # not built yet: nothing to report
    engine = FakeSpeechEngine()
    replica._app = create_app(engine)
    server = replica._app.state.veena
    await engine.start()
    server.ready = True
    await replica.check_health()
    await engine.shutdown()  # (vLLM's engine process died)
    with pytest.raises(RuntimeError, match="engine is down: the engine stopped"):
        await replica.check_health()


def test_the_deploy_guide_states_the_deployment_defaults():
    pytest.importorskip("ray.serve")
    from pipecat_veena.deploy import ray as deploy

    guide = (ROOT / "docs" / "guides" / "deploy.md").read_text(encoding="utf-8")
    section = " ".join(guide[guide.index("*Ray Serve*") : guide.index("*Kubernetes*")].split())
    stated = {
        "max_ongoing_requests": f"takes {deploy.MAX_ONGOING_REQUESTS}",
        "max_queued_requests": f"{deploy.MAX_QUEUED_REQUESTS} more wait in the proxy",
        "target": f"about {deploy.AUTOSCALING_CONFIG['target_ongoing_requests']} calls",
        "replicas": f"({deploy.AUTOSCALING_CONFIG['min_replicas']} to "
        f"{deploy.AUTOSCALING_CONFIG['max_replicas']} replicas",
        "grace": f"within {deploy.shutdown_timeout_s(ReplicaArgs()):g} s",
        "idle": f"after {REPLICA_SERVER_DEFAULTS['idle_timeout_s']:g} s",
    }
    missing = {k: v for k, v in stated.items() if v not in section}
    assert not missing, f"docs/guides/deploy.md's Ray Serve defaults drifted: {missing}"
