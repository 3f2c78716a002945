"""The voices file on disk: atomic writes, and enrolling into it without starting an engine.

The file is what ``VeenaEngine.export_voices`` writes (JSON: pinned prints under ``voices``,
enrolled voices under ``enrolled``). ``pipecat-veena voices add|list|remove`` edits its
``enrolled`` block here, with the checkpoint's speaker encoder but no LLM; a running server (or
every replica sharing the file) picks the change up at its next poll or on SIGHUP.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from pipecat_veena.engine.checkpoint import WAV2VEC2_DIR, detect_layout
from pipecat_veena.engine.enrolment import check_transcript, prepare_clip, wav2vec2_missing
from pipecat_veena.engine.voices import PRINTS_FORMAT, spark_voices
from pipecat_veena.errors import CheckpointError, EnrolmentError, UnknownVoiceError

#: The voices file of a checkpoint, when no other is named: in the checkpoint's directory.
DEFAULT_VOICES_FILE = "voice-prints.json"


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
        temporary.write_text(json.dumps(data, indent=1), encoding="utf-8")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


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
) -> list[int]:
    """Enrol a voice from a clip into a voices file with the checkpoint's speaker encoder.

    With a ``transcript`` (transcript mode, as ``VeenaEngine.enroll_voice``), the clip's semantic
    codes from the checkpoint's wav2vec2 model are stored with it.

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
    data = read_voices_file(path, Path(checkpoint).name)
    key = spark_voices(layout.root, 32).check_enrolment(name)
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
    data.setdefault("enrolled", {})[key] = entry
    write_voices_file(path, data)
    return codes


def remove_from_file(path: str | Path, name: str) -> str:
    """Remove an enrolled voice from a voices file; returns its canonical name.

    Raises:
        UnknownVoiceError: the file enrols no voice of that name.
    """
    data = read_voices_file(path)
    key = name.strip().lower()
    enrolled = data.get("enrolled", {})
    if key not in enrolled:
        raise UnknownVoiceError(
            f"{path} enrols no voice {name!r} (it enrols: {', '.join(sorted(enrolled)) or 'none'})"
        )
    del enrolled[key]
    if not enrolled:
        data.pop("enrolled")
    write_voices_file(path, data)
    return key
