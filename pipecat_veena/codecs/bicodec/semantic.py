"""BiCodec semantic tokenizer: a voice clip -> its semantic ids at 50 Hz (transcript-mode cloning).

The Spark-TTS tokenizer's semantic path, in order: volume normalisation of the *whole* clip (not
the 6 s reference segment), the wav2vec2 feature extractor (zero mean, unit variance), wav2vec2
(``wav2vec2-large-xlsr-53``) hidden states 11, 14 and 16 averaged, the BiCodec feature encoder
(Vocos backbone, ratio-1 sampling stages, projection) and the factorized VQ's encode half (1x1
projection to the codebook width, L2-normalised, nearest L2-normalised codebook vector).
Letters: B batch, N samples (16 kHz), T frames (50 Hz), H wav2vec2 width (1024), C encoder width
(``vocos_dim``), D quantizer input (1024), K codebook width (8). Parameter names follow the
official checkpoint (``encoder.*``, ``quantizer.in_project.*``, ``quantizer.codebook.weight``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from loguru import logger
from torch import Tensor, nn

from pipecat_veena.codecs.bicodec.config import BiCodecConfig, EncoderConfig, QuantizerConfig
from pipecat_veena.codecs.bicodec.encoder import clip_tensor, volume_normalize
from pipecat_veena.codecs.bicodec.loader import SEMANTIC_ENCODER_PREFIX, load_encode_part
from pipecat_veena.codecs.bicodec.modules import (
    FoldedConv1d,
    VocosBackbone,
    run_sampling_stages,
    sampling_stages,
)
from pipecat_veena.errors import CheckpointError

#: wav2vec2 hidden states averaged into the features (Spark-TTS); state 0 is the first layer's
#: input, state i the output of layer i - 1.
HIDDEN_STATES = (11, 14, 16)


class FeatureEncoder(nn.Module):
    """wav2vec2 features -> encoder latents: ``encoder`` (backbone), ``downsample``, ``project``."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        dim, inter = cfg.vocos_dim, cfg.vocos_intermediate_dim
        self.encoder = VocosBackbone(
            dim, inter, cfg.vocos_num_layers, input_channels=cfg.input_channels
        )
        self.downsample = sampling_stages(dim, inter, len(cfg.sample_ratios))
        self.project = nn.Linear(dim, cfg.out_channels)

    def forward(self, features: Tensor) -> Tensor:
        """features (B, T, H) -> latents (B, T, D)."""
        x = self.encoder(features.transpose(1, 2), None, None)  # (B, H, T) -> (B, T, C)
        return self.project(run_sampling_stages(self.downsample, x, None))


class SemanticVQEncoder(nn.Module):
    """Encode half of the factorized VQ: ``in_project`` (weight-normed 1x1 conv), nearest code."""

    def __init__(self, cfg: QuantizerConfig) -> None:
        super().__init__()
        self.in_project = FoldedConv1d(cfg.input_dim, cfg.codebook_dim, 1)
        self.codebook = nn.Embedding(cfg.codebook_size, cfg.codebook_dim)

    def forward(self, latents: Tensor) -> Tensor:
        """latents (B, T, D) -> ids (B, T) int64.

        Both the projected latents (B T, K) and the codebook are L2-normalised; the id is the
        codebook row at the least squared distance ``|e|^2 - 2 e.c + |c|^2``.
        """
        batch = latents.shape[0]
        weight = self.in_project.weight[:, :, 0]  # 1x1 conv as a linear over channels
        z = F.linear(latents, weight, self.in_project.bias).reshape(-1, weight.shape[0])
        z = F.normalize(z.float())  # (B T, K)
        codebook = F.normalize(self.codebook.weight.float())  # (codebook_size, K)
        dist = z.pow(2).sum(1, keepdim=True) - 2 * z @ codebook.t()
        dist = dist + codebook.pow(2).sum(1, keepdim=True).t()
        return (-dist).max(1)[1].reshape(batch, -1)


@dataclass(frozen=True)
class SemanticEncoding:
    """Both stages of one encode, for tests and diagnostics (on the model device)."""

    latents: Tensor  #: (B, T, D) float32 feature-encoder output
    ids: Tensor  #: (B, T) int64 semantic ids in [0, codebook_size)


class BiCodecSemanticEncoder(nn.Module):
    """wav2vec2 features -> semantic ids, in plain PyTorch (``encoder.*`` and ``quantizer.*``).

    Build with :meth:`from_pretrained` (loads the encode tensors of a BiCodec checkpoint).
    """

    def __init__(self, config: BiCodecConfig, encoder: EncoderConfig) -> None:
        super().__init__()
        if encoder.out_channels != config.quantizer.input_dim:
            raise ValueError(
                f"encoder.out_channels {encoder.out_channels} != quantizer.input_dim "
                f"{config.quantizer.input_dim}"
            )
        self.config = config
        self.encoder = FeatureEncoder(encoder)
        self.quantizer = SemanticVQEncoder(config.quantizer)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> BiCodecSemanticEncoder:
        """Load from a ``BiCodec/`` directory or a checkpoint root that contains one.

        Raises:
            CheckpointError: missing files, a checkpoint without the semantic encoder's tensors,
                or tensors that do not fit the config (naming the file, key and shapes).
        """
        absent = (
            "so this checkpoint cannot compute a clip's semantic tokens (transcript-mode "
            "enrolment). Use the full BiCodec/model.safetensors that ships with Spark-TTS-0.5B, "
            "or enrol without a transcript."
        )
        return load_encode_part(
            path, cls, EncoderConfig, what="semantic-encoder", marker=SEMANTIC_ENCODER_PREFIX,
            absent=absent, device=device, dtype=dtype,
        )  # fmt: skip

    @property
    def input_channels(self) -> int:
        """The feature width the encoder reads (the wav2vec2 hidden size, 1024 official)."""
        return self.encoder.encoder.embed.in_channels

    def forward(self, features: Tensor) -> SemanticEncoding:
        """features (B, T, H) -> latents (B, T, D) and ids (B, T)."""
        dtype = self.encoder.project.weight.dtype
        latents = self.encoder(features.to(dtype))
        return SemanticEncoding(latents.float(), self.quantizer(latents))


class Wav2Vec2Features:
    """The averaged wav2vec2 hidden states of a clip, from a local transformers checkpoint.

    Only the layers up to the last state read are kept (17 of XLSR-53's 24): the later ones
    cannot change those states. Runs in float32 on the CPU.

    Args:
        directory: the wav2vec2 directory (``config.json``, weights, ``preprocessor_config.json``).

    Raises:
        CheckpointError: the directory cannot be loaded, or its model has too few layers.
    """

    def __init__(self, directory: str | Path) -> None:
        from transformers import Wav2Vec2FeatureExtractor, Wav2Vec2Model

        directory = Path(directory)
        try:
            self.extractor = Wav2Vec2FeatureExtractor.from_pretrained(str(directory))
            model = Wav2Vec2Model.from_pretrained(str(directory), dtype=torch.float32)
        except (OSError, ValueError) as e:
            raise CheckpointError(
                f"{directory}: cannot load the wav2vec2 model ({e}). Use the "
                "wav2vec2-large-xlsr-53/ directory that ships inside Spark-TTS-0.5B."
            ) from e
        layers = model.encoder.layers
        if len(layers) < max(HIDDEN_STATES):
            raise CheckpointError(
                f"{directory}: the wav2vec2 model has {len(layers)} layers; transcript mode reads "
                f"hidden states {HIDDEN_STATES}, so it needs at least {max(HIDDEN_STATES)}."
            )
        keep = min(len(layers), max(HIDDEN_STATES) + 1)  # +1: the last state is not normed
        model.encoder.layers = layers[:keep]
        model.config.num_hidden_layers = keep
        self.model = model.eval().requires_grad_(False)
        self.sample_rate = int(self.extractor.sampling_rate)
        self.hidden_size = int(model.config.hidden_size)
        logger.debug(
            f"wav2vec2 loaded from {directory}: {keep} of {len(layers)} layers kept, "
            f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M params"
        )

    @torch.inference_mode()
    def __call__(self, wav: np.ndarray) -> Tensor:
        """A mono clip (N,) at ``sample_rate`` -> features (1, T, H), float32."""
        inputs = self.extractor(
            np.asarray(wav, dtype=np.float32), sampling_rate=self.sample_rate, return_tensors="pt"
        )
        states = self.model(inputs.input_values, output_hidden_states=True).hidden_states
        return sum(states[i] for i in HIDDEN_STATES) / len(HIDDEN_STATES)


class SemanticTokenizer:
    """A 16 kHz voice clip -> its BiCodec semantic ids (50 per second), as Spark-TTS computes them.

    Args:
        wav2vec2: the feature model.
        encoder: the checkpoint's semantic encoder.

    Raises:
        CheckpointError: the wav2vec2 width is not the encoder's input width.
    """

    def __init__(self, wav2vec2: Wav2Vec2Features, encoder: BiCodecSemanticEncoder) -> None:
        if wav2vec2.hidden_size != encoder.input_channels:
            raise CheckpointError(
                f"the wav2vec2 model's hidden size {wav2vec2.hidden_size} != the BiCodec "
                f"encoder's input_channels {encoder.input_channels}: use the wav2vec2 directory "
                "that ships with this BiCodec checkpoint"
            )
        self.wav2vec2 = wav2vec2
        self.encoder = encoder

    @classmethod
    def from_pretrained(cls, bicodec: str | Path, wav2vec2: str | Path) -> SemanticTokenizer:
        """Load both parts (CPU, float32): a BiCodec directory (or root) and a wav2vec2 directory.

        Raises:
            CheckpointError: as the two loaders raise, naming the file and the fix.
        """
        encoder = BiCodecSemanticEncoder.from_pretrained(bicodec)  # the cheaper check first
        return cls(Wav2Vec2Features(wav2vec2), encoder)

    @property
    def sample_rate(self) -> int:
        """The rate the clip must have, in Hz (16000)."""
        return self.wav2vec2.sample_rate

    def encode(self, wav: Tensor | np.ndarray) -> SemanticEncoding:
        """Every stage for a mono clip (N,) at ``sample_rate`` (float samples in [-1, 1])."""
        normalized = volume_normalize(clip_tensor(wav))
        features = self.wav2vec2(normalized.numpy())
        with torch.inference_mode():
            return self.encoder(features)

    def tokenize(self, wav: Tensor | np.ndarray) -> list[int]:
        """The semantic ids of a mono clip (N,) at ``sample_rate``: 50 per second."""
        return [int(i) for i in self.encode(wav).ids[0]]
