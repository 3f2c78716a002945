"""BiCodec decode configuration: the ``audio_tokenizer`` block of ``BiCodec/config.yaml``.

The decode path needs four blocks (``quantizer``, ``speaker_encoder``, ``prenet``, ``decoder``)
plus ``mel_params.sample_rate``. Every derived number (hop, receptive field) is computed here
from those values; nobody else writes them down.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipecat_veena.errors import CheckpointError

#: ConvNeXt layers in each of the prenet's down-sampling stages. The reference architecture fixes
#: this (it is not read from the config), so it lives here as a constant of the architecture.
DOWNSAMPLE_LAYERS = 2
#: Kernel of every VocosBackbone ``embed`` conv and ConvNeXt depthwise conv.
VOCOS_KERNEL = 7
#: Kernel of the WaveGenerator's first and last conv and of each residual unit's dilated conv.
WAVE_KERNEL = 7
#: Dilations of the three residual units of each WaveGenerator up-sampling block.
RESIDUAL_DILATIONS = (1, 3, 9)

_DECODE_BLOCKS = ("mel_params", "quantizer", "speaker_encoder", "prenet", "decoder")


def read_audio_tokenizer(path: str | Path) -> Mapping[str, Any]:
    """The ``audio_tokenizer`` block of a BiCodec ``config.yaml``.

    Raises:
        CheckpointError: the file is unreadable or has no such block.
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as e:
        raise CheckpointError(
            f"{path}: cannot read the BiCodec config ({e}). Point to a BiCodec directory "
            "with a readable config.yaml."
        ) from e
    if not isinstance(data, Mapping) or not isinstance(data.get("audio_tokenizer"), Mapping):
        raise CheckpointError(
            f"{path}: no 'audio_tokenizer' block at the top level. Use the config.yaml that "
            "ships with the BiCodec weights (BiCodec/config.yaml)."
        )
    return data["audio_tokenizer"]


@dataclass(frozen=True)
class MelConfig:
    """The speaker encoder's input: a magnitude mel spectrogram (``mel_params``; encode only)."""

    sample_rate: int
    n_fft: int
    win_length: int
    hop_length: int
    f_min: float
    f_max: float | None
    n_mels: int

    @classmethod
    def from_dict(cls, tokenizer: Mapping[str, Any], *, source: str = "config") -> MelConfig:
        """Build from the ``audio_tokenizer`` mapping's ``mel_params`` block.

        Raises:
            CheckpointError: the block or one of its keys is missing.
        """
        params = tokenizer.get("mel_params")
        keys = ("sample_rate", "n_fft", "win_length", "hop_length", "mel_fmin", "num_mels")
        missing = [k for k in keys if not isinstance(params, Mapping) or k not in params]
        if missing:
            raise CheckpointError(
                f"{source}: audio_tokenizer.mel_params lacks {missing}, which the speaker "
                "encoder needs. Use the config.yaml that ships with the BiCodec weights."
            )
        f_max = params.get("mel_fmax")
        return cls(
            sample_rate=int(params["sample_rate"]),
            n_fft=int(params["n_fft"]),
            win_length=int(params["win_length"]),
            hop_length=int(params["hop_length"]),
            f_min=float(params["mel_fmin"]),
            f_max=None if f_max is None else float(f_max),
            n_mels=int(params["num_mels"]),
        )


@dataclass(frozen=True)
class EncoderConfig:
    """The semantic feature encoder (``encoder`` block; encode only): wav2vec2 features in."""

    input_channels: int
    vocos_dim: int
    vocos_intermediate_dim: int
    vocos_num_layers: int
    out_channels: int
    sample_ratios: tuple[int, ...]

    @classmethod
    def from_dict(cls, tokenizer: Mapping[str, Any], *, source: str = "config") -> EncoderConfig:
        """Build from the ``audio_tokenizer`` mapping's ``encoder`` block.

        Raises:
            CheckpointError: the block or one of its keys is missing, or a sample ratio is not 1.
        """
        block = tokenizer.get("encoder")
        keys = ("input_channels", "vocos_dim", "vocos_intermediate_dim", "vocos_num_layers",
                "out_channels", "sample_ratios")  # fmt: skip
        missing = [k for k in keys if not isinstance(block, Mapping) or k not in block]
        if missing:
            raise CheckpointError(
                f"{source}: audio_tokenizer.encoder lacks {missing}, which the semantic "
                "encoder needs. Use the config.yaml that ships with the BiCodec weights."
            )
        ratios = tuple(int(r) for r in block["sample_ratios"])
        if any(r != 1 for r in ratios):
            raise CheckpointError(
                f"{source}: unsupported audio_tokenizer.encoder.sample_ratios {ratios} (only 1s "
                "supported, as in Spark-TTS-0.5B)."
            )
        return cls(*(int(block[k]) for k in keys[:-1]), ratios)


@dataclass(frozen=True)
class QuantizerConfig:
    """Semantic codebook: ``codebook_size`` vectors of ``codebook_dim``, projected up."""

    input_dim: int
    codebook_size: int
    codebook_dim: int


@dataclass(frozen=True)
class SpeakerConfig:
    """Global (speaker) tokens: ``token_num`` residual-FSQ ids, decoded to an ``out_dim`` vector."""

    out_dim: int
    latent_dim: int
    token_num: int
    fsq_levels: tuple[int, ...]
    fsq_num_quantizers: int
    #: Mel bins the speaker encoder reads (encode only).
    input_dim: int = 128

    @property
    def codebook_size(self) -> int:
        """Number of distinct global ids (product of the FSQ levels, 4096 for BiCodec)."""
        return math.prod(self.fsq_levels)


@dataclass(frozen=True)
class PrenetConfig:
    """The Vocos-style feature decoder conditioned on the speaker vector (AdaLN)."""

    input_channels: int
    vocos_dim: int
    vocos_intermediate_dim: int
    vocos_num_layers: int
    out_channels: int
    condition_dim: int
    sample_ratios: tuple[int, ...]
    use_tanh_at_final: bool


@dataclass(frozen=True)
class WaveGeneratorConfig:
    """The DAC-style up-sampling generator: ``channels`` halves at each of the ``rates``."""

    input_channel: int
    channels: int
    rates: tuple[int, ...]
    kernel_sizes: tuple[int, ...]
    d_out: int = 1


@dataclass(frozen=True)
class BiCodecConfig:
    """Everything the decode path needs from ``config.yaml``."""

    sample_rate: int
    quantizer: QuantizerConfig
    speaker: SpeakerConfig
    prenet: PrenetConfig
    decoder: WaveGeneratorConfig

    @property
    def hop_length(self) -> int:
        """Waveform samples per semantic token (product of the generator's rates)."""
        return math.prod(self.decoder.rates)

    @property
    def receptive_field(self) -> int:
        """Tokens of context (one side) that can influence a token's samples.

        Walks the decode path backwards from the samples of one token: every same-length conv
        widens the interval by its dilated half-kernel, every transposed conv maps it back to its
        input rate. Windows with at least this much context on each side decode exactly.
        """
        half = (WAVE_KERNEL - 1) // 2
        t = 4 * self.hop_length  # any token; far from 0 so that no interval edge is negative
        lo, hi = t * self.hop_length, (t + 1) * self.hop_length - 1
        lo, hi = lo - half, hi + half  # final conv
        stages = list(zip(self.decoder.rates, self.decoder.kernel_sizes, strict=True))
        for rate, kernel in reversed(stages):
            reach = sum(d * half for d in RESIDUAL_DILATIONS)
            lo, hi = lo - reach, hi + reach
            pad = (kernel - rate) // 2
            lo, hi = -((kernel - 1 - pad - lo) // rate), (hi + pad) // rate  # transposed conv
        lo, hi = lo - half, hi + half  # generator's first conv, at the token rate
        vocos_half = (VOCOS_KERNEL - 1) // 2
        convs = 1 + self.prenet.vocos_num_layers  # main backbone: embed + depthwise convs
        convs += len(self.prenet.sample_ratios) * (1 + DOWNSAMPLE_LAYERS)
        lo, hi = lo - convs * vocos_half, hi + convs * vocos_half
        return max(t - lo, hi - t)

    @property
    def wave_margins(self) -> list[int]:
        """Context the generator needs at each of its crop points, in samples of that point's rate.

        Crop points in forward order: the generator input (tokens), after its first conv, then
        for each up-sampling block after the transposed conv and after each residual unit. To
        compute the output samples of tokens ``[a, b)`` exactly, the tensor at a crop point of
        rate ``f`` (samples per token) must cover ``[a * f - m, b * f + m)``. Derived backwards
        from the output like ``receptive_field``; ``wave_margins[0]`` is the generator's own
        receptive field in tokens.
        """
        half = (WAVE_KERNEL - 1) // 2
        margin = half  # the final conv
        out: list[int] = []
        stages = list(zip(self.decoder.rates, self.decoder.kernel_sizes, strict=True))
        for rate, kernel in reversed(stages):
            for dilation in reversed(RESIDUAL_DILATIONS):
                out.append(margin)
                margin += dilation * half
            out.append(margin)  # after the transposed conv
            pad = (kernel - rate) // 2
            left = -((pad - kernel - margin) // rate + 1)
            right = (margin - 1 + pad) // rate + 1
            margin = max(left, right)
        out.append(margin)  # after the first conv
        out.append(margin + half)
        return out[::-1]

    @classmethod
    def from_dict(cls, tokenizer: Mapping[str, Any], *, source: str = "config") -> BiCodecConfig:
        """Build from the ``audio_tokenizer`` mapping (extra keys and blocks are ignored).

        Raises:
            CheckpointError: a needed block or key is missing, or the values are inconsistent.
        """
        for block in _DECODE_BLOCKS:
            if not isinstance(tokenizer.get(block), Mapping):
                raise CheckpointError(
                    f"{source}: the audio_tokenizer block has no '{block}' sub-block, which the "
                    f"BiCodec decoder needs (found: {sorted(tokenizer)}). Use the config.yaml that "
                    "ships with the BiCodec weights."
                )

        def take(block: str, key: str, default: Any = None, *, required: bool = True) -> Any:
            values = tokenizer[block]
            if key not in values:
                if required:
                    raise CheckpointError(
                        f"{source}: audio_tokenizer.{block} lacks '{key}'. Use the config.yaml "
                        "that ships with the BiCodec weights."
                    )
                return default
            return values[key]

        def ints(block: str, key: str) -> tuple[int, ...]:
            return tuple(int(v) for v in take(block, key))

        prenet = PrenetConfig(
            input_channels=int(take("prenet", "input_channels")),
            vocos_dim=int(take("prenet", "vocos_dim")),
            vocos_intermediate_dim=int(take("prenet", "vocos_intermediate_dim")),
            vocos_num_layers=int(take("prenet", "vocos_num_layers")),
            out_channels=int(take("prenet", "out_channels")),
            condition_dim=int(take("prenet", "condition_dim")),
            sample_ratios=ints("prenet", "sample_ratios"),
            use_tanh_at_final=bool(take("prenet", "use_tanh_at_final", False, required=False)),
        )
        config = cls(
            sample_rate=int(take("mel_params", "sample_rate")),
            quantizer=QuantizerConfig(
                input_dim=int(take("quantizer", "input_dim")),
                codebook_size=int(take("quantizer", "codebook_size")),
                codebook_dim=int(take("quantizer", "codebook_dim")),
            ),
            speaker=SpeakerConfig(
                out_dim=int(take("speaker_encoder", "out_dim")),
                latent_dim=int(take("speaker_encoder", "latent_dim")),
                token_num=int(take("speaker_encoder", "token_num")),
                fsq_levels=ints("speaker_encoder", "fsq_levels"),
                fsq_num_quantizers=int(take("speaker_encoder", "fsq_num_quantizers")),
                input_dim=int(take("speaker_encoder", "input_dim", 128, required=False)),
            ),
            prenet=prenet,
            decoder=WaveGeneratorConfig(
                input_channel=int(take("decoder", "input_channel")),
                channels=int(take("decoder", "channels")),
                rates=ints("decoder", "rates"),
                kernel_sizes=ints("decoder", "kernel_sizes"),
                d_out=int(take("decoder", "d_out", 1, required=False)),
            ),
        )
        config._check(source, tokenizer["mel_params"].get("hop_length"))
        return config

    @classmethod
    def from_yaml(cls, path: str | Path) -> BiCodecConfig:
        """Read ``config.yaml`` and build from its ``audio_tokenizer`` block.

        Raises:
            CheckpointError: the file is unreadable or lacks the needed blocks.
        """
        return cls.from_dict(read_audio_tokenizer(path), source=str(path))

    def _check(self, source: str, mel_hop: Any) -> None:
        """Reject configurations the decode path does not implement, naming the fix."""
        problems = []
        if any(r != 1 for r in self.prenet.sample_ratios):
            problems.append(f"prenet.sample_ratios {self.prenet.sample_ratios} (only 1s supported)")
        if len(self.decoder.rates) != len(self.decoder.kernel_sizes):
            problems.append("decoder.rates and decoder.kernel_sizes differ in length")
        if self.decoder.channels % 2 ** len(self.decoder.rates):
            problems.append(f"decoder.channels {self.decoder.channels} not divisible by 2^stages")
        if mel_hop is not None and int(mel_hop) != self.hop_length:
            problems.append(
                f"mel_params.hop_length {mel_hop} != prod(decoder.rates) {self.hop_length}"
            )
        if self.speaker.fsq_num_quantizers != 1:
            problems.append("speaker_encoder.fsq_num_quantizers must be 1")
        widths = {
            "quantizer.input_dim": self.quantizer.input_dim,
            "prenet.input_channels": self.prenet.input_channels,
            "prenet.out_channels": self.prenet.out_channels,
            "prenet.condition_dim": self.prenet.condition_dim,
            "speaker_encoder.out_dim": self.speaker.out_dim,
            "decoder.input_channel": self.decoder.input_channel,
        }
        if len(set(widths.values())) != 1:
            problems.append(f"feature widths disagree: {widths}")
        if problems:
            raise CheckpointError(
                f"{source}: unsupported BiCodec decode config: {'; '.join(problems)}."
            )
