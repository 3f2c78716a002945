"""Ray Serve: one VeenaEngine per replica, behind the speech server's own app (the same API).

Start it with ``serve run examples/ray_serve.yaml`` (the config names ``build_app`` and its
args), or from Python::

    from ray import serve
    from pipecat_veena.deploy.ray import veena_app

    serve.run(veena_app({"model": "/models/Spark-TTS-0.5B"}), name="veena", route_prefix="/")

Each replica is a Ray actor that owns one engine (a GPU, through ``ray_actor_options``) and
serves the app of ``pipecat-veena serve`` (``create_app``): the WebSocket ``/v1/audio/stream``,
the OpenAI routes, ``/health``, ``/ready`` and ``/metrics``, behind Serve's HTTP proxy. Serve
routes to a replica once its engine is warm, restarts one whose process died or whose engine
stopped (``check_health``), and scales on ongoing requests.

Long streams, not request/response. To Serve a WebSocket is one request for its whole life: a
call's connection stays on the replica it reached, and every utterance on it runs there. An
HTTP speech request is one request until its last byte. Serve's defaults (5 ongoing requests a
replica) would refuse the sixth call; the defaults below are set for calls, and a ``serve run``
config overrides any of them per deployment.
"""

from __future__ import annotations

import os
from typing import Any

from loguru import logger

try:
    from ray import serve
    from ray.serve import Application
except ModuleNotFoundError as e:  # pragma: no cover - depends on the install
    logger.error("Ray Serve is not installed: pip install 'pipecat-veena[ray]'")
    raise ImportError(
        "pipecat_veena.deploy.ray needs Ray Serve: pip install 'pipecat-veena[ray]'"
    ) from e

from fastapi import FastAPI

from pipecat_veena.deploy.replica_args import ReplicaArgs

#: Ongoing requests one replica takes: its calls' WebSockets (one each, for the whole call) plus
#: HTTP speech streams. The speech server's own ``max_streams`` (utterances generating at once)
#: still guards the engine: more calls than that speaking at the same moment get
#: ``too_many_streams`` for the excess utterances, not a slower engine for all.
MAX_ONGOING_REQUESTS = 128
#: Calls that wait in the proxy for a replica with room. Few: when every replica is full the
#: proxy answers 503 at once (RemoteVeenaEngine backs off and redials) instead of holding a
#: call's handshake for as long as the calls ahead of it last.
MAX_QUEUED_REQUESTS = 16
#: Scale on ongoing requests (calls): about ``target_ongoing_requests`` per replica. A new
#: replica takes an engine start (tens of seconds on a GPU) before it is routed to, so scale up
#: after 10 s of load and down only after 5 quiet minutes.
AUTOSCALING_CONFIG: dict[str, Any] = {
    "min_replicas": 1,
    "max_replicas": 4,
    "target_ongoing_requests": 32,
    "upscale_delay_s": 10.0,
    "downscale_delay_s": 300.0,
}
#: One GPU per replica (the codec and vLLM share it); one CPU for the event loop and codec glue.
RAY_ACTOR_OPTIONS: dict[str, Any] = {"num_cpus": 1, "num_gpus": 1}
#: A replica taken away (scale-down, update) stops getting new calls, then waits this long for
#: the calls it holds to end before it is killed.
GRACEFUL_SHUTDOWN_TIMEOUT_S = 120.0
#: Serve asks each replica this often whether its engine is alive (``check_health``); three
#: failed probes in a row and it is replaced.
HEALTH_CHECK_PERIOD_S = 5.0
HEALTH_CHECK_TIMEOUT_S = 10.0
#: The response header (and WebSocket handshake header) naming the replica that answered.
REPLICA_HEADER = "x-veena-replica"


class ReplicaHeader:
    """ASGI middleware: names the replica in every HTTP response and WebSocket handshake.

    Load tools and tests read it to see where a call landed and to collect ``/metrics`` of
    each replica through the proxy.

    Args:
        app: the wrapped ASGI app.
        name: this replica's name (Serve's replica tag).
    """

    def __init__(self, app: Any, *, name: str) -> None:
        self.app = app
        self._header = (REPLICA_HEADER.encode(), name.encode())

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        """Pass the request on, adding the header to the response's first message."""
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        header = self._header

        async def send_named(message: dict) -> None:
            if message["type"] in ("http.response.start", "websocket.accept"):
                message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)

        await self.app(scope, receive, send_named)


class SpeechReplica:
    """One replica (deployment ``VeenaReplica``): a VeenaEngine and the speech server app.

    The engine starts while Serve initialises the replica (the app's lifespan waits for it to
    be warm), so Serve routes nothing here before ``/ready`` would say 200; a start that fails
    fails the replica, which Serve retries.

    Args:
        args: the checkpoint, engine and server settings (``ReplicaArgs``).
    """

    def __init__(self, args: ReplicaArgs) -> None:
        self._args = args
        self._app: FastAPI | None = None

    async def __serve_build_asgi_app__(self) -> FastAPI:
        """Build this replica's engine and app (Serve runs the app's lifespan next)."""
        from pipecat_veena.demo import is_demo_checkpoint
        from pipecat_veena.engine import VeenaEngine
        from pipecat_veena.server.app import create_app

        name = serve.get_replica_context().replica_tag
        config = self._args.engine_config()
        engine = VeenaEngine(config)
        demo = is_demo_checkpoint(config.checkpoint)
        app = create_app(engine, self._args.server_settings(), demo=demo, wait_ready=True)
        app.add_middleware(ReplicaHeader, name=name)
        self._app = app
        logger.info(f"replica {name} (pid {os.getpid()}): starting {engine}")
        return app

    async def check_health(self) -> None:
        """Serve's health probe: raises (and Serve replaces the replica) when the engine died."""
        problem = self._app.state.veena.liveness() if self._app is not None else None
        if problem is not None:
            raise RuntimeError(f"the speech server's engine is down: {problem}")


# The deployment wraps the plain class instead of decorating it, so that the class stays
# importable by name: Ray then pickles it by reference, not by value with its module's globals
# (the logger's file sinks cannot be pickled in a Ray worker).
VeenaReplica = serve.deployment(
    name="VeenaReplica",
    max_ongoing_requests=MAX_ONGOING_REQUESTS,
    max_queued_requests=MAX_QUEUED_REQUESTS,
    autoscaling_config=AUTOSCALING_CONFIG,
    ray_actor_options=RAY_ACTOR_OPTIONS,
    graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_TIMEOUT_S,
    health_check_period_s=HEALTH_CHECK_PERIOD_S,
    health_check_timeout_s=HEALTH_CHECK_TIMEOUT_S,
)(serve.ingress()(SpeechReplica))


def veena_app(args: ReplicaArgs | dict[str, Any] | None = None, **options: Any) -> Application:
    """The Ray Serve application: ``VeenaReplica`` with ``args``, under deployment ``options``.

    Args:
        args: the replicas' checkpoint, engine and server settings (a dict is validated).
        **options: Serve deployment options over the defaults above, e.g.
            ``num_replicas=2`` (a fixed count: autoscaling is then off) or
            ``ray_actor_options={"num_cpus": 1, "num_gpus": 0}`` (CPU replicas).

    Returns:
        The application, for ``serve.run(app, name=..., route_prefix="/")``.
    """
    if not isinstance(args, ReplicaArgs):
        args = ReplicaArgs.model_validate(args or {})
    if "num_replicas" in options and "autoscaling_config" not in options:
        options["autoscaling_config"] = None
    deployment = VeenaReplica.options(**options) if options else VeenaReplica
    return deployment.bind(args)


def build_app(args: dict[str, Any]) -> Application:
    """The application builder that ``serve run`` calls with a config's ``args:``."""
    return veena_app(args)
