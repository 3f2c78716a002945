"""Checkpoint layouts: find the LLM and the codec inside a checkpoint directory.

- Spark-TTS-0.5B / Veena3 (BiCodec): ``LLM/`` (Hugging Face LLM) and ``BiCodec/``
  (``config.yaml`` + ``model.safetensors``), optionally ``voices.json`` and
  ``wav2vec2-large-xlsr-53/`` (transcript-mode enrolment).
- Veena / Orpheus (SNAC): the LLM at the root (or in ``LLM/``) and a SNAC directory
  (``snac_24khz/`` or ``snac/``: ``config.json`` + ``pytorch_model.bin``), optionally
  ``voices.json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipecat_veena.errors import CheckpointError

_SNAC_DIRS = ("snac_24khz", "snac", "SNAC")
#: The wav2vec2 model of Spark-TTS-0.5B (transcript-mode enrolment), at the checkpoint's root.
WAV2VEC2_DIR = "wav2vec2-large-xlsr-53"


@dataclass(frozen=True)
class CheckpointLayout:
    """Where the parts of a checkpoint are.

    Attributes:
        root: the checkpoint directory.
        family: "bicodec" or "snac".
        llm_dir: the Hugging Face LLM directory (config.json, weights, tokenizer).
        codec_dir: the codec directory.
        wav2vec2_dir: the ``wav2vec2-large-xlsr-53/`` directory (BiCodec checkpoints that ship
            it, for transcript-mode enrolment), or None.
    """

    root: Path
    family: str
    llm_dir: Path
    codec_dir: Path
    wav2vec2_dir: Path | None = None


def detect_layout(path: str | Path) -> CheckpointLayout:
    """Recognise a checkpoint directory's layout.

    Raises:
        CheckpointError: naming what was looked for and not found.
    """
    root = Path(path).expanduser()
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory {root} does not exist")
    if (root / "BiCodec").is_dir():
        llm = root / "LLM"
        if not (llm / "config.json").is_file():
            raise CheckpointError(
                f"{root}: has BiCodec/ but no LLM/config.json; a Spark-TTS-0.5B layout "
                "checkpoint needs both LLM/ and BiCodec/"
            )
        wav2vec2 = root / WAV2VEC2_DIR
        found = wav2vec2 if (wav2vec2 / "config.json").is_file() else None
        return CheckpointLayout(root, "bicodec", llm, root / "BiCodec", found)
    llm = root / "LLM" if (root / "LLM" / "config.json").is_file() else root
    for name in _SNAC_DIRS:
        codec = root / name
        if (codec / "config.json").is_file():
            if not (llm / "config.json").is_file():
                raise CheckpointError(f"{root}: has {name}/ but no LLM config.json")
            return CheckpointLayout(root, "snac", llm, codec)
    raise CheckpointError(
        f"{root}: not a known checkpoint layout; expected LLM/ + BiCodec/ (Spark-TTS-0.5B, "
        f"Veena3) or an LLM with a SNAC directory ({', '.join(_SNAC_DIRS)}) (Veena)"
    )
