"""A request's SSML, checked before any audio.

Malformed markup is the caller's error, with its position (``bad_message``: a 400 on the HTTP
routes), never spoken and never a failure mid-stream.
"""

from __future__ import annotations

from typing import Any

from pipecat_veena.normalize.ssml import SsmlError, parse_ssml
from pipecat_veena.remote.protocol import ErrorCode, ProtocolError


def check_markup(text: str, options: dict[str, Any], ref: str | None = None) -> None:
    """Raise ``bad_message`` naming the position when ``text`` is not valid SSML.

    Nothing is checked when ``options`` does not ask for SSML (text stays data).
    """
    if not options.get("ssml"):
        return
    try:
        parse_ssml(text)
    except SsmlError as e:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"'input' is not valid SSML: {e}", ref) from None
