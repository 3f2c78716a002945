"""The speech server: one engine per GPU behind a WebSocket and OpenAI-compatible HTTP API.

Run it with ``pipecat-veena serve``, or build the app yourself with ``create_app(engine)``.
Nothing in the engine imports this package; it needs FastAPI and uvicorn.
"""

from pipecat_veena.server.app import create_app
from pipecat_veena.server.runner import ServerHandle
from pipecat_veena.server.settings import ServerSettings

__all__ = ["ServerHandle", "ServerSettings", "create_app"]
