"""Writes BiCodec checkpoints with random weights in the official layout (tests, demo, benchmarks).

``config.yaml`` carries every block of the official file (encode-only ones too) under the top
key ``audio_tokenizer``; ``model.safetensors`` holds the decode tensors with legacy weight-norm
keys (``weight_g`` / ``weight_v``), the speaker encoder's tensors (so that voices can be enrolled
from audio), plus a few other encode-only tensors, so that a loader must skip them. The weights
are scaled so that random tokens decode to audible, unclipped noise-like audio, and so that the
speaker encoder's ids depend on the clip.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors.torch import save_file
from torch import Tensor

from pipecat_veena.codecs.bicodec.config import BiCodecConfig, MelConfig
from pipecat_veena.codecs.bicodec.loader import CONFIG_FILE, WEIGHTS_FILE
from pipecat_veena.codecs.bicodec.model import BiCodecDecoder
from pipecat_veena.codecs.bicodec.modules import FoldedConvTranspose1d, official_parameters

#: The official ``audio_tokenizer`` block of Spark-TTS-0.5B ``BiCodec/config.yaml``.
REAL_CONFIG: dict[str, Any] = {
    "mel_params": {
        "sample_rate": 16000,
        "n_fft": 1024,
        "win_length": 640,
        "hop_length": 320,
        "mel_fmin": 10,
        "mel_fmax": None,
        "num_mels": 128,
    },
    "encoder": {
        "input_channels": 1024,
        "vocos_dim": 384,
        "vocos_intermediate_dim": 2048,
        "vocos_num_layers": 12,
        "out_channels": 1024,
        "sample_ratios": [1, 1],
    },
    "decoder": {
        "input_channel": 1024,
        "channels": 1536,
        "rates": [8, 5, 4, 2],
        "kernel_sizes": [16, 11, 8, 4],
    },
    "quantizer": {
        "input_dim": 1024,
        "codebook_size": 8192,
        "codebook_dim": 8,
        "commitment": 0.25,
        "codebook_loss_weight": 2.0,
        "use_l2_normlize": True,
        "threshold_ema_dead_code": 0.2,
    },
    "speaker_encoder": {
        "input_dim": 128,
        "out_dim": 1024,
        "latent_dim": 128,
        "token_num": 32,
        "fsq_levels": [4, 4, 4, 4, 4, 4],
        "fsq_num_quantizers": 1,
    },
    "prenet": {
        "input_channels": 1024,
        "vocos_dim": 384,
        "vocos_intermediate_dim": 2048,
        "vocos_num_layers": 12,
        "out_channels": 1024,
        "condition_dim": 1024,
        "sample_ratios": [1, 1],
        "use_tanh_at_final": False,
    },
    "postnet": {
        "input_channels": 1024,
        "vocos_dim": 384,
        "vocos_intermediate_dim": 2048,
        "vocos_num_layers": 6,
        "out_channels": 1024,
        "use_tanh_at_final": False,
    },
}


def _tiny_config() -> dict[str, Any]:
    """Same architecture, token ranges and hop as the real config; small widths and depths."""
    tiny = copy.deepcopy(REAL_CONFIG)
    width = 64
    for block in ("encoder", "prenet", "postnet"):
        tiny[block].update(input_channels=width, out_channels=width, vocos_dim=32)
        tiny[block].update(vocos_intermediate_dim=64, vocos_num_layers=3)
    tiny["prenet"]["condition_dim"] = width
    tiny["decoder"].update(input_channel=width, channels=32)
    tiny["quantizer"]["input_dim"] = width
    tiny["speaker_encoder"].update(out_dim=width, latent_dim=16)
    return tiny


#: A small config for fast tests: same hop (rates [8, 5, 4, 2]), same ids, small widths.
TINY_CONFIG: dict[str, Any] = _tiny_config()

#: Std of the random "level" tensors (biases, norm offsets): small but non-zero, so that a loader
#: that swaps or drops one of them changes the output.
_OFFSET_STD = 0.02
#: ConvNeXt layer scale (gamma): how much each block adds to the residual stream.
_LAYER_SCALE = 0.3
#: Gain of each residual unit's last conv: keeps the residual stack from growing with depth.
_RESIDUAL_GAIN = 0.3
#: Gain of the generator's last conv: sets the loudness before the final tanh.
_OUTPUT_GAIN = 0.1


def _audio_tokenizer(config: str | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(config, str):
        presets = {"real": REAL_CONFIG, "tiny": TINY_CONFIG}
        if config not in presets:
            raise ValueError(f"config must be 'real', 'tiny' or a mapping, got {config!r}")
        return copy.deepcopy(presets[config])
    inner = config.get("audio_tokenizer", config)
    return copy.deepcopy(dict(inner))


def _fan_in(shape: tuple[int, ...], transposed: bool, stride: int) -> int:
    if transposed:  # (in, out, k): each output sums in * k / stride terms
        return max(1, shape[0] * shape[2] // stride)
    return max(1, math.prod(shape[1:]))


def _decode_tensors(model: BiCodecDecoder, gen: torch.Generator) -> Iterator[tuple[str, Tensor]]:
    """Yield (official key, random value) for every decode tensor, in a fixed order."""

    def randn(*shape: int) -> Tensor:
        return torch.randn(shape, generator=gen)

    for prefix, name, module, param, folded in official_parameters(model):
        shape, key = tuple(param.shape), prefix + name
        if folded:
            transposed = isinstance(module, FoldedConvTranspose1d)
            v = randn(*shape)
            gain = 1.0
            if prefix.endswith("block.3."):
                gain = _RESIDUAL_GAIN
            elif module is model.decoder.model[-2]:
                gain = _OUTPUT_GAIN
            stride = module.stride[0]
            norm_dims = list(range(1, v.dim()))
            scale = gain / math.sqrt(_fan_in(shape, transposed, stride))
            # g such that g * v / ||v|| == scale * v, times a per-channel jitter
            g = torch.linalg.vector_norm(v, dim=norm_dims, keepdim=True) * scale
            g = g * (1 + 0.1 * randn(*g.shape))
            yield prefix + "weight_g", g
            yield prefix + "weight_v", v
        elif name == "alpha":
            yield key, 0.5 + torch.rand(shape, generator=gen)
        elif name == "gamma":
            yield key, _LAYER_SCALE * (1 + 0.1 * randn(*shape))
        elif key.endswith(("scale.bias", "norm.weight", "final_layer_norm.weight")):
            yield key, 1 + 0.1 * randn(*shape)
        elif name == "bias" or param.dim() == 1:
            yield key, _OFFSET_STD * randn(*shape)
        elif key.endswith(("scale.weight", "shift.weight")):
            yield key, 0.3 * randn(*shape) / math.sqrt(shape[1])
        elif key == "quantizer.codebook.weight":
            yield key, randn(*shape)
        else:
            yield key, randn(*shape) / math.sqrt(_fan_in(shape, False, 1))


def random_speaker_tensor(name: str, shape: tuple[int, ...], gen: torch.Generator) -> Tensor:
    """A random value for the speaker-encoder tensor ``name`` (official key or a suffix of it).

    Matrices get fan-in-scaled normal values (FSQ's ``project_in`` 3x, so that its values span
    the levels), the perceiver's learned latents unit normal ones (the reference init's std 0.02
    would make the ids nearly the same for every clip), norm scales 1 + noise, BatchNorm
    variances in [0.5, 1.5), other vectors small noise.
    """
    noise = torch.randn(shape, generator=gen)
    if name.endswith("running_var"):
        return 0.5 + torch.rand(shape, generator=gen)
    batch_norm_scale = len(shape) == 1 and (name.endswith("bn.weight") or ".bns." in name)
    if name.endswith("gamma") or (batch_norm_scale and name.endswith("weight")):
        return 1 + 0.1 * noise
    if name.endswith("latents"):
        return noise
    if len(shape) >= 2:
        gain = 3.0 if "project_in" in name else 1.0
        return gain * noise / math.sqrt(math.prod(shape[1:]))
    return 0.1 * noise


def _speaker_encoder_tensors(
    parsed: BiCodecConfig, cfg: dict[str, Any], gen: torch.Generator
) -> Iterator[tuple[str, Tensor]]:
    """Yield (official key, random value) for every tensor the speaker encoder reads."""
    from pipecat_veena.codecs.bicodec.encoder import BiCodecSpeakerEncoder

    with torch.device("meta"):
        encoder = BiCodecSpeakerEncoder(parsed, MelConfig.from_dict(cfg))
    for prefix, name, _, tensor, _ in official_parameters(encoder):
        key = prefix + name
        yield key, random_speaker_tensor(key, tuple(tensor.shape), gen)


def _encode_only_tensors(cfg: dict[str, Any], gen: torch.Generator) -> dict[str, Tensor]:
    """A few tensors of the semantic encode path, in their official names, for loaders to skip."""
    q, e = cfg["quantizer"], cfg["encoder"]
    shapes = {
        "quantizer.in_project.weight_g": (q["codebook_dim"], 1, 1),
        "quantizer.in_project.weight_v": (q["codebook_dim"], q["input_dim"], 1),
        "quantizer.in_project.bias": (q["codebook_dim"],),
        "encoder.project.weight": (e["out_channels"], e["vocos_dim"]),
        "encoder.project.bias": (e["out_channels"],),
        "postnet.linear.bias": (cfg["postnet"]["out_channels"],),
    }
    tensors = {k: torch.randn(v, generator=gen) for k, v in shapes.items()}
    tensors["quantizer.cluster_size"] = torch.zeros(q["codebook_size"])
    return tensors


def write_random_checkpoint(
    directory: str | Path, config: str | Mapping[str, Any] = "real", *, seed: int = 0
) -> Path:
    """Write ``config.yaml`` and ``model.safetensors`` with random weights into ``directory``.

    Args:
        directory: where to write (created if needed); pass ``<root>/BiCodec`` for a full
            checkpoint layout.
        config: ``"real"`` (official sizes, about 96 M decode parameters, 385 MB), ``"tiny"``
            (same hop and ids, small widths), or an ``audio_tokenizer`` mapping.
        seed: the same seed writes the same bytes.

    Returns:
        The directory written.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = _audio_tokenizer(config)
    parsed = BiCodecConfig.from_dict(tokenizer, source="write_random_checkpoint")
    with torch.device("meta"):
        model = BiCodecDecoder(parsed)
    gen = torch.Generator().manual_seed(seed)
    tensors = {key: value.contiguous() for key, value in _decode_tensors(model, gen)}
    tensors.update(_encode_only_tensors(tokenizer, gen))
    tensors.update(_speaker_encoder_tensors(parsed, tokenizer, gen))
    (directory / CONFIG_FILE).write_text(
        yaml.safe_dump({"audio_tokenizer": tokenizer}, sort_keys=False)
    )
    save_file(tensors, str(directory / WEIGHTS_FILE))
    return directory
