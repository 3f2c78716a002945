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

import torch
import yaml
from safetensors.torch import save_file
from torch import Tensor, nn


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
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.yaml").write_text(
            yaml.safe_dump({"audio_tokenizer": dict(audio_tokenizer)}, sort_keys=False)
        )
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(directory / "model.safetensors"))
        return directory
