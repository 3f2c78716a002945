"""The in-process engine: text in, streamed audio out, over vLLM and a codec in this process.

This module is the engine's public face: code outside ``engine/`` imports from here, never
from the modules inside. Names are imported on first use, so that a client that only needs the
voice vocabulary (``RemoteVeenaEngine``) does not load the engine, the codecs or the normaliser.

Inside: ``core`` (``VeenaEngine``), ``utterance`` (one request: parts, generation, decode),
``config`` (``EngineConfig``), ``formats`` (the Spark/Veena3 and Veena/Orpheus layouts),
``prompts``, ``voices``, ``tokens`` (id ranges checked at load), ``guards`` (loops, caps),
``checkpoint`` (layout detection), ``calibrate`` (seam lookahead on loaded weights).
"""

from pipecat_veena.lazy import lazy_names

_PUBLIC = {
    "VeenaEngine": "core",
    "load_codec": "core",
    "EngineConfig": "config",
    "AudioChunk": "pipecat_veena.interface",
    "CheckpointLayout": "checkpoint",
    "detect_layout": "checkpoint",
    "ModelFormat": "formats",
    "load_format": "formats",
    "LEVELS": "voices",
    "Voice": "voices",
    "VoiceBook": "voices",
    "VoicePrint": "voices",
    "check_level": "voices",
    "spark_voices": "voices",
    "veena_voices": "voices",
    "check_voice_name": "enrolment",
    "default_voices_file": "voices_file",
    "enrol_into_file": "voices_file",
    "read_voices_file": "voices_file",
    "remove_from_file": "voices_file",
    "share_in_file": "voices_file",
    "voice_with_levels": "voices",
    "calibrate_lookahead": "calibrate",
    "lookahead_curve": "calibrate",
    "pick_lookahead": "calibrate",
    "SPEED_MAX": "pipecat_veena.streaming.tsm",
    "SPEED_MIN": "pipecat_veena.streaming.tsm",
    "TimeStretcher": "pipecat_veena.streaming.tsm",
    "check_speed": "pipecat_veena.streaming.tsm",
    "stretch": "pipecat_veena.streaming.tsm",
}

__all__ = list(_PUBLIC)

__getattr__ = lazy_names(__name__, _PUBLIC)
