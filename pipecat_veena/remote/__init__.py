"""The client of the speech server: ``RemoteVeenaEngine`` and the protocol it speaks.

``engine`` (``RemoteVeenaEngine``: the ``SpeechEngine`` interface over a WebSocket), ``link``
(one connection: dial, read, redial with backoff) and ``protocol/`` (every message and error
code, shared with the server: ``pipecat_veena.server`` imports it from here). The client imports
no torch and no vLLM. Names are imported on first use, so the server's import of the protocol
does not load the client.
"""

from pipecat_veena.lazy import lazy_names

_PUBLIC = {"RemoteVeenaEngine": "engine", "stream_url": "engine"}

__all__ = list(_PUBLIC)

__getattr__ = lazy_names(__name__, _PUBLIC)
