"""Voice enrolment over HTTP: ``POST /v1/audio/voices`` and ``DELETE /v1/audio/voices/{name}``.

``POST`` takes a multipart form: ``file`` (a 3-30 s clip of one speaker: WAV, FLAC, MP3,
Ogg (Opus or Vorbis), M4A/MP4/AAC or WebM/Opus), ``name``, ``consent`` (``true``, ``on``, ``1``
or ``yes``: the speaker agreed) and optionally
``transcript`` (only where the engine enrols with transcripts; elsewhere a 422 says so). The
enrolled voice is then a voice name like the built-in ones, in every API; with a voices file
(``pipecat-veena serve --voices-file``) it is written there, and replicas sharing the file
reload it. ``GET /v1/audio/voices`` (in ``openai_routes``) lists enrolled voices with the
others. Every refusal is an OpenAI-shaped error naming the problem (codes in docs/protocol.md);
nothing uploaded is written to disk (see ``uploads``). Decoding and enrolment run on the
upload workers (``workers``), never on the thread pool speech uses; when they are full the
upload gets 429 ``uploads_busy`` with ``Retry-After``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from loguru import logger
from starlette.datastructures import FormData, UploadFile

from pipecat_veena.errors import EnrolmentError, UnknownVoiceError
from pipecat_veena.remote.protocol import ErrorCode, ProtocolError
from pipecat_veena.server.limits import voice_owner
from pipecat_veena.server.openai_routes import admitted, error_response, read_body
from pipecat_veena.server.state import SpeechServer
from pipecat_veena.server.uploads import decode_clip, parse_form
from pipecat_veena.server.workers import upload_workers

#: Longest clip decoded, in seconds (the engine refuses longer ones).
MAX_CLIP_SECONDS = 30.0
#: What ``consent`` must be (``on``: an HTML checkbox's value).
CONSENT_VALUES = ("true", "1", "yes", "on")

router = APIRouter()


def _enrolling_engine(server: SpeechServer) -> Any:
    engine = server.engine
    if not callable(getattr(engine, "enroll_voice", None)):
        raise ProtocolError(
            ErrorCode.ENROLMENT_UNSUPPORTED,
            f"this server's engine ({type(engine).__name__}) cannot enrol voices: enrol on a "
            "server that runs the model in process (pipecat-veena serve)",
        )
    return engine


def _field(form: FormData, name: str) -> str | None:
    value = form.get(name)
    if isinstance(value, UploadFile):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"'{name}' must be a form field, not a file")
    return value


def _check_consent(form: FormData) -> None:
    if (_field(form, "consent") or "").strip().lower() not in CONSENT_VALUES:
        raise ProtocolError(
            ErrorCode.CONSENT_REQUIRED,
            "enrolling a voice needs the speaker's consent: send the form field consent=true "
            "to confirm that the person whose voice this is agreed to its use",
        )


def _check_transcript(engine: Any, form: FormData) -> str | None:
    transcript = (_field(form, "transcript") or "").strip() or None
    if transcript is not None and not getattr(engine, "enrols_with_transcript", False):
        raise ProtocolError(
            ErrorCode.TRANSCRIPT_UNSUPPORTED,
            "this server enrols voices from the audio alone: transcript mode needs the "
            "wav2vec2 model (the wav2vec2-large-xlsr-53 directory of Spark-TTS-0.5B next to "
            "the checkpoint); leave 'transcript' out to enrol global-only",
        )
    return transcript


async def _upload(form: FormData) -> bytes:
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise ProtocolError(
            ErrorCode.BAD_MESSAGE,
            "'file' (the voice clip, as a file part of the form) is required",
        )
    return await upload.read()


@router.post("/v1/audio/voices")
async def enrol(request: Request) -> Response:
    """Enrol a voice from an uploaded clip; 201 with the voice (see the module docstring)."""
    server: SpeechServer = request.app.state.veena
    settings = server.settings
    try:
        admitted(request)
        engine = _enrolling_engine(server)
        body = await read_body(request, settings, settings.max_upload_bytes)
        form = await parse_form(request.headers, body)
        try:
            _check_consent(form)
            who = _ownership(server, request, form)  # owner, replace, limit
            name = engine.check_enrolment(_field(form, "name") or "", **who)
            transcript = _check_transcript(engine, form)
            data = await _upload(form)
        finally:
            await form.close()
        del body
        workers = upload_workers()
        with workers.admit():
            samples, rate = await workers.run(decode_clip, data, MAX_CLIP_SECONDS)
            del data
            extra = {"transcript": transcript} if transcript is not None else {}
            voice = await engine.enroll_voice(
                name, samples, rate, executor=workers.executor, **who, **extra
            )
    except ProtocolError as e:
        server.metrics.error("http", e.code)
        status = 429 if e.code == ErrorCode.UPLOADS_BUSY else None  # with Retry-After
        return error_response(e, "file" if e.code in _FILE_CODES else None, status)
    except EnrolmentError as e:
        server.metrics.error("http", e.code)
        return error_response(ProtocolError(e.code, str(e)))
    logger.info(f"speech server: voice {voice.name!r} enrolled ({len(samples) / rate:.1f} s clip)")
    return JSONResponse(
        {
            "id": voice.name,
            "name": voice.name,
            "object": "audio.voice",
            "global_tokens": list(voice.globals or ()),
            "transcript": transcript is not None,
        },
        status_code=201,
    )


_FILE_CODES = (ErrorCode.NOT_AUDIO, ErrorCode.UNSUPPORTED_CODEC, ErrorCode.BAD_VOICE_CLIP)


def _ownership(server: SpeechServer, request: Request, form: FormData) -> dict[str, Any]:
    """Whose voice an enrolment makes, whether it may replace theirs, the cap on voices.

    The voice belongs to the caller's key (``limits.voice_owner``); re-enrolling one's own name
    replaces it only with ``replace=true`` (else 409 ``voice_name_taken`` saying so).
    """
    replace = (_field(form, "replace") or "").strip().lower()
    if replace not in ("", *CONSENT_VALUES, "false", "0", "no", "off"):
        raise ProtocolError(
            ErrorCode.BAD_MESSAGE, f"'replace' must be true or false, got {replace[:20]!r}"
        )
    return {
        "owner": voice_owner(server.settings, request),
        "replace": replace in CONSENT_VALUES,
        "limit": server.settings.max_enrolled_voices,
    }


@router.delete("/v1/audio/voices/{name}")
async def remove(request: Request, name: str) -> Response:
    """Remove one's own enrolled voice (built-in voices stay).

    404 for a name that is no voice, or another key's voice; 403 ``voice_not_owned`` for a
    voice shared with the caller but not theirs. The voices file is changed on a worker thread.
    """
    try:
        server = admitted(request)
        engine = _enrolling_engine(server)
        owner = voice_owner(server.settings, request)
        key = await asyncio.to_thread(engine.remove_voice, name, owner)
    except ProtocolError as e:
        return error_response(e)
    except UnknownVoiceError as e:
        return error_response(ProtocolError(ErrorCode.UNKNOWN_VOICE, str(e)), status=404)
    except EnrolmentError as e:  # a built-in voice (409), or a voices file it cannot write
        return error_response(ProtocolError(e.code, str(e)))
    return JSONResponse({"id": key, "object": "audio.voice", "deleted": True})
