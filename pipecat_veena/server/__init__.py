"""The speech server: one engine per GPU behind a WebSocket and OpenAI-compatible HTTP API.

Run it with ``pipecat-veena serve``, or build the app yourself with ``create_app(engine)``.
Nothing in the engine imports this package; it needs FastAPI and uvicorn (the ``server``
extra). Public names are imported on first use, so reading ``ServerSettings`` stays cheap.
"""

from importlib import import_module
from typing import Any

_PUBLIC = {
    "create_app": "pipecat_veena.server.app",
    "ServerHandle": "pipecat_veena.server.runner",
    "ServerSettings": "pipecat_veena.server.settings",
}

__all__ = list(_PUBLIC)


def __getattr__(name: str) -> Any:
    """Import a public name on first use."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'pipecat_veena.server' has no attribute {name!r}")
    return getattr(import_module(module), name)
