"""The speech server: one engine per GPU behind a WebSocket and OpenAI-compatible HTTP API.

Run it with ``pipecat-veena serve``, or build the app yourself with ``create_app(engine)``.
Nothing in the engine imports this package; it needs FastAPI and uvicorn (the ``server``
extra). Public names are imported on first use, so reading ``ServerSettings`` stays cheap.
"""

from pipecat_veena.lazy import lazy_names

_PUBLIC = {
    "create_app": "pipecat_veena.server.app",
    "ServerHandle": "pipecat_veena.server.runner",
    "ServerSettings": "pipecat_veena.server.settings",
}

__all__ = list(_PUBLIC)

__getattr__ = lazy_names(__name__, _PUBLIC)
