"""The README and the docs guides say only what is true of the code: every EngineConfig field
is documented, and every controllable voice name they show parses."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from pipecat_veena.engine import EngineConfig, spark_voices

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
GUIDES = {p.name: p.read_text(encoding="utf-8") for p in (ROOT / "docs" / "guides").glob("*.md")}
PROTOCOL = (Path(__file__).resolve().parent.parent / "docs/protocol.md").read_text(encoding="utf-8")


def test_every_engine_config_field_is_in_the_configuration_guide():
    table = GUIDES["configuration.md"]
    missing = [f.name for f in fields(EngineConfig) if f"| `{f.name}` |" not in table]
    assert not missing, f"docs/guides/configuration.md's table lacks {missing}"


def test_voice_names_shown_in_the_docs_are_valid(tmp_path):
    book = spark_voices(tmp_path, 32)  # the controllable voices of a Spark-TTS checkpoint
    text = "\n".join([README, *GUIDES.values()])
    names = set(re.findall(r"\b(?:female|male)(?::[a-z_]+){1,2}\b", text))
    assert names, "the docs show no pitch/speed voice"
    for name in names:
        book.resolve(name)  # UnknownVoiceError for a level that does not exist


def test_the_protocol_gives_one_handshake_header_limit_the_servers():
    """It said 128 handshake headers in one table and 100 in another; the server's settings
    (and ``MAX_HEADER_LINE``) are what hold, on handshakes too (tests/test_http_limits.py)."""
    from pipecat_veena.server import ServerSettings
    from pipecat_veena.server.http_limits import MAX_HEADER_LINE

    limits = ServerSettings()
    (row,) = [line for line in PROTOCOL.splitlines() if line.startswith("| handshake headers")]
    assert f"{limits.max_headers} header fields" in row
    assert f"{limits.max_header_bytes} bytes" in row and f"{MAX_HEADER_LINE} bytes" in row
    assert f"| `--max-headers` | {limits.max_headers} |" in PROTOCOL
    assert f"| `--max-header-bytes` | {limits.max_header_bytes} |" in PROTOCOL
    assert "128 headers" not in PROTOCOL
