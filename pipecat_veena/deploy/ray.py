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

Replacing a replica (a redeploy, a scale-down, ``serve.delete``) drains it like SIGTERM drains
``pipecat-veena serve``: every WebSocket gets ``goaway``, new streams are refused, utterances in
flight finish (up to ``drain_timeout_s``), then each connection closes with 1012 and the client
redials through the proxy, which routes it to a live replica. Serve has no public hook at that
moment (see ``on_replica_stop``), so this module adds one.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Awaitable, Callable
from typing import Any

from loguru import logger

from pipecat_veena.logs import degrade_once

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
from pipecat_veena.server.state import drain_bound_s

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
#: A replica taken away (scale-down, update) stops getting new calls and drains; Serve kills it
#: ``graceful_shutdown_timeout_s`` after it began to stop. The default is the speech server's
#: drain bound (``drain_timeout_s`` plus cancelling and closing) plus this margin for the
#: engine's shutdown and Serve's own wait loop (``graceful_shutdown_wait_loop_s``, 2 s).
SHUTDOWN_MARGIN_S = 15.0
#: Serve asks each replica this often whether its engine is alive (``check_health``); three
#: failed probes in a row and it is replaced.
HEALTH_CHECK_PERIOD_S = 5.0
HEALTH_CHECK_TIMEOUT_S = 10.0
#: The response header (and WebSocket handshake header) naming the replica that answered.
REPLICA_HEADER = "x-veena-replica"


def shutdown_timeout_s(args: ReplicaArgs) -> float:
    """Serve's ``graceful_shutdown_timeout_s`` for replicas given ``args``: a whole drain fits."""
    return drain_bound_s(args.server_settings()) + SHUTDOWN_MARGIN_S


#: What runs when Serve begins to stop this process's replica (``on_replica_stop``).
_STOP_HOOKS: list[Callable[[], Awaitable[None]]] = []


def on_replica_stop(hook: Callable[[], Awaitable[None]]) -> bool:
    """Run ``hook`` as soon as Serve begins to stop the replica of this process.

    Serve gives user code no call at that moment. ``Replica._perform_graceful_shutdown``
    (ray/serve/_private/replica.py, Ray 2.60) first waits, up to ``graceful_shutdown_timeout_s``,
    for the replica's ongoing requests to end (``_drain_ongoing_requests``; through the proxy a
    WebSocket is one ongoing request for its whole life), and only then calls the deployment's
    ``__del__`` and the ASGI app's lifespan shutdown. A call's WebSocket does not end by itself,
    so a hook there would run after Serve killed the replica. This wraps
    ``Replica.perform_graceful_shutdown`` (what the controller calls to stop a replica) in this
    replica's process: ``hook`` is awaited first, then Serve's own shutdown goes on.

    Returns:
        False (with one warning per process) when this Ray has no such method, or one of
        another shape (``replica_shutdown_problem``): replicas then do not drain.
    """
    try:
        from ray.serve._private.replica import Replica
    except ImportError:  # pragma: no cover - depends on the install
        Replica = None  # noqa: N806
    problem = replica_shutdown_problem(Replica)
    if problem is not None:
        degrade_once(
            "ray.Replica.perform_graceful_shutdown",
            f"{problem}: a replica that Serve stops will not drain (its calls break when Serve "
            "kills it); tested with Ray 2.60",
        )
        return False
    original = Replica.perform_graceful_shutdown
    if not _STOP_HOOKS:

        async def perform_graceful_shutdown(self: Any) -> None:
            for stop_hook in list(_STOP_HOOKS):
                try:
                    await stop_hook()
                except Exception as e:
                    logger.error(f"replica stop hook failed: {type(e).__name__}: {e}")
            await original(self)

        Replica.perform_graceful_shutdown = perform_graceful_shutdown
    _STOP_HOOKS.append(hook)
    return True


def replica_shutdown_problem(replica_class: Any) -> str | None:
    """What stops ``on_replica_stop`` from wrapping ``replica_class``'s shutdown; None: nothing.

    The guard of Ray Serve's private ``Replica.perform_graceful_shutdown``: it must be a
    coroutine function taking only the replica (Ray 2.60). tests/test_guards.py asserts the
    installed Ray passes, so a Ray that changed it fails in CI rather than in production.
    """
    original = getattr(replica_class, "perform_graceful_shutdown", None)
    if original is None:
        return "this Ray Serve has no Replica.perform_graceful_shutdown"
    if not inspect.iscoroutinefunction(original):
        return "this Ray Serve's Replica.perform_graceful_shutdown is not a coroutine function"
    try:
        parameters = list(inspect.signature(original).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    required = [p for p in parameters[1:] if p.default is p.empty and p.kind in (
        p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]  # fmt: skip
    if not parameters or required:
        return (
            "this Ray Serve's Replica.perform_graceful_shutdown takes other arguments "
            f"({inspect.signature(original) if parameters else '?'})"
        )
    return None


def _drain_on(loop: asyncio.AbstractEventLoop, app: FastAPI) -> Callable[[], Awaitable[None]]:
    """A stop hook draining ``app``'s server on ``loop`` (the user code's loop, its own thread)."""
    server = app.state.veena

    async def drain() -> None:
        if server.draining:  # (Serve may ask a replica to stop twice)
            return
        logger.info("replica: Serve is stopping this replica; draining")
        future = asyncio.run_coroutine_threadsafe(server.drain(), loop)
        await asyncio.wrap_future(future)

    return drain


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
        on_replica_stop(_drain_on(asyncio.get_running_loop(), app))
        self._check_shutdown_timeout()
        logger.info(f"replica {name} (pid {os.getpid()}): starting {engine}")
        return app

    def _check_shutdown_timeout(self) -> None:
        """Warn when Serve would kill this replica before its drain could end."""
        context = serve.get_replica_context()
        config = getattr(context, "_deployment_config", None)
        given = getattr(config, "graceful_shutdown_timeout_s", None)
        needed = drain_bound_s(self._args.server_settings())
        if given is not None and given < needed:
            logger.warning(
                f"graceful_shutdown_timeout_s is {given:g} s, shorter than the drain "
                f"(drain_timeout_s and closing: {needed:g} s): Serve may kill this replica with "
                f"utterances in flight; give it {needed + SHUTDOWN_MARGIN_S:g} s"
            )

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
    graceful_shutdown_timeout_s=shutdown_timeout_s(ReplicaArgs()),
    health_check_period_s=HEALTH_CHECK_PERIOD_S,
    health_check_timeout_s=HEALTH_CHECK_TIMEOUT_S,
)(serve.ingress()(SpeechReplica))


def veena_app(args: ReplicaArgs | dict[str, Any] | None = None, **options: Any) -> Application:
    """The Ray Serve application: ``VeenaReplica`` with ``args``, under deployment ``options``.

    Args:
        args: the replicas' checkpoint, engine and server settings (a dict is validated).
        **options: Serve deployment options over the defaults above (and
            ``graceful_shutdown_timeout_s``, sized to ``args``' drain), e.g.
            ``num_replicas=2`` (a fixed count: autoscaling is then off) or
            ``ray_actor_options={"num_cpus": 1, "num_gpus": 0}`` (CPU replicas).

    Returns:
        The application, for ``serve.run(app, name=..., route_prefix="/")``.
    """
    if not isinstance(args, ReplicaArgs):
        args = ReplicaArgs.model_validate(args or {})
    options.setdefault("graceful_shutdown_timeout_s", shutdown_timeout_s(args))
    if "num_replicas" in options and "autoscaling_config" not in options:
        options["autoscaling_config"] = None
    deployment = VeenaReplica.options(**options) if options else VeenaReplica
    return deployment.bind(args)


def build_app(args: dict[str, Any]) -> Application:
    """The application builder that ``serve run`` calls with a config's ``args:``."""
    return veena_app(args)
