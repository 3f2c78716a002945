"""The voices file on disk: atomic writes, and enrolling into it without starting an engine.

The file is what ``VeenaEngine.export_voices`` writes (JSON: pinned prints under ``voices``,
enrolled voices under ``enrolled``). ``pipecat-veena voices add|list|remove`` edits its
``enrolled`` block here, with the checkpoint's speaker encoder but no LLM; a running server (or
every replica sharing the file) picks the change up at its next poll or on SIGHUP.

One writer at a time: every change (the CLI's, each server's) takes an exclusive ``flock`` on a
sidecar ``<file>.lock``, reads the file as it is now, applies its one change and writes the
result atomically (temporary file, then rename), so that writers that overlap lose nothing.
Readers need no lock (a rename is atomic). ``VoicesFile`` is an engine's side of it: the
reload when the file changed and the locked change, both blocking file work that the engine
runs off its event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from loguru import logger

from pipecat_veena.engine.checkpoint import WAV2VEC2_DIR, detect_layout
from pipecat_veena.engine.enrolment import check_transcript, prepare_clip, wav2vec2_missing
from pipecat_veena.engine.voices import PRINTS_FORMAT, VoiceBook, spark_voices
from pipecat_veena.errors import CheckpointError, EnrolmentError, UnknownVoiceError

#: The voices file of a checkpoint, when no other is named: in the checkpoint's directory.
DEFAULT_VOICES_FILE = "voice-prints.json"
#: How often, at most, an engine looks whether its voices file changed (one ``stat``).
VOICES_POLL_S = 1.0

T = TypeVar("T")


def snac_cannot_enrol(model: str) -> EnrolmentError:
    """The refusal of an enrolment on a SNAC model (no speaker encoder), with what to do."""
    return EnrolmentError(
        f"{model} is a SNAC model (Veena / Orpheus layout): it has no speaker encoder, so "
        "voices cannot be enrolled from a clip. Fine-tune the model on the speaker and serve "
        "the result as a LoRA adapter voice instead: name the PEFT directory in the "
        'checkpoint\'s voices.json ({"voices": {"asha": {"speaker": "kavya", "lora": '
        '"adapters/asha"}}}; README "LoRA voices").',
        code=EnrolmentError.UNSUPPORTED,
    )


def default_voices_file(checkpoint: str | Path) -> Path:
    """Where a checkpoint's voices file is unless another is named."""
    return Path(checkpoint) / DEFAULT_VOICES_FILE


def write_voices_file(path: str | Path, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON to ``path`` atomically: readers see the old file or the new one."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        temporary.write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")  # C encoder
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


@contextlib.contextmanager
def voices_file_lock(path: str | Path) -> Iterator[None]:
    """Hold the exclusive lock of a voices file (``flock`` on ``<file>.lock`` next to it)."""
    path = Path(path)
    lock = path.with_name(f"{path.name}.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def update_voices_file(
    path: str | Path, change: Callable[[dict[str, Any]], T], model: str = ""
) -> T:
    """Apply ``change`` to the voices file as it is now, under its lock, and write the result.

    ``change`` edits the dict in place and returns what the caller gets back; an exception it
    raises leaves the file untouched.

    Raises:
        ValueError: a file that cannot be read or is not a voices file (it is left as it is).
        OSError: the file cannot be written.
    """
    with voices_file_lock(path):
        data = read_voices_file(path, model)
        result = change(data)
        write_voices_file(path, data)
    return result


def read_voices_file(path: str | Path, model: str = "") -> dict[str, Any]:
    """The voices file's JSON (an empty one when the file does not exist).

    Raises:
        ValueError: a file that cannot be read or is not a voices file.
    """
    path = Path(path)
    if not path.exists():
        return {"format": PRINTS_FORMAT, "model": model, "voices": {}}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read voice prints from {path}: {e}") from e
    if not isinstance(data, dict) or data.get("format") != PRINTS_FORMAT:
        raise ValueError(f"{path}: not a voice-print file (expected format {PRINTS_FORMAT!r})")
    return data


def enrol_into_file(
    checkpoint: str | Path,
    path: str | Path,
    name: str,
    audio: Any,
    sample_rate: int,
    transcript: str | None = None,
    *,
    replace: bool = False,
    reserved: Sequence[str] = (),
) -> list[int]:
    """Enrol a voice from a clip into a voices file with the checkpoint's speaker encoder.

    With a ``transcript`` (transcript mode, as ``VeenaEngine.enroll_voice``), the clip's semantic
    codes from the checkpoint's wav2vec2 model are stored with it. The voice is the operator's
    (every key of a server may use it). The clip is encoded first; then the file is changed
    under its lock as it is at that moment (see ``update_voices_file``).

    Args:
        checkpoint: the BiCodec checkpoint (its speaker encoder).
        path: the voices file.
        name: the voice's name.
        audio: the clip's mono samples (float in [-1, 1] or int16).
        sample_rate: their rate in Hz.
        transcript: the clip's words (transcript mode), or None.
        replace: replace an enrolled voice of that name (False: refuse it).
        reserved: names that may not be enrolled (the server's OpenAI names).

    Returns:
        The voice's 32 global codes.

    Raises:
        EnrolmentError: as ``VeenaEngine.enroll_voice`` (a SNAC checkpoint, a bad name or clip).
        ValueError: a voices file that cannot be read.
    """
    from pipecat_veena.codecs.bicodec.encoder import BiCodecSpeakerEncoder

    layout = detect_layout(checkpoint)
    if layout.family != "bicodec":
        raise snac_cannot_enrol(Path(checkpoint).name)
    book = spark_voices(layout.root, 32)
    book.reserved = frozenset(reserved)
    _book_of_file(book, read_voices_file(path, Path(checkpoint).name))
    key = book.check_enrolment(name, replace=replace)  # before any work
    transcript = check_transcript(transcript)
    if transcript is not None and layout.wav2vec2_dir is None:
        raise wav2vec2_missing(Path(checkpoint).name, layout.root, WAV2VEC2_DIR)
    try:
        encoder = BiCodecSpeakerEncoder.from_pretrained(layout.codec_dir)
    except CheckpointError as e:
        raise EnrolmentError(str(e), code=EnrolmentError.UNSUPPORTED) from e
    wav = prepare_clip(audio, sample_rate, encoder.sample_rate)
    entry: dict[str, Any] = {"globals": list(encoder.tokenize(wav))}
    if transcript is not None:
        from pipecat_veena.codecs.bicodec.semantic import SemanticTokenizer

        semantic = SemanticTokenizer.from_pretrained(layout.codec_dir, layout.wav2vec2_dir)
        entry.update(semantic=list(semantic.tokenize(wav)), transcript=transcript)
    codes = entry["globals"]

    def add(data: dict[str, Any]) -> None:  # the file as it is now, under its lock
        _book_of_file(book, data)
        book.check_enrolment(key, replace=replace)  # it may have changed during the encoding
        data.setdefault("enrolled", {})[key] = entry

    update_voices_file(path, add, Path(checkpoint).name)
    return codes


def _book_of_file(book: VoiceBook, data: dict[str, Any]) -> None:
    """Load the enrolled voices of a file into ``book`` (no pins: the CLI has no grammar)."""
    book.load_prints({**data, "voices": {}}, lambda prefix: (), replace_enrolled=True)


def remove_from_file(path: str | Path, name: str) -> str:
    """Remove an enrolled voice from a voices file (whoever owns it); returns its name.

    Raises:
        UnknownVoiceError: the file enrols no voice of that name.
    """
    key = name.strip().lower()

    def remove(data: dict[str, Any]) -> None:
        enrolled = _enrolled_of(path, data, name)
        del enrolled[key]
        if not enrolled:
            data.pop("enrolled")

    update_voices_file(path, remove)
    return key


def share_in_file(path: str | Path, name: str, shared: bool = True) -> str:
    """Mark an enrolled voice of a voices file shared with every key (or not); its name.

    Raises:
        UnknownVoiceError: the file enrols no voice of that name.
    """
    key = name.strip().lower()

    def share(data: dict[str, Any]) -> None:
        entry = _enrolled_of(path, data, name)[key]
        if shared:
            entry["shared"] = True
        else:
            entry.pop("shared", None)

    update_voices_file(path, share)
    return key


def _enrolled_of(path: str | Path, data: dict[str, Any], name: str) -> dict[str, Any]:
    """The file's ``enrolled`` block; UnknownVoiceError unless it enrols ``name``."""
    enrolled = data.get("enrolled", {})
    if not isinstance(enrolled, dict) or name.strip().lower() not in enrolled:
        known = ", ".join(sorted(enrolled)) if isinstance(enrolled, dict) else ""
        raise UnknownVoiceError(f"{path} enrols no voice {name!r} (it enrols: {known or 'none'})")
    return enrolled


class VoicesFile:
    """An engine's voices file: reloads when it changed, and changes under the file's lock.

    Both block on disk (a large file takes a while to parse or write): the engine calls
    ``change`` on a worker thread, and ``refresh`` on its event loop only hands the reload to a
    worker thread (the voices stay as they are until it is done).

    Args:
        path: the file.
        model: the model's name (written into a new file).
        check_prefix: parses a pinned print's prefix with the model's grammar.
    """

    def __init__(
        self, path: Path, model: str, check_prefix: Callable[[Sequence[int]], tuple[int, ...]]
    ) -> None:
        self.path = path
        self.model = model
        self.check_prefix = check_prefix
        self._seen: tuple[int, int] | None = None  # the file's (mtime_ns, size) last read
        self._polled = 0.0
        self._reloading: asyncio.Future[Any] | None = None
        self._lock = threading.RLock()  # one reload or change at a time in this process

    def start(self, book: VoiceBook) -> None:
        """First read (blocking): a missing or unreadable file is a warning, never a failure."""
        if not self.path.exists():
            logger.info(f"voices file {self.path} does not exist yet; enrolling a voice creates it")
            return
        try:
            self.reload(book)
        except ValueError as e:
            logger.warning(
                f"voices file {self.path} not read ({e}): starting without its voices; fix or "
                "move the file (enrolling is refused until it can be read)"
            )

    def refresh(self, book: VoiceBook, *, now: bool = False) -> bool:
        """Reload the file if it changed (one ``stat``, at most every ``VOICES_POLL_S``).

        On a running event loop the reload runs on a worker thread and this returns False;
        elsewhere (a worker thread) it runs here.

        Returns:
            True when the file was reloaded here.
        """
        clock = time.monotonic()
        if not now and clock - self._polled < VOICES_POLL_S:
            return False
        self._polled = clock
        seen = _file_signature(self.path)
        if seen is None or seen == self._seen:
            return False
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return self._reload_warned(book)
        if self._reloading is None or self._reloading.done():
            self._reloading = loop.run_in_executor(None, self._reload_warned, book)
        return False

    def _reload_warned(self, book: VoiceBook) -> bool:
        try:
            self.reload(book)
        except ValueError as e:
            logger.warning(f"voices file {self.path} not reloaded (voices unchanged): {e}")
            return False
        return True

    def reload(self, book: VoiceBook) -> list[str]:
        """Read the file into ``book`` (blocking); ValueError when it cannot be read."""
        with self._lock:
            seen = _file_signature(self.path)
            data = read_voices_file(self.path, self.model)
            names = book.load_prints(data, self.check_prefix, replace_enrolled=True)
            self._seen = seen
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        logger.info(f"voices file {self.path} read: {shown or '(no voices)'}")
        return names

    def change(self, book: VoiceBook, change: Callable[[VoiceBook], T]) -> T:
        """Apply ``change`` to the book as the file is now, under the file's lock; write it.

        The file's pinned prints win over this process's for the same voice (this process
        keeps its own: calls may be speaking with them); the others are added.

        Raises:
            EnrolmentError: what ``change`` raises (nothing is written), or a file that cannot
                be read or written (the book is as the file is).
        """

        def apply(data: dict[str, Any]) -> T:
            book.load_prints(data, self.check_prefix, replace_enrolled=True)
            try:
                result = change(book)
            except Exception as e:  # the change's own refusal: raised as it is, below
                raise _Refused(e) from e
            merged = book.export_prints(self.model)
            merged["voices"].update(data.get("voices", {}))
            data.clear()
            data.update(merged)
            return result

        with self._lock:
            try:
                result = update_voices_file(self.path, apply, self.model)
            except _Refused as refused:
                raise refused.error from None
            except (OSError, ValueError) as e:
                self._seen = None
                with contextlib.suppress(ValueError):  # the book as the file is: no change
                    data = read_voices_file(self.path, self.model)
                    book.load_prints(data, self.check_prefix, replace_enrolled=True)
                what = "write" if isinstance(e, OSError) else "read"
                raise EnrolmentError(
                    f"cannot {what} the voices file {self.path} ({e}); nothing changed: give the "
                    "engine a readable, writable voices_file (pipecat-veena serve --voices-file "
                    "PATH), or fix or move the file",
                    code=EnrolmentError.UNSUPPORTED,
                ) from e
            self._seen = _file_signature(self.path)
        return result


class _Refused(Exception):
    """Carries a change's own exception out of ``update_voices_file``."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _file_signature(path: Path) -> tuple[int, int] | None:
    """(mtime_ns, size) of a file, None when it is not there."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size
