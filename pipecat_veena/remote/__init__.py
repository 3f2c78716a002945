"""The client of the speech server: ``RemoteVeenaEngine`` and the protocol it speaks.

``engine`` (``RemoteVeenaEngine``: the ``SpeechEngine`` interface over a WebSocket), ``link``
(one connection: dial, read, redial with backoff) and ``protocol/`` (every message and error
code, shared with the server: ``pipecat_veena.server`` imports it from here). The client imports
no torch and no vLLM. Names are imported on first use, so the server's import of the protocol
does not load the client.
"""

from importlib import import_module
from typing import Any

_PUBLIC = {"RemoteVeenaEngine": "engine", "stream_url": "engine"}

__all__ = list(_PUBLIC)


def __getattr__(name: str) -> Any:
    """Import a public name on first use."""
    where = _PUBLIC.get(name)
    if where is None:
        raise AttributeError(f"module 'pipecat_veena.remote' has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{where}"), name)
