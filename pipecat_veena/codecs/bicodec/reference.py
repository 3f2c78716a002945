"""The independent reference for parity tests and benchmarks: flashtts 0.1.7's BiCodec modules.

flashtts (MIT) is installed with ``--no-deps`` for tests only (see the Makefile). Only the module
files of the decode path are imported: its package-level ``SparkDeTokenizer`` needs omegaconf and
more, so :class:`ReferenceDetokenizer` wires the four reference modules exactly as flashtts's
``SparkDeTokenizerModel.forward`` does (its residual FSQ needs ``einx``: the dev extra).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from safetensors.torch import save_file
from torch import Tensor, nn

from pipecat_veena.codecs.bicodec.checkpoint import random_speaker_tensor


def _save(directory: str | Path, audio_tokenizer: Mapping[str, Any], state: Mapping) -> Path:
    """Write ``config.yaml`` (the ``audio_tokenizer`` block) and ``state`` as model.safetensors."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.yaml").write_text(
        yaml.safe_dump({"audio_tokenizer": dict(audio_tokenizer)}, sort_keys=False)
    )
    tensors = {k: v.detach().contiguous() for k, v in state.items()}
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


class ReferenceDetokenizer(nn.Module):
    """flashtts's BiCodec decode modules, composed as ``SparkDeTokenizerModel`` composes them."""

    def __init__(self, audio_tokenizer: Mapping[str, Any]) -> None:
        super().__init__()
        from flashtts.modules.encoder_decoder.feat_decoder import Decoder
        from flashtts.modules.encoder_decoder.wave_generator import WaveGenerator
        from flashtts.modules.speaker.speaker_encoder import SpeakerEncoder
        from flashtts.modules.vq.factorized_vector_quantize import FactorizedVectorQuantize

        cfg = audio_tokenizer
        self.quantizer = FactorizedVectorQuantize(**cfg["quantizer"])
        self.prenet = Decoder(**cfg["prenet"])
        self.decoder = WaveGenerator(**cfg["decoder"])
        self.speaker_encoder = SpeakerEncoder(**cfg["speaker_encoder"])

    @torch.no_grad()
    def forward(self, semantic_ids: Tensor, global_ids: Tensor) -> Tensor:
        """semantic (B, T), global (B, 32) int64 -> waveform (B, 1, 320 T) in [-1, 1]."""
        z_q = self.quantizer.detokenize(semantic_ids)
        d_vector = self.speaker_encoder.detokenize(global_ids[:, None, :])  # (B, 1, G) layout
        x = self.prenet(z_q, d_vector)
        return self.decoder(x + d_vector.unsqueeze(-1))

    @torch.no_grad()
    def randomize(self, seed: int = 0) -> ReferenceDetokenizer:
        """Give every decode parameter a distinct random value.

        The reference init leaves biases at 0 and Snake alphas and norm weights at 1; perturbing
        them makes parity check each tensor's role.
        """
        gen = torch.Generator().manual_seed(seed)
        for name, param in self.named_parameters():
            noise = torch.randn(param.shape, generator=gen)
            if name.endswith("alpha"):
                param.copy_(0.5 + torch.rand(param.shape, generator=gen))
            elif name.endswith("weight_g"):
                param.mul_(1 + 0.1 * noise)
            elif param.dim() <= 1:
                param.add_(0.05 * noise)
        return self

    def save(self, directory: str | Path, audio_tokenizer: Mapping[str, Any]) -> Path:
        """Write ``config.yaml`` and the full state dict (official layout) as model.safetensors."""
        return _save(directory, audio_tokenizer, self.state_dict())


# --- the speaker encoder (encode path) ---
#
# flashtts computes the mel spectrogram with torchaudio and leaves volume normalisation to its
# callers (Spark-TTS's audio_volume_normalize); neither is importable here. Their reference
# versions below are numpy transcriptions of those recipes, written independently of our torch
# code: explicit frames and np.fft.rfft instead of torch.stft, the filterbank built filter by
# filter in float64 as librosa.filters.mel(norm="slaney", htk=False) does.


def reference_volume_normalize(audio: np.ndarray, coeff: float = 0.2) -> np.ndarray:
    """Spark-TTS ``audio_volume_normalize`` on a float64 clip."""
    temp = np.sort(np.abs(audio))
    if temp[-1] < 0.1:
        audio = audio / max(temp[-1], 1e-3) * 0.1
    temp = temp[temp > 0.01]
    if temp.shape[0] <= 10:
        return audio
    n = temp.shape[0]
    volume = np.mean(temp[int(0.9 * n) : int(0.99 * n)])
    audio = audio * np.clip(coeff / volume, a_min=0.1, a_max=10)
    peak = np.max(np.abs(audio))
    return audio / peak if peak > 1 else audio


def reference_ref_clip(wav: np.ndarray, seconds: int = 6, rate: int = 16000, hop: int = 320):
    """Spark-TTS ``get_ref_clip``: the first 6 s (whole hops), tiled when shorter."""
    length = rate * seconds // hop * hop
    if len(wav) < length:
        wav = np.tile(wav, length // len(wav) + 1)
    return wav[:length]


def _slaney_hz_to_mel(f: np.ndarray) -> np.ndarray:
    f = np.asarray(f, dtype=np.float64)
    mel = f / (200.0 / 3)
    log_region = f >= 1000.0
    mel[log_region] = 15.0 + np.log(f[log_region] / 1000.0) / (np.log(6.4) / 27.0)
    return mel


def _slaney_mel_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    f = m * (200.0 / 3)
    log_region = m >= 15.0
    f[log_region] = 1000.0 * np.exp((np.log(6.4) / 27.0) * (m[log_region] - 15.0))
    return f


def reference_mel(wav: np.ndarray, mel_params: Mapping[str, Any]) -> np.ndarray:
    """Magnitude mel spectrogram (n_mels, frames) of a 1-D clip, in float64 numpy."""
    sr, n_fft = int(mel_params["sample_rate"]), int(mel_params["n_fft"])
    win, hop, n_mels = (int(mel_params[k]) for k in ("win_length", "hop_length", "num_mels"))
    fmin = float(mel_params["mel_fmin"])
    fmax = float(mel_params["mel_fmax"] or sr / 2)
    padded = np.pad(np.asarray(wav, dtype=np.float64), n_fft // 2, mode="reflect")
    hann = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(win) / win)  # periodic
    window = np.zeros(n_fft)
    window[(n_fft - win) // 2 : (n_fft - win) // 2 + win] = hann
    frames = 1 + (len(padded) - n_fft) // hop
    spec = np.stack(
        [np.abs(np.fft.rfft(padded[i * hop : i * hop + n_fft] * window)) for i in range(frames)],
        axis=1,
    )  # (n_fft // 2 + 1, frames)
    freqs = np.linspace(0, sr / 2, n_fft // 2 + 1)
    edges = _slaney_mel_to_hz(np.linspace(*_slaney_hz_to_mel(np.array([fmin, fmax])), n_mels + 2))
    bank = np.zeros((n_mels, len(freqs)))
    for m in range(n_mels):
        lower = (freqs - edges[m]) / (edges[m + 1] - edges[m])
        upper = (edges[m + 2] - freqs) / (edges[m + 2] - edges[m + 1])
        bank[m] = np.maximum(0, np.minimum(lower, upper)) * 2.0 / (edges[m + 2] - edges[m])
    return bank @ spec


class ReferenceSpeakerEncoder(nn.Module):
    """flashtts's ``SpeakerEncoder`` behind the Spark-TTS global-token recipe.

    The recipe: volume normalisation, the 6 s reference clip, the mel spectrogram (numpy
    versions above), then flashtts's ``SpeakerEncoder.tokenize`` stage by stage.
    """

    def __init__(self, audio_tokenizer: Mapping[str, Any]) -> None:
        super().__init__()
        from flashtts.modules.speaker.speaker_encoder import SpeakerEncoder

        self.mel_params = dict(audio_tokenizer["mel_params"])
        self.speaker_encoder = SpeakerEncoder(**audio_tokenizer["speaker_encoder"])

    @torch.no_grad()
    def randomize(self, seed: int = 0) -> ReferenceSpeakerEncoder:
        """Give every tensor a distinct random value, as our checkpoint writer does.

        The reference init leaves the ids almost the same for every clip (its latents, std
        0.02, dominate); these values make parity check each tensor's role, with ids that
        depend on the clip.
        """
        gen = torch.Generator().manual_seed(seed)
        for name, tensor in self.state_dict().items():
            if tensor.is_floating_point():
                tensor.copy_(random_speaker_tensor(name, tuple(tensor.shape), gen))
        return self

    def save(self, directory: str | Path, audio_tokenizer: Mapping[str, Any]) -> Path:
        """Write ``config.yaml`` and the state dict under the official ``speaker_encoder.``."""
        state = self.speaker_encoder.state_dict()
        return _save(
            directory, audio_tokenizer, {f"speaker_encoder.{k}": v for k, v in state.items()}
        )

    @torch.no_grad()
    def encode(self, wav: np.ndarray) -> dict[str, Tensor]:
        """A 16 kHz mono clip -> mel (M, F), latent (1536, F), tokens (L, D), ids (L,)."""
        clip = reference_ref_clip(reference_volume_normalize(np.asarray(wav, np.float64)))
        mel = torch.from_numpy(reference_mel(clip, self.mel_params)).float()[None]
        parts = self.speaker_encoder
        _, latent = parts.speaker_encoder(mel.transpose(1, 2), True)
        tokens = parts.perceiver_sampler(latent.transpose(1, 2))
        _, ids = parts.quantizer(tokens.transpose(1, 2))  # (1, 1, L): one quantizer
        assert torch.equal(ids, parts.tokenize(mel.transpose(1, 2)))  # the stages are the API's
        return {"mel": mel[0], "latent": latent[0], "tokens": tokens[0], "ids": ids[0, 0]}


# --- the semantic tokenizer (transcript mode) ---


class ReferenceSemanticTokenizer(nn.Module):
    """flashtts's ``Encoder`` and ``FactorizedVectorQuantize`` behind the Spark-TTS recipe.

    The recipe (Spark-TTS ``BiCodecTokenizer.tokenize``): the volume-normalised whole clip (numpy
    version above), transformers' wav2vec2 feature extractor and the *full* wav2vec2 model with
    every hidden state, states 11, 14 and 16 averaged, then ``Encoder`` and
    ``FactorizedVectorQuantize.tokenize``. The BiCodec tensors are loaded from a checkpoint's
    ``model.safetensors`` with torch's own ``load_state_dict`` (weight-norm keys as saved).
    """

    def __init__(self, bicodec_dir: str | Path, wav2vec2_dir: str | Path) -> None:
        super().__init__()
        from flashtts.modules.encoder_decoder.feat_encoder import Encoder
        from flashtts.modules.vq.factorized_vector_quantize import FactorizedVectorQuantize
        from safetensors.torch import load_file
        from transformers import Wav2Vec2FeatureExtractor, Wav2Vec2Model

        bicodec_dir = Path(bicodec_dir)
        cfg = yaml.safe_load((bicodec_dir / "config.yaml").read_text())["audio_tokenizer"]
        self.encoder = Encoder(**cfg["encoder"])
        self.quantizer = FactorizedVectorQuantize(**cfg["quantizer"])
        state = load_file(str(bicodec_dir / "model.safetensors"))
        for name in ("encoder", "quantizer"):
            part = {k[len(name) + 1 :]: v for k, v in state.items() if k.startswith(name + ".")}
            getattr(self, name).load_state_dict(part)
        self.processor = Wav2Vec2FeatureExtractor.from_pretrained(str(wav2vec2_dir))
        self.wav2vec2 = Wav2Vec2Model.from_pretrained(str(wav2vec2_dir)).eval()
        self.wav2vec2.config.output_hidden_states = True
        self.eval()

    @torch.no_grad()
    def encode(self, wav: np.ndarray) -> dict[str, Tensor]:
        """A 16 kHz mono clip -> features (T, H), latents (T, D), ids (T,)."""
        wav = reference_volume_normalize(np.asarray(wav, np.float64)).astype(np.float32)
        inputs = self.processor(wav, sampling_rate=16000, return_tensors="pt", padding=True)
        states = self.wav2vec2(inputs.input_values).hidden_states
        feat = (states[11] + states[14] + states[16]) / 3
        z = self.encoder(feat.transpose(1, 2))  # (1, D, T)
        ids = self.quantizer.tokenize(z)
        return {"features": feat[0], "latents": z[0].transpose(0, 1), "ids": ids[0]}
