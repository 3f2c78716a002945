"""How a BiCodec checkpoint (``config.yaml`` + ``model.safetensors``) is read into a module.

Loading has one direction: each model module (``model``, ``encoder``, ``semantic``) builds its
module and calls this one from its ``from_pretrained``; this module imports none of them. Every
part loads the same way: the model is built on the meta device and given storage once; then
each of its tensors is read on its own (plain reads, see :mod:`.tensorfile`), weight norm is
folded, and the result is copied into place, so memory never holds a second copy of the
weights. Tensors the model does not use are never read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from loguru import logger
from torch import Tensor, nn

from pipecat_veena.codecs.bicodec.config import (
    BiCodecConfig,
    EncoderConfig,
    MelConfig,
    read_audio_tokenizer,
)
from pipecat_veena.codecs.bicodec.modules import official_parameters
from pipecat_veena.codecs.bicodec.tensorfile import TensorFile
from pipecat_veena.errors import CheckpointError

CONFIG_FILE = "config.yaml"
WEIGHTS_FILE = "model.safetensors"
BICODEC_DIR = "BiCodec"

#: The three spellings of a weight-normed conv's weight: (magnitude, direction) pairs, or plain.
_WN_SPELLINGS = (
    ("weight_g", "weight_v"),
    ("parametrizations.weight.original0", "parametrizations.weight.original1"),
)


def resolve_bicodec_dir(path: str | Path) -> Path:
    """Return the directory holding ``config.yaml`` and ``model.safetensors``.

    Args:
        path: a ``BiCodec/`` directory, or a checkpoint root with a ``BiCodec/`` sub-directory.

    Raises:
        CheckpointError: neither ``path`` nor ``path/BiCodec`` holds both files.
    """
    path = Path(path)
    for candidate in (path, path / BICODEC_DIR):
        if (candidate / CONFIG_FILE).is_file() and (candidate / WEIGHTS_FILE).is_file():
            return candidate
    raise CheckpointError(
        f"{path}: no BiCodec checkpoint here or in {path / BICODEC_DIR} (need {CONFIG_FILE} and "
        f"{WEIGHTS_FILE}). Pass the BiCodec/ directory or the checkpoint root that contains it."
    )


def fold_weight_norm(g: Tensor, v: Tensor) -> Tensor:
    """Fold a weight-norm pair into a plain weight: ``w = g * v / ||v||``.

    The norm runs over every dim where ``g`` has size 1 (no epsilon, as torch's weight norm):
    per output channel for a Conv1d (g (out, 1, 1)), per input channel for a ConvTranspose1d
    (weight (in, out, k), g (in, 1, 1)). Computed in float32.
    """
    g, v = g.float(), v.float()
    dims = [d for d in range(v.dim()) if g.shape[d] == 1]
    return v * (g / torch.linalg.vector_norm(v, dim=dims, keepdim=True))


#: Key prefix of the speaker encoder's frame encoder (ECAPA-TDNN) in the official checkpoint.
SPEAKER_ENCODER_PREFIX = "speaker_encoder.speaker_encoder."
#: Key prefix of the semantic feature encoder's backbone in the official checkpoint.
SEMANTIC_ENCODER_PREFIX = "encoder.encoder."


class _Reader:
    """Reads one model's tensors from a safetensors file, with errors that name file and key."""

    def __init__(self, file: TensorFile, config_path: Path, what: str = "decode") -> None:
        self.file, self.path, self.config_path = file, file.path, config_path
        self.what = what
        self.keys = file.keys()
        self.used: set[str] = set()

    def get(self, key: str, expected: tuple[int, ...] | None = None) -> Tensor:
        if key not in self.keys:
            self.missing(key)
        if expected is not None and self.file.shape(key) != expected:
            self.mismatch(key, expected, self.file.shape(key))
        self.used.add(key)
        return self.file.get(key)

    def missing(self, key: str, alternatives: tuple[str, ...] = ()) -> None:
        also = (
            f" (also looked for {', '.join(repr(a) for a in alternatives)})" if alternatives else ""
        )
        raise CheckpointError(
            f"{self.path}: missing {self.what} tensor '{key}'{also}. The weights do not match "
            f"{self.config_path}; use the model.safetensors that ships with this config.yaml."
        )

    def mismatch(self, key: str, expected: tuple[int, ...], found: tuple[int, ...]) -> None:
        raise CheckpointError(
            f"{self.path}: tensor '{key}' has shape {found}, expected {expected} for the config in "
            f"{self.config_path}; use the model.safetensors that ships with this config.yaml."
        )

    def conv_weight(self, prefix: str, expected: tuple[int, ...]) -> Tensor:
        """A weight-normed conv's folded weight, from whichever spelling the file uses."""
        for g_name, v_name in _WN_SPELLINGS:
            g_key, v_key = prefix + g_name, prefix + v_name
            if g_key in self.keys or v_key in self.keys:
                v = self.get(v_key, expected)
                g = self.get(g_key)
                ok = g.dim() == v.dim() and all(
                    a in (1, b) for a, b in zip(g.shape, v.shape, strict=True)
                )
                if not ok:
                    per_channel = (expected[0],) + (1,) * (len(expected) - 1)
                    self.mismatch(g_key, per_channel, tuple(g.shape))
                return fold_weight_norm(g, v)
        if prefix + "weight" in self.keys:
            return self.get(prefix + "weight", expected)
        self.missing(prefix + "weight_v", tuple(prefix + s for _, s in _WN_SPELLINGS[1:]))
        raise AssertionError("unreachable")


def _tensor_sources(
    model: nn.Module, reader: _Reader, any_spelling: tuple[type[nn.Module], ...] = ()
) -> list[tuple[Tensor, Callable[[], Tensor]]]:
    """Pair every tensor of ``model`` with a function that reads its value from the file.

    Weights of weight-normed convs, and the weight of every module of an ``any_spelling`` type,
    are read in whichever spelling the file uses (weight-norm pair, either name, or plain).
    """
    sources = []
    for prefix, name, module, param, folded in official_parameters(model):
        shape = tuple(param.shape)
        if folded or (name == "weight" and isinstance(module, any_spelling)):
            sources.append((param, lambda p=prefix, s=shape: reader.conv_weight(p, s)))
        else:
            sources.append((param, lambda k=prefix + name, s=shape: reader.get(k, s)))
    return sources


def _load(
    model: nn.Module,
    reader: _Reader,
    *,
    device: str | torch.device,
    dtype: torch.dtype,
    any_spelling: tuple[type[nn.Module], ...] = (),
) -> nn.Module:
    """Give ``model`` (built on the meta device) storage and every tensor's value from the file."""
    model = model.to(dtype).to_empty(device=device)
    with torch.no_grad():
        for param, read in _tensor_sources(model, reader, any_spelling):
            param.copy_(read().to(dtype))
    return model.requires_grad_(False).eval()


def load_decode_part(
    path: str | Path,
    model_class: Callable[[BiCodecConfig], nn.Module],
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Any:
    """Load the decode path, ``model_class(BiCodecConfig)``, built on meta.

    Raises:
        CheckpointError: missing files, unreadable weights, a missing decode tensor, a shape that
            does not match the config, or a config without the needed blocks.
    """
    start = time.perf_counter()
    directory = resolve_bicodec_dir(path)
    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    config = BiCodecConfig.from_yaml(config_path)
    with torch.device("meta"):
        model = model_class(config)
    with TensorFile(weights_path) as file:
        reader = _Reader(file, config_path)
        model = _load(model, reader, device=device, dtype=dtype)
    logger.debug(
        f"BiCodec decoder loaded from {directory} in {time.perf_counter() - start:.2f} s: "
        f"{len(reader.used)} tensors used, {len(reader.keys - reader.used)} encode-only skipped, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M params, {dtype} on {device}"
    )
    return model


def has_speaker_encoder(path: str | Path) -> bool:
    """True when the BiCodec checkpoint at ``path`` holds speaker-encoder tensors."""
    with TensorFile(resolve_bicodec_dir(path) / WEIGHTS_FILE) as file:
        return any(k.startswith(SPEAKER_ENCODER_PREFIX) for k in file.keys())


def load_encode_part(
    path: str | Path,
    model_class: Callable[[BiCodecConfig, Any], nn.Module],
    part_config: type[MelConfig] | type[EncoderConfig],
    *,
    what: str,
    marker: str,
    absent: str,
    device: str | torch.device,
    dtype: torch.dtype,
) -> Any:
    """Load an encode-side model, ``model_class(BiCodecConfig, part_config)``, built on meta.

    Raises:
        CheckpointError: missing files, no tensor named ``marker*`` (message ``absent``), a
            missing tensor, or a shape that does not match the config.
    """
    start = time.perf_counter()
    directory = resolve_bicodec_dir(path)
    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    tokenizer = read_audio_tokenizer(config_path)
    config = BiCodecConfig.from_dict(tokenizer, source=str(config_path))
    part = part_config.from_dict(tokenizer, source=str(config_path))
    with torch.device("meta"):
        model = model_class(config, part)
    with TensorFile(weights_path) as file:
        reader = _Reader(file, config_path, what=what)
        if not any(k.startswith(marker) for k in reader.keys):
            raise CheckpointError(f"{weights_path}: no {what} tensors ({marker}*), {absent}")
        model = _load(
            model, reader, device=device, dtype=dtype, any_spelling=(nn.Conv1d, nn.Linear)
        )
    logger.debug(
        f"BiCodec {what} loaded from {directory} in {time.perf_counter() - start:.2f} s: "
        f"{len(reader.used)} tensors, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M params, {dtype} on {device}"
    )
    return model
