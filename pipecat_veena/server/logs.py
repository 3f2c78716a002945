"""The speech server's log output: text for people, or JSON lines for log pipelines.

Every log line about one utterance carries ``request_id`` (and on the server
``server_request_id``) in its extra fields: ``SpeechRun.log_context``, set with
``logger.contextualize`` around the utterance's task, so the engine's lines have it too. In
JSON (``pipecat-veena serve --log-format json``) each line is loguru's serialized record:
``{"text": ..., "record": {"level": ..., "message": ..., "extra": {"request_id": ...}, ...}}``,
and the standard library's records (uvicorn, vLLM in this process) are sent through loguru, so
that every line of the server's stderr is JSON. ``serve``'s own lines for its operator
(``ready: ...`` on stdout, ``error: ...`` on stderr) go through ``console`` and
``console_error``: in JSON they are JSON too.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback

from loguru import logger

from pipecat_veena.logs import configure_logging

#: The ``--log-format`` choices.
LOG_FORMATS = ("text", "json")


class ToLoguru(logging.Handler):
    """Sends the standard library's log records to loguru (keeping level and logger name)."""

    def emit(self, record: logging.LogRecord) -> None:  # noqa: D102
        try:
            level: str | int = logger.level(record.levelname).name
        except ValueError:
            level = record.levelno
        message = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:  # frames and lines, no variables
            message += "\n" + "".join(traceback.format_exception(record.exc_info[1])).rstrip()
        logger.bind(logger_name=record.name).log(level, message)


def configure_server_logs(log_format: str, *, verbose: bool) -> bool:
    """Send the server's logs to stderr: debug when ``verbose``, else info (and up).

    Args:
        log_format: "text" or "json".
        verbose: also debug lines (and the standard library's info lines).

    Returns:
        True when uvicorn should set up its own (text) logging; False in JSON, where its
        records reach loguru through ``ToLoguru`` instead.

    Raises:
        ValueError: an unknown format, naming the valid ones.
    """
    if log_format not in LOG_FORMATS:
        raise ValueError(
            f"--log-format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}"
        )
    as_json = log_format == "json"
    configure_logging("DEBUG" if verbose else "INFO", serialize=as_json)  # (no variables logged)
    if as_json:
        level = logging.INFO if verbose else logging.WARNING
        logging.basicConfig(handlers=[ToLoguru()], level=level, force=True)
        logging.captureWarnings(True)  # Python warnings too ("py.warnings")
    return not as_json


def console(log_format: str, event: str, message: str, **fields: object) -> None:
    """Write one of ``serve``'s own lines to stdout (``ready: ...``, ``stopped``).

    Args:
        log_format: "text": ``message`` as it is; "json": one JSON object,
            ``{"event": event, "message": message, **fields}``.
        event: what happened, for a log pipeline ("ready", "playground", "stopped").
        message: the line a person reads.
        **fields: more JSON fields (JSON only).
    """
    line = json.dumps({"event": event, "message": message, **fields}) if log_format == "json" \
        else message  # fmt: skip
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def console_error(log_format: str, message: str) -> None:
    """Write ``serve``'s one-line failure to stderr.

    ``error: message`` as text; in JSON an ERROR record like every other line there (the sink
    ``configure_server_logs`` set up).
    """
    if log_format == "json":
        logger.error(message)
    else:
        sys.stderr.write(f"error: {message}\n")
        sys.stderr.flush()
