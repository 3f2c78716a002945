"""The app factory: one ASGI app (FastAPI) over one SpeechEngine, plus health, ready and metrics.

``create_app(engine)`` takes an engine that is already built (the CLI builds a VeenaEngine, tests
pass one sharing the session's vLLM engine), so the same app runs in-process, under
``pipecat-veena serve`` and under other ASGI hosts. The engine starts in the app's lifespan, on
the server's event loop (vLLM binds an engine to its loop), in the background: ``/health``
answers at once, ``/ready`` once the engine has warmed up. ``/`` is the playground page.
With API keys, FastAPI's ``/docs``, ``/redoc`` and ``/openapi.json`` are off (they would be open
to anyone: a browser cannot send a bearer key to them); docs/protocol.md describes the API.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from pipecat_veena import __version__
from pipecat_veena.interface import SpeechEngine
from pipecat_veena.logs import redact_uvicorn_logs
from pipecat_veena.remote.protocol import STREAM_PATH
from pipecat_veena.server.cartesia import router as cartesia_router
from pipecat_veena.server.elevenlabs import router as elevenlabs_router
from pipecat_veena.server.metrics import CONTENT_TYPE
from pipecat_veena.server.openai_routes import router as openai_router
from pipecat_veena.server.playground import add_playground
from pipecat_veena.server.settings import ServerSettings
from pipecat_veena.server.state import SpeechServer
from pipecat_veena.server.voice_routes import router as voice_router
from pipecat_veena.server.ws import stream_endpoint


def create_app(
    engine: SpeechEngine,
    settings: ServerSettings | None = None,
    *,
    owns_engine: bool = True,
    demo: bool = False,
    wait_ready: bool = False,
) -> FastAPI:
    """Build the speech server app over ``engine``.

    Args:
        engine: the engine to serve; started in the lifespan if it is not running.
        settings: limits, timeouts and API keys (defaults: ``ServerSettings()``).
        owns_engine: shut the engine down when the app stops (False when it is shared).
        demo: the engine runs a demo checkpoint (random weights: sound, not words); said in
            ``GET /v1/audio/voices`` and on the playground page.
        wait_ready: finish the lifespan's startup only once the engine is warm (raising what
            made its start fail), for hosts that route to an app once its startup is over
            (Ray Serve); False: start it in the background and answer ``/health`` meanwhile.

    Returns:
        The app; its shared state is ``app.state.veena`` (a ``SpeechServer``).
    """
    server = SpeechServer(engine, settings or ServerSettings(), owns_engine=owns_engine, demo=demo)
    redact_uvicorn_logs()  # uvicorn logs each URL, with a browser's ?api_key=

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        server.launch()
        try:
            if wait_ready:
                await server.wait_started()
            yield
        finally:
            await server.close()

    open_docs = not server.settings.api_keys
    app = FastAPI(
        title="pipecat-veena speech server",
        lifespan=lifespan,
        **({} if open_docs else {"docs_url": None, "redoc_url": None, "openapi_url": None}),
    )
    app.state.veena = server
    app.include_router(openai_router)
    app.include_router(voice_router)
    app.include_router(cartesia_router)  # Cartesia's /tts/websocket and /tts/bytes
    app.include_router(elevenlabs_router)  # ElevenLabs' multi-stream-input WebSocket
    app.add_api_websocket_route(STREAM_PATH, stream_endpoint)
    add_playground(app)

    @app.get("/health")
    async def health() -> Response:
        """Liveness: 200 unless the engine failed to start or died after starting."""
        detail = server.liveness()
        if detail is not None:
            return JSONResponse(
                {"status": "failed", "detail": detail, "version": __version__}, status_code=503
            )
        return JSONResponse({"status": "ok", "version": __version__})

    @app.get("/ready")
    async def ready() -> Response:
        """Readiness: 200 only while the engine is warm and the server takes new streams."""
        problem = server.availability()
        if problem is None:
            return JSONResponse({"status": "ready", "active_streams": server.slots.active})
        return JSONResponse(
            {"status": problem.code, "detail": problem.message},
            status_code=503,
            headers={"Retry-After": "1"},
        )

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        """Prometheus text format."""
        return Response(server.metrics.render(), media_type=CONTENT_TYPE)

    return app
