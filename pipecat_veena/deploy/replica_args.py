"""What one replica is given: the checkpoint, engine settings and server settings (no Ray here).

These are the ``args:`` of a ``serve run`` config (``examples/ray_serve.yaml``); every replica
builds its engine and app from them. They are checked where the app is built (``serve run``
fails at once on a typo), except the checkpoint directory, which must exist on the replicas'
nodes and is checked there.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pipecat_veena.engine import EngineConfig
from pipecat_veena.server.settings import (
    ServerSettings,
    parse_voice_map,
    read_api_keys,
)

#: Server settings a replica gets unless its args say otherwise. An idle WebSocket closes after
#: a minute (``pipecat-veena serve``: 5), so a replica that Serve scales down is held only by
#: calls that are speaking, not by bot processes that keep a connection open between calls
#: (RemoteVeenaEngine redials on demand, through the proxy, to a live replica).
REPLICA_SERVER_DEFAULTS: dict[str, Any] = {"idle_timeout_s": 60.0}

_ENGINE_FIELDS = {f.name for f in fields(EngineConfig)} - {"checkpoint", "device"}
_SERVER_FIELDS = {f.name for f in fields(ServerSettings)} - {"api_keys", "voice_map"}


class ReplicaArgs(BaseModel):
    """The arguments of the Ray Serve application (the ``args:`` of a ``serve run`` config).

    Parameters:
        model: the checkpoint directory, present on every node that runs a replica (None: the
            demo checkpoint ``demo``, built on first use; random weights, for trying it out).
        demo: which demo checkpoint when ``model`` is None.
        device: the codec's device: "auto" (the replica's GPU when Ray gave it one), "cpu".
        api_key_file: bearer keys, one per line or ``name key`` (None: an open server).
        voice_map: OpenAI voice names to checkpoint voices, ``alloy=female,echo=male``.
        engine: further ``EngineConfig`` fields (``max_num_seqs``, ``warmup``, ...).
        server: further ``ServerSettings`` fields (``max_streams``, ``idle_timeout_s``, ...),
            over ``REPLICA_SERVER_DEFAULTS``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = None
    demo: Literal["spark", "spark-tiny", "veena"] = "spark"
    device: str = "auto"
    api_key_file: str | None = None
    voice_map: str | None = None
    engine: dict[str, Any] = Field(default_factory=dict)
    server: dict[str, Any] = Field(default_factory=dict)

    def model_post_init(self, _context: Any) -> None:
        """Refuse unknown engine and server fields now, naming the valid ones."""
        for name, given, valid in (
            ("engine", self.engine, _ENGINE_FIELDS),
            ("server", self.server, _SERVER_FIELDS),
        ):
            unknown = sorted(set(given) - valid)
            if unknown:
                raise ValueError(
                    f"{name}: unknown field(s) {', '.join(unknown)}; valid: "
                    f"{', '.join(sorted(valid))}"
                )
        self.server_settings()  # a bad limit, key file or voice map fails here too

    def server_settings(self) -> ServerSettings:
        """The replica's speech server settings."""
        return ServerSettings(
            api_keys=read_api_keys(self.api_key_file) if self.api_key_file else {},
            voice_map=parse_voice_map(self.voice_map) if self.voice_map else None,
            **{**REPLICA_SERVER_DEFAULTS, **self.server},
        )

    def engine_config(self) -> EngineConfig:
        """The replica's engine settings (builds the demo checkpoint when ``model`` is None).

        Raises:
            CheckpointError: the checkpoint is missing or not a known layout.
        """
        from pipecat_veena.engine import detect_layout

        if self.model is None:
            from pipecat_veena.demo import build_demo_checkpoint

            checkpoint = build_demo_checkpoint(self.demo)
        else:
            checkpoint = Path(self.model)
        detect_layout(checkpoint)
        # Serve replaces a replica whose engine died (check_health): no restart in place, by
        # default (an ``engine`` of {"restart_attempts": 3} restarts it in the replica instead)
        settings = {"restart_attempts": 0, **self.engine}
        return EngineConfig(checkpoint=checkpoint, device=self.device, **settings)
