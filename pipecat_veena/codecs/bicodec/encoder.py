"""BiCodec speaker encoder: a voice clip -> the 32 global token ids that are a voice.

The Spark-TTS tokenizer's global path, in order: volume normalisation of the whole clip, the
6-second reference segment (tiled when shorter), a magnitude mel spectrogram, ECAPA-TDNN's
frame latent, a perceiver resampler to 32 latents, and a residual FSQ (one quantizer) whose
digits form the ids. Letters: B batch, N samples (16 kHz), F mel frames, L global tokens (32),
D ``latent_dim``, K FSQ digits (6). Parameter names follow the official checkpoint
(``speaker_encoder.{speaker_encoder, perceiver_sampler, quantizer.project_in}.*``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from pipecat_veena.codecs.bicodec.config import BiCodecConfig, MelConfig, SpeakerConfig
from pipecat_veena.codecs.bicodec.ecapa import LATENT_CHANNELS, EcapaTdnn
from pipecat_veena.codecs.bicodec.loader import SPEAKER_ENCODER_PREFIX, load_encode_part
from pipecat_veena.codecs.bicodec.mel import MelSpectrogram
from pipecat_veena.codecs.bicodec.model import fsq_basis
from pipecat_veena.codecs.bicodec.perceiver import PerceiverResampler

#: Seconds of reference audio the speaker encoder reads (Spark-TTS ``ref_segment_duration``).
REF_SEGMENT_SECONDS = 6
#: Volume normalisation target (Spark-TTS ``audio_volume_normalize`` coeff) and gain limits.
VOLUME_TARGET = 0.2
VOLUME_GAIN_RANGE = (0.1, 10.0)
#: A clip whose peak is below this is first scaled so that its peak is this value.
QUIET_PEAK = 0.1
#: Samples at or below this magnitude do not count towards the loudness estimate.
LOUDNESS_FLOOR = 0.01
#: The loudness is the mean magnitude between these quantiles of the counted samples.
LOUDNESS_QUANTILES = (0.9, 0.99)
#: The FSQ bound's margin: digits saturate slightly inside the outer levels.
FSQ_BOUND_EPS = 1e-3


def volume_normalize(wav: Tensor) -> Tensor:
    """Scale a mono clip (N,) so that its loud samples sit near ``VOLUME_TARGET``.

    The Spark-TTS recipe, step for step: a clip quieter than ``QUIET_PEAK`` is raised to that
    peak; the loudness is the mean magnitude of the 90th-99th percentile of the *original*
    samples above ``LOUDNESS_FLOOR`` (the reference measures before that first scaling); the
    gain ``target / loudness`` is clipped to ``VOLUME_GAIN_RANGE``; a result above full scale is
    scaled back to a peak of 1. With 10 or fewer samples above the floor only the first step
    applies.
    """
    magnitudes = torch.sort(wav.abs()).values
    peak = float(magnitudes[-1])
    if peak < QUIET_PEAK:
        wav = wav / max(peak, 1e-3) * QUIET_PEAK
    loud = magnitudes[magnitudes > LOUDNESS_FLOOR]
    count = loud.numel()
    if count <= 10:
        return wav
    lo, hi = (int(q * count) for q in LOUDNESS_QUANTILES)
    loudness = float(loud[lo:hi].mean())
    wav = wav * float(np.clip(VOLUME_TARGET / loudness, *VOLUME_GAIN_RANGE))
    peak = float(wav.abs().max())
    return wav / peak if peak > 1 else wav


def clip_tensor(wav: Tensor | np.ndarray) -> Tensor:
    """A mono clip as a float32 tensor (N,).

    Raises:
        ValueError: not a non-empty 1-D array of finite samples.
    """
    wav = torch.as_tensor(wav, dtype=torch.float32)
    if wav.dim() != 1 or wav.numel() == 0:
        raise ValueError(f"the voice clip must be a non-empty 1-D array, got {tuple(wav.shape)}")
    if not bool(torch.isfinite(wav).all()):
        raise ValueError("the voice clip holds NaN or infinite samples")
    return wav


def reference_clip(wav: Tensor, length: int) -> Tensor:
    """The first ``length`` samples of ``wav`` (N,), the clip tiled end to end when shorter."""
    if wav.numel() == 0:
        raise ValueError("the voice clip is empty")
    if wav.numel() < length:
        wav = wav.repeat(length // wav.numel() + 1)
    return wav[:length]


@dataclass(frozen=True)
class SpeakerEncoding:
    """Every stage of one encode, for tests and diagnostics (float32, on the model device)."""

    mel: Tensor  #: (B, n_mels, F) magnitude mel spectrogram of the reference clips
    latent: Tensor  #: (B, 1536, F) ECAPA-TDNN frame latent
    tokens: Tensor  #: (B, L, D) perceiver output, before quantisation
    ids: Tensor  #: (B, L) int64 global ids in [0, prod(fsq_levels))


class FSQEncoder(nn.Module):
    """``project_in`` (D -> K), then each value bounded, rounded to a level, read as a digit."""

    def __init__(self, cfg: SpeakerConfig) -> None:
        super().__init__()
        self.levels = cfg.fsq_levels
        self.project_in = nn.Linear(cfg.latent_dim, len(cfg.fsq_levels))

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens (B, L, D) -> ids (B, L) int64.

        Value z of digit k with n = levels[k] levels: ``tanh(z + shift) * h - offset`` with
        ``h = (n - 1)(1 + eps) / 2``, ``offset = 0.5`` for even n (0 for odd) and
        ``shift = atanh(offset / h)``, rounded (half to even) and moved to [0, n).
        """
        z = self.project_in(tokens).float()  # (B, L, K)
        levels = torch.tensor(self.levels, dtype=torch.int32, device=z.device)
        half_range = (levels - 1) * (1 + FSQ_BOUND_EPS) / 2
        offset = torch.where(levels % 2 == 0, 0.5, 0.0)
        shift = (offset / half_range).atanh()
        digits = torch.round(torch.tanh(z + shift) * half_range - offset) + levels // 2
        return (digits.long() * fsq_basis(self.levels).to(z.device)).sum(dim=-1)


class _SpeakerTokenizer(nn.Module):
    """The encoder's learned parts, under the checkpoint's names (prefix ``speaker_encoder.``)."""

    def __init__(self, cfg: SpeakerConfig) -> None:
        super().__init__()
        self.speaker_encoder = EcapaTdnn(cfg.input_dim)
        self.perceiver_sampler = PerceiverResampler(cfg.latent_dim, LATENT_CHANNELS, cfg.token_num)
        self.quantizer = FSQEncoder(cfg)


class BiCodecSpeakerEncoder(nn.Module):
    """A 16 kHz voice clip -> 32 BiCodec global ids, in plain PyTorch.

    Build with :meth:`from_pretrained` (loads the speaker-encoder tensors of a BiCodec
    checkpoint). Encoding runs under ``torch.inference_mode``; about 6 M parameters.
    """

    def __init__(self, config: BiCodecConfig, mel: MelConfig) -> None:
        super().__init__()
        if mel.n_mels != config.speaker.input_dim:
            raise ValueError(
                f"mel_params.num_mels {mel.n_mels} != speaker_encoder.input_dim "
                f"{config.speaker.input_dim}"
            )
        self.config = config
        self.mel = MelSpectrogram(mel)
        self.speaker_encoder = _SpeakerTokenizer(config.speaker)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> BiCodecSpeakerEncoder:
        """Load from a ``BiCodec/`` directory or a checkpoint root that contains one.

        Raises:
            CheckpointError: missing files, a checkpoint without speaker-encoder tensors, or
                tensors that do not fit the config (naming the file, key and shapes).
        """
        absent = (
            "so voices cannot be enrolled from audio with this checkpoint. Use the full "
            "BiCodec/model.safetensors that ships with Spark-TTS-0.5B (it holds them)."
        )
        return load_encode_part(
            path, cls, MelConfig, what="speaker-encoder", marker=SPEAKER_ENCODER_PREFIX,
            absent=absent, device=device, dtype=dtype,
        )  # fmt: skip

    @property
    def sample_rate(self) -> int:
        """The rate the clip must have, in Hz (16000 official)."""
        return self.mel.cfg.sample_rate

    @property
    def clip_samples(self) -> int:
        """Samples of the reference segment: 6 s rounded down to whole hops (96000 official)."""
        hop = self.config.hop_length
        return self.sample_rate * REF_SEGMENT_SECONDS // hop * hop

    @property
    def device(self) -> torch.device:
        """The device the weights live on."""
        return self.speaker_encoder.speaker_encoder.conv.weight.device

    def forward(self, clips: Tensor) -> SpeakerEncoding:
        """Reference clips (B, clip_samples), volume-normalised -> every stage of the encode."""
        dtype = self.speaker_encoder.speaker_encoder.conv.weight.dtype
        mel = self.mel(clips.float()).to(dtype)  # (B, M, F)
        parts = self.speaker_encoder
        latent = parts.speaker_encoder(mel.transpose(1, 2))  # (B, 1536, F)
        tokens = parts.perceiver_sampler(latent.transpose(1, 2))  # (B, L, D)
        ids = parts.quantizer(tokens)
        return SpeakerEncoding(mel.float(), latent.float(), tokens.float(), ids)

    def prepare(self, wav: Tensor | np.ndarray) -> Tensor:
        """A mono clip (N,) at ``sample_rate`` -> its normalised reference segment (clip_samples,).

        Raises:
            ValueError: not a non-empty 1-D array of finite samples.
        """
        return reference_clip(volume_normalize(clip_tensor(wav)), self.clip_samples)

    @torch.inference_mode()
    def tokenize(self, wav: Tensor | np.ndarray) -> list[int]:
        """The 32 global ids of a mono clip (N,) at ``sample_rate`` (float samples in [-1, 1])."""
        clip = self.prepare(wav).to(self.device)
        return [int(i) for i in self(clip[None]).ids[0]]
