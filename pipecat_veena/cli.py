"""The ``pipecat-veena`` command line: ``say``, ``serve``, ``normalize``, ``voices`` and more.

The only module that prints.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
import warnings
from pathlib import Path

DEMO_NOTE = (
    "Demo checkpoints have random codec weights and a toy LLM: they make sound, not words. "
    "Point --model at a real checkpoint directory (Spark-TTS-0.5B layout or Veena3: LLM/ + "
    "BiCodec/; Veena: the LLM with a snac_24khz/ directory) for speech."
)


def _build_demo(args: argparse.Namespace) -> int:
    from pipecat_veena.demo import DEMO_KINDS, build_demo_checkpoint

    kinds = DEMO_KINDS if args.kind == "all" else (args.kind,)
    for kind in kinds:
        start = time.perf_counter()
        path = build_demo_checkpoint(kind, dir=args.dir)
        print(f"{kind}: {path} ({time.perf_counter() - start:.0f} s)")
    print(DEMO_NOTE)
    return 0


def _normalize(args: argparse.Namespace) -> int:
    """Print the text the model is given for TEXT: one prompt a line, pauses as [pause N ms]."""
    from pipecat_veena.normalize import Lexicon
    from pipecat_veena.normalize.ssml import model_text, speech_parts

    lexicon = Lexicon.load(args.lexicon) if args.lexicon is not None else None
    parts = speech_parts(args.text, args.language, lexicon=lexicon, ssml=args.ssml)
    print(model_text(parts))
    return 0


def _codec_dtype(args: argparse.Namespace) -> str | None:
    """``--codec-dtype``: None for auto (the engine's CPU probe, or its GPU default)."""
    return None if args.codec_dtype == "auto" else args.codec_dtype


def _engine_config(args: argparse.Namespace, checkpoint: Path, **settings: object) -> object:
    """The ``EngineConfig`` of ``say`` and ``serve``.

    The checkpoint, ``--device`` and ``--codec-dtype``, plus ``settings``.
    """
    from pipecat_veena.engine import EngineConfig

    return EngineConfig(
        checkpoint=checkpoint, device=args.device, codec_dtype=_codec_dtype(args), **settings
    )


def _add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """``--device`` and ``--codec-dtype``, shared by ``say`` and ``serve``."""
    parser.add_argument("--device", default="auto", help="codec device: auto, cpu, cuda")
    parser.add_argument(
        "--codec-dtype",
        choices=("auto", "float32", "bfloat16", "float16"),
        default="auto",
        help="codec dtype (auto: on CPU a timed probe at start picks bfloat16 where the CPU "
        "computes it natively and it is faster, else float32; bfloat16 on GPU)",
    )


async def _say_async(args: argparse.Namespace, checkpoint: Path) -> int:
    from pipecat_veena.engine import VeenaEngine
    from pipecat_veena.wav_sink import say_to_wav

    quiet = {} if args.verbose else {"engine_kwargs": {"use_tqdm_on_load": False}}
    engine = VeenaEngine(_engine_config(args, checkpoint, generator_kwargs=quiet))
    try:
        await engine.start()
        result = await say_to_wav(
            engine,
            args.text,
            args.output,
            voice=args.voice,
            sample_rate=args.sample_rate,
            seed=args.seed,
            language=None if args.language == "auto" else args.language,
            normalize=False if args.no_normalize else None,
            speed=args.speed,
        )
    finally:
        await engine.shutdown()
    for error in result.errors:
        print(f"error: {error}", file=sys.stderr)
    if result.audio_seconds == 0:
        print(result.summary(), file=sys.stderr)
        return 1
    print(f"wrote {result.summary()}")
    return 0


def _quiet(verbose: bool) -> None:
    """Keep the output to what the user needs: our warnings and errors, vLLM's errors only.

    vLLM's start-up warnings on CPU (no Triton, no tcmalloc, eager mode, tokenizer-less EOS)
    say nothing a user of this command can act on; ``-v`` shows everything.
    """
    from pipecat_veena.logs import configure_logging

    if verbose:  # everything, but never a traceback's variables (they hold keys and text)
        configure_logging("DEBUG")
        return
    configure_logging("WARNING", format="{level}: {message}")
    # inherited by vLLM's engine process too
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    os.environ.setdefault("TORCH_LOGS", "-all")  # torch's own loggers: errors only
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("torch").setLevel(logging.ERROR)


def _say(args: argparse.Namespace) -> int:
    checkpoint = _demo_or(args.model)
    _quiet(args.verbose)
    _check_voice(checkpoint, args.voice)  # before the engine loads (tens of seconds)
    if args.speed is not None:
        from pipecat_veena.engine import check_speed

        try:
            check_speed(args.speed)
        except ValueError as e:
            print(f"error: --speed: {e}", file=sys.stderr)
            return 2
    return asyncio.run(_say_async(args, checkpoint))


def _check_voice(checkpoint: Path, voice: str | None) -> None:
    """Raise CheckpointError / UnknownVoiceError now rather than after loading the engine."""
    from pipecat_veena.engine import detect_layout, spark_voices, veena_voices

    layout = detect_layout(checkpoint)
    if layout.family == "bicodec":
        spark_voices(layout.root, 32).resolve(voice)
    else:
        veena_voices(layout.root).resolve(voice)


def _demo_or(model: Path | None) -> Path:
    if model is not None:
        return model
    from pipecat_veena.demo import build_demo_checkpoint

    checkpoint = build_demo_checkpoint("spark")
    print(f"using the demo checkpoint {checkpoint}")
    print(DEMO_NOTE)
    return checkpoint


def _server_settings(args: argparse.Namespace) -> object:
    from pipecat_veena.server.settings import ServerSettings, parse_voice_map, read_api_keys

    return ServerSettings(
        api_keys=read_api_keys(args.api_key_file) if args.api_key_file else {},
        max_streams=args.max_streams,
        max_streams_per_key=args.max_streams_per_key,
        max_streams_per_anonymous_client=args.max_streams_per_anonymous_client or None,
        max_open_utterances=args.max_open_utterances,
        open_utterance_timeout_s=args.open_utterance_timeout,
        max_text_chars=args.max_text_chars,
        max_message_bytes=args.max_message_bytes,
        max_upload_bytes=args.max_upload_bytes,
        idle_timeout_s=args.idle_timeout,
        slow_client_timeout_s=args.slow_client_timeout,
        drain_timeout_s=args.drain_timeout,
        max_connections=args.max_connections,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        max_header_bytes=args.max_header_bytes,
        max_headers=args.max_headers,
        voice_map=parse_voice_map(args.voice_map) if args.voice_map else None,
        max_enrolled_voices=args.max_enrolled_voices or None,
    )


async def _serve_async(args: argparse.Namespace, checkpoint: Path, settings: object) -> int:
    from pipecat_veena.demo import is_demo_checkpoint
    from pipecat_veena.engine import VeenaEngine
    from pipecat_veena.server import ServerHandle, create_app
    from pipecat_veena.server.logs import console, console_error
    from pipecat_veena.server.runner import serve_until_signalled

    # JSON logs: no progress bar from vLLM's engine process on stderr either
    quiet_load = {"engine_kwargs": {"use_tqdm_on_load": False}} if args.log_format == "json" else {}
    from pipecat_veena.engine import default_voices_file

    voices_file = args.voices_file or default_voices_file(checkpoint)
    engine = VeenaEngine(
        _engine_config(
            args,
            checkpoint,
            generator_kwargs=quiet_load,
            voices_file=voices_file,
            log_text=args.log_text,
        )
    )
    app = create_app(engine, settings, demo=is_demo_checkpoint(checkpoint))  # type: ignore[arg-type]
    handle = ServerHandle(
        app,
        host=args.host,
        port=args.port,
        log_level="info" if args.verbose else "warning",
        configure_logging=args.uvicorn_logging,
    )

    def ready() -> None:
        voices = list(engine.voices)
        console(
            args.log_format,
            "ready",
            f"ready: {engine.model_name} ({engine.sample_rate} Hz; voices "
            f"{', '.join(voices)}) on {handle.url} and {handle.ws_url}",
            model=engine.model_name,
            sample_rate=engine.sample_rate,
            voices=voices,
            url=handle.url,
            ws_url=handle.ws_url,
        )
        console(args.log_format, "playground", f"playground: open {handle.url}/ in a browser")

    try:
        status = await serve_until_signalled(handle, on_ready=ready)
    except OSError as e:
        console_error(args.log_format, f"cannot listen on {args.host}:{args.port}: {e}")
        return 2
    if status and handle.state.failed:
        console_error(args.log_format, f"the engine failed to start: {handle.state.failed}")
    elif status:
        console_error(args.log_format, "the engine died and could not be restarted (see the log)")
    console(args.log_format, "stopped", "stopped", status=status)
    return status


def _serve(args: argparse.Namespace) -> int:
    from pipecat_veena.engine import detect_layout

    settings = _server_settings(args)  # a bad key file or voice map: one line, exit 2
    checkpoint = _demo_or(args.model)
    detect_layout(checkpoint)  # a bad model directory: the same, before the engine loads
    _quiet(args.verbose)
    from pipecat_veena.server.logs import configure_server_logs

    # the server's own lifecycle (ready, draining, stopped) at info; -v: debug
    args.uvicorn_logging = configure_server_logs(args.log_format, verbose=args.verbose)
    return asyncio.run(_serve_async(args, checkpoint, settings))


def _voices(args: argparse.Namespace) -> int:
    from pipecat_veena.engine import (
        default_voices_file,
        enrol_into_file,
        read_voices_file,
        remove_from_file,
        share_in_file,
    )
    from pipecat_veena.server.settings import OPENAI_VOICES

    _quiet(False)
    checkpoint = _demo_or(args.model)
    path = args.voices_file or default_voices_file(checkpoint)
    if args.action == "list":
        from pipecat_veena.engine import detect_layout, spark_voices, veena_voices

        layout = detect_layout(checkpoint)
        book = spark_voices(layout.root, 32) if layout.family == "bicodec" else (
            veena_voices(layout.root))  # fmt: skip
        enrolled = read_voices_file(path).get("enrolled", {})
        print(f"built-in: {', '.join(book.names)}")
        lines = ", ".join(map(_voice_line, sorted(enrolled.items())))
        print(f"enrolled ({path}): {lines or 'none'}")
        return 0
    if args.name is None:
        raise ValueError(f"voices {args.action} NAME: give the voice's name")
    if args.action == "remove":
        print(f"removed {remove_from_file(path, args.name)!r} from {path}")
        return 0
    if args.action in ("share", "unshare"):
        key = share_in_file(path, args.name, args.action == "share")
        every = "every API key may now use it" if args.action == "share" else "only its owner"
        print(f"{args.action}d {key!r} in {path}: {every}")
        return 0
    if args.clip is None:
        raise ValueError("voices add NAME CLIP: give the voice clip's file")
    from pipecat_veena.remote.protocol import ProtocolError
    from pipecat_veena.server.uploads import decode_clip

    try:
        samples, rate = decode_clip(args.clip.read_bytes(), 30.0)
    except ProtocolError as e:
        raise ValueError(f"{args.clip}: {e.message}") from None
    codes = enrol_into_file(
        checkpoint, path, args.name, samples, rate, args.transcript,
        replace=args.replace, reserved=OPENAI_VOICES,
    )  # fmt: skip
    print(f"enrolled {args.name.strip().lower()!r} into {path} (32 global codes: {codes[:4]}...)")
    print("a server with this voices file picks it up within a second (or send it SIGHUP)")
    return 0


def _voice_line(item: tuple[str, object]) -> str:
    """``name`` of an enrolled voice, with who may use it (``voices list``)."""
    name, entry = item
    entry = entry if isinstance(entry, dict) else {}
    if not entry.get("owner"):
        return f"{name} (operator's: every key)"
    return f"{name} ({'shared: every key' if entry.get('shared') else 'one API key'})"


def _calibrate(args: argparse.Namespace) -> int:
    from pipecat_veena.engine import (
        EngineConfig,
        detect_layout,
        load_codec,
        lookahead_curve,
        pick_lookahead,
    )
    from pipecat_veena.streaming import StreamConfig

    if args.model is None:
        from pipecat_veena.demo import build_demo_checkpoint

        args.model = build_demo_checkpoint("spark")
        print(f"using the demo checkpoint {args.model} (random weights)")
    codec = load_codec(detect_layout(args.model), EngineConfig(checkpoint=args.model))
    base = StreamConfig.for_codec(codec)
    candidates = sorted({0, 2, 4, 8, 12, 16, 24, 32, codec.context_frames})
    curve = lookahead_curve(codec, candidates, base, frames=args.frames)
    print(f"{type(codec).__name__}: receptive field {codec.context_frames} frames")
    print("lookahead R (frames) | first audio (frames) | seam SNR vs offline decode")
    for r, snr in curve:
        print(f"{r:20d} | {base.first_frames + r:20d} | {snr:7.1f} dB")
    chosen = pick_lookahead(curve, args.target_db)
    print(
        f"smallest lookahead reaching {args.target_db} dB: {chosen} frames; use "
        f"EngineConfig(stream=StreamConfig(lookahead_frames={chosen}, ...)) or "
        f"EngineConfig(calibrate_seams_db={args.target_db})"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``pipecat-veena``."""
    from pipecat_veena import __version__

    parser = argparse.ArgumentParser(prog="pipecat-veena", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    say = sub.add_parser("say", help="speak text into a WAV file through a Pipecat pipeline")
    say.add_argument("text", help="what to say (Hindi, English or code-mixed)")
    say.add_argument("-o", "--output", type=Path, default=Path("out.wav"), help="WAV file")
    say.add_argument("--model", type=Path, default=None, help="checkpoint dir (default: demo)")
    say.add_argument("--voice", default=None, help="voice name (default: the model's)")
    say.add_argument("--sample-rate", type=int, default=None, help="WAV rate (default: codec's)")
    say.add_argument("--seed", type=int, default=None, help="sampling seed")
    say.add_argument(
        "--speed",
        type=float,
        default=None,
        help="playback speed, 0.5 to 2.0 (pitch kept; default: the model's own pace)",
    )
    say.add_argument(
        "--language",
        choices=("auto", "hi", "en"),
        default="auto",
        help="language of spoken numbers and dates (auto: per sentence, from its script)",
    )
    say.add_argument(
        "--no-normalize", action="store_true", help="pass digits and symbols to the model as is"
    )
    _add_device_arguments(say)
    say.add_argument("-v", "--verbose", action="store_true", help="show debug logs")
    say.set_defaults(func=_say)

    from pipecat_veena.server.logs import LOG_FORMATS
    from pipecat_veena.server.settings import ServerSettings

    limits = ServerSettings()  # the defaults have one owner: the settings dataclass
    srv = sub.add_parser(
        "serve",
        help="serve the engine over WebSocket and OpenAI-style HTTP",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    srv.add_argument("--model", type=Path, default=None, help="checkpoint dir (None: the demo)")
    srv.add_argument("--host", default="127.0.0.1", help="address (0.0.0.0: all interfaces)")
    srv.add_argument("--port", type=int, default=8000, help="port")
    srv.add_argument(
        "--api-key-file",
        type=Path,
        default=None,
        help="bearer keys, one per line or 'name key' (None: an open server)",
    )
    srv.add_argument(
        "--max-streams", type=int, default=limits.max_streams, help="utterances in flight, in total"
    )
    srv.add_argument(
        "--max-streams-per-key",
        type=int,
        default=limits.max_streams_per_key,
        help="utterances in flight per API key (None: no per-key cap)",
    )
    srv.add_argument(
        "--max-streams-per-anonymous-client",
        type=int,
        default=limits.max_streams_per_anonymous_client,
        help="without API keys: utterances in flight per client address (0: no cap)",
    )
    srv.add_argument(
        "--max-open-utterances",
        type=int,
        default=limits.max_open_utterances,
        help="utterances still taking text (final false) per WebSocket",
    )
    srv.add_argument(
        "--open-utterance-timeout",
        type=float,
        default=limits.open_utterance_timeout_s,
        help="seconds an utterance taking text may wait for text before it ends",
    )
    srv.add_argument(
        "--max-text-chars",
        type=int,
        default=limits.max_text_chars,
        help="longest text of one utterance",
    )
    srv.add_argument(
        "--max-message-bytes",
        type=int,
        default=limits.max_message_bytes,
        help="longest WebSocket message or HTTP body",
    )
    srv.add_argument(
        "--max-upload-bytes",
        type=int,
        default=limits.max_upload_bytes,
        help="longest voice-clip upload (POST /v1/audio/voices), else 413",
    )
    srv.add_argument(
        "--idle-timeout",
        type=float,
        default=limits.idle_timeout_s,
        help="seconds before an idle WebSocket is closed",
    )
    srv.add_argument(
        "--slow-client-timeout",
        type=float,
        default=limits.slow_client_timeout_s,
        help="seconds a client may leave a message unread before it is dropped",
    )
    srv.add_argument(
        "--drain-timeout",
        type=float,
        default=limits.drain_timeout_s,
        help="on SIGTERM, seconds in-flight streams get to finish",
    )
    srv.add_argument(
        "--max-connections",
        type=int,
        default=limits.max_connections,
        help="open TCP connections (HTTP and WebSocket); one more gets a 503",
    )
    srv.add_argument(
        "--header-timeout",
        type=float,
        default=limits.header_timeout_s,
        help="seconds for a request's headers to arrive whole (also closes "
        "connections that send nothing)",
    )
    srv.add_argument(
        "--body-timeout",
        type=float,
        default=limits.body_timeout_s,
        help="seconds for an HTTP request body to arrive whole (else 408)",
    )
    srv.add_argument(
        "--max-header-bytes",
        type=int,
        default=limits.max_header_bytes,
        help="longest request line plus headers (else 431)",
    )
    srv.add_argument(
        "--max-headers",
        type=int,
        default=limits.max_headers,
        help="most header fields in one request (else 431)",
    )
    srv.add_argument(
        "--voice-map",
        default=None,
        help="OpenAI voice names to checkpoint voices, e.g. alloy=female,echo=male",
    )
    srv.add_argument(
        "--max-enrolled-voices",
        type=int,
        default=limits.max_enrolled_voices,
        help="enrolled voices in all (POST /v1/audio/voices past it: 409; 0: no cap)",
    )
    srv.add_argument(
        "--voices-file",
        type=Path,
        default=None,
        help="enrolled voices and pinned prints (JSON), shared by replicas: written "
        "on enrolment, reloaded when it changes and on SIGHUP (None: "
        "voice-prints.json in the checkpoint)",
    )
    _add_device_arguments(srv)
    srv.add_argument("-v", "--verbose", action="store_true", help="show debug logs")
    srv.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="stderr logs as text, or as JSON lines (loguru's serialized records; "
        "each utterance's lines carry its request_id)",
    )
    srv.add_argument(
        "--log-text",
        action="store_true",
        help="show callers' text (its first 60 characters) in logs, spans and "
        "error messages; off: only its length and a short hash",
    )
    srv.set_defaults(func=_serve)

    voices = sub.add_parser(
        "voices",
        help="enrol, list, remove or share voices of a checkpoint's voices file (BiCodec)",
        description="voices add NAME clip.wav | list | remove NAME | share NAME | unshare NAME. "
        "Voices added here are the operator's (every API key of a server may use them); share "
        "lets every key use a voice a key enrolled (only its owner, or this command, removes "
        "it). Changes are locked and merged with a running server's. Enrol only voices whose "
        "speaker consented. The clip: 3-30 s of one speaker (wav, mp3, ogg, m4a, flac).",
    )
    voices.add_argument("action", choices=("add", "list", "remove", "share", "unshare"))
    voices.add_argument("name", nargs="?", default=None, help="the voice's name (add, remove)")
    voices.add_argument("clip", nargs="?", type=Path, default=None, help="the clip (add)")
    voices.add_argument("--transcript", default=None, help="the clip's words (transcript mode)")
    voices.add_argument(
        "--replace",
        action="store_true",
        help="add: replace an enrolled voice of that name (else refused)",
    )
    voices.add_argument("--model", type=Path, default=None, help="checkpoint dir (default: demo)")
    voices.add_argument(
        "--voices-file",
        type=Path,
        default=None,
        help="the voices file (default: voice-prints.json in the checkpoint)",
    )
    voices.set_defaults(func=_voices)

    cal = sub.add_parser("calibrate", help="measure the lookahead a checkpoint's codec needs")
    cal.add_argument("--model", type=Path, default=None, help="checkpoint dir (default: demo)")
    cal.add_argument("--target-db", type=float, default=80.0, help="seam SNR to reach")
    cal.add_argument("--frames", type=int, default=200, help="length of the random probe")
    cal.set_defaults(func=_calibrate)

    norm = sub.add_parser(
        "normalize",
        help="print the text the model is given (lexicon, SSML and number rules applied)",
        description="Print what the model reads for TEXT, one prompt a line (an SSML break as "
        "[pause N ms]); no model needed. Exit status 2 names a malformed document's position.",
    )
    norm.add_argument("text", help="the request's text (SSML with --ssml)")
    norm.add_argument("--ssml", action="store_true", help="TEXT is SSML (the supported subset)")
    norm.add_argument(
        "--lexicon",
        type=Path,
        default=None,
        help="a lexicon JSON file (term -> spoken form, or by language)",
    )
    norm.add_argument(
        "--language",
        choices=("auto", "hi", "en"),
        default="auto",
        help="language of spoken numbers and dates (auto: per sentence)",
    )
    norm.set_defaults(func=_normalize)

    demo = sub.add_parser("build-demo", help="build (or reuse) the deterministic demo checkpoints")
    demo.add_argument("--dir", type=Path, default=None, help="where to put them (default: cache)")
    demo.add_argument("--kind", default="all", help="spark, spark-tiny, veena or all")
    demo.set_defaults(func=_build_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status (2: bad input, named in one line)."""
    from pipecat_veena.errors import VeenaError

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (VeenaError, ValueError, FileNotFoundError) as e:
        print(f"pipecat-veena {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
