"""pipecat_veena: self-hosted streaming LLM-TTS (BiCodec and SNAC) for Pipecat voice agents.

Public names are imported lazily so that ``import pipecat_veena`` stays cheap and the engine
never drags Pipecat (or vLLM) in with it.
"""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_PUBLIC = {
    "AudioChunk": "pipecat_veena.interface",
    "EngineConfig": "pipecat_veena.engine",
    "VeenaEngine": "pipecat_veena.engine",
    "StreamConfig": "pipecat_veena.streaming",
    "StreamDecoder": "pipecat_veena.streaming",
    "VeenaTTSService": "pipecat_veena.service",
    "RemoteVeenaEngine": "pipecat_veena.remote",
    "SpeechEngine": "pipecat_veena.interface",
    "build_demo_checkpoint": "pipecat_veena.demo",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    """Import a public name on first use."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'pipecat_veena' has no attribute {name!r}")
    return getattr(import_module(module), name)
