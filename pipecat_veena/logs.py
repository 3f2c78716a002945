"""Logging that keeps secrets out: no local variables in tracebacks, keys cut from logged URLs.

loguru's own default handler renders every frame's local variables in a traceback (its
``diagnose`` mode), which prints whatever a frame holds: request bodies, settings, API keys.
So this package never hands loguru an exception: ``log_failure`` formats the traceback itself,
frames and lines only, and every sink ``configure_logging`` adds has ``diagnose`` off. uvicorn
writes each request's path and query (``?api_key=...`` on a browser's WebSocket URL) into its
access and connection logs; ``redact_uvicorn_logs`` cuts the value out (and turns the ERROR
traceback uvicorn logs for a client's invalid UTF-8 into one INFO line).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sys
import traceback
from typing import Any, TextIO

from loguru import logger

#: Query parameters whose value is a secret (``?api_key=...`` and its spellings).
_SECRET_QUERY = re.compile(r"(?i)\b((?:api[_-]?key|access[_-]?token|token|key)=)[^&\s\"']+")
REDACTED = "<redacted>"
#: The loggers uvicorn writes request paths to (requests; WebSockets; ASGI messages at trace).
UVICORN_LOGGERS = ("uvicorn.access", "uvicorn.error", "uvicorn.asgi")
#: How many characters of a caller's text ``caller_text`` shows when text is on.
TEXT_SHOWN = 60
#: The key of ``caller_text``'s hashes: one per process, so that a short text's hash cannot be
#: found by hashing guesses elsewhere (lines of one process still match each other).
_TEXT_KEY = os.urandom(16)


def configure_logging(level: str = "INFO", *, sink: TextIO | Any = None, **options: Any) -> int:
    """Replace loguru's handlers by one sink that never prints local variables.

    Call it once at start-up in a program that serves the speech server (``pipecat-veena
    serve`` does): loguru's default handler prints local variables in tracebacks.

    Args:
        level: the lowest level written.
        sink: where to write (default: stderr).
        **options: more ``logger.add`` options (``format``...); ``diagnose`` stays off.

    Returns:
        The handler id (for ``logger.remove``).
    """
    logger.remove()
    return logger.add(
        sys.stderr if sink is None else sink,
        level=level,
        **{"backtrace": False, **options, "diagnose": False},
    )


#: The features turned off because a dependency's private API changed (``degrade_once``).
_degraded: set[str] = set()


def degrade_once(feature: str, message: str) -> None:
    """Warn, once per process, that ``feature`` is off: a private API it reads has changed.

    What this package reads of another package's private state (Pipecat's ``_tts_spans``,
    Ray Serve's ``Replica.perform_graceful_shutdown``) is read behind a guard that calls this
    and carries on without the feature; tests/test_guards.py fails when the installed release
    no longer has the shape read.
    """
    if feature not in _degraded:
        _degraded.add(feature)
        logger.warning(message)


def degraded() -> frozenset[str]:
    """The features ``degrade_once`` turned off in this process."""
    return frozenset(_degraded)


def log_failure(message: str, error: BaseException) -> None:
    """Log ``message`` at ERROR with ``error``'s traceback: files and lines, no variables."""
    trace = "".join(traceback.format_exception(error)).rstrip()
    logger.error(f"{message}\n{trace}")


def caller_text(text: str, *, show: bool = False) -> str:
    """How a caller's text appears in a log line, a span or an error message.

    Args:
        text: the caller's text.
        show: the operator's switch (``EngineConfig.log_text``): True shows the text's first
            ``TEXT_SHOWN`` characters, quoted; False (the default) only its length and a short
            keyed hash, ``<text: 26 characters, #3f2a9c1b>`` (equal texts: equal hashes).
    """
    if show:
        return repr(text[:TEXT_SHOWN]) + ("..." if len(text) > TEXT_SHOWN else "")
    data = text.encode("utf-8", "surrogatepass")
    digest = hashlib.blake2s(data, digest_size=4, key=_TEXT_KEY).hexdigest()
    return f"<text: {len(text)} characters, #{digest}>"


def redact(text: str) -> str:
    """``text`` with the values of secret query parameters replaced by ``<redacted>``."""
    return _SECRET_QUERY.sub(rf"\g<1>{REDACTED}", text)


class UvicornRecords(logging.Filter):
    """Cleans uvicorn's log records; never drops one.

    Secret query values are redacted in the message and its arguments, and errors a client
    causes (invalid UTF-8 on a WebSocket) are demoted to one INFO line without a traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the record in place; never drops it."""
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
            if record.levelno >= logging.ERROR and record.msg.startswith(_CLIENT_ERRORS):
                record.levelno, record.levelname = logging.INFO, "INFO"
                record.exc_info, record.exc_text = None, None
        if isinstance(record.args, tuple):  # the access log's formatter reads them one by one
            record.args = tuple(_redacted_arg(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: _redacted_arg(v) for k, v in record.args.items()}
        return True


#: uvicorn errors that a client's bytes cause (nothing for the operator to fix).
_CLIENT_ERRORS = ("Invalid UTF-8 sequence received from client",)


def _redacted_arg(arg: object) -> object:
    if isinstance(arg, str):
        return redact(arg)
    if isinstance(arg, int | float | type(None)):
        return arg
    text = str(arg)  # a scope dict (trace level) holds the query string as bytes
    cleaned = redact(text)
    return arg if cleaned == text else cleaned


def redact_uvicorn_logs() -> None:
    """Install ``UvicornRecords`` on uvicorn's loggers (idempotent; survives its log config)."""
    for name in UVICORN_LOGGERS:
        target = logging.getLogger(name)
        if not any(isinstance(f, UvicornRecords) for f in target.filters):
            target.addFilter(UvicornRecords())
