"""BiCodecDecoder: semantic + global token ids -> 16 kHz waveform (the Spark-TTS detokenizer).

Letters: B batch, T semantic tokens, G global tokens (32), N = T * hop samples (hop 320 at 16 kHz
for the official config). Parameter names follow the official checkpoint layout, so the loader
maps keys one to one (weight-norm pairs are folded into ``weight``).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipecat_veena.codecs.bicodec.config import BiCodecConfig, QuantizerConfig, SpeakerConfig
from pipecat_veena.codecs.bicodec.loader import load_decode_part
from pipecat_veena.codecs.bicodec.modules import FoldedConv1d, Prenet, WaveGenerator


class SemanticQuantizer(nn.Module):
    """Decode half of the factorized VQ: codebook lookup then a 1x1 projection (no L2 norm)."""

    def __init__(self, cfg: QuantizerConfig) -> None:
        super().__init__()
        self.codebook = nn.Embedding(cfg.codebook_size, cfg.codebook_dim)
        self.out_project = FoldedConv1d(cfg.codebook_dim, cfg.input_dim, 1)

    def forward(self, ids: Tensor) -> Tensor:
        """ids (B, T) int64 -> features (B, T, input_dim)."""
        weight = self.out_project.weight[:, :, 0]  # 1x1 conv as a linear over channels
        return F.linear(self.codebook(ids), weight, self.out_project.bias)


def fsq_basis(levels: tuple[int, ...]) -> Tensor:
    """Place value of each FSQ digit in a global id (int64, first level least significant).

    ``id = sum(digit[k] * basis[k])``; for levels (4,) * 6 the basis is 1, 4, 16, ..., 1024.
    """
    levels_t = torch.tensor(levels, dtype=torch.int64)
    return torch.cumprod(torch.cat([levels_t.new_ones(1), levels_t[:-1]]), 0)


class _FSQProjection(nn.Module):
    """Holds ``project_out`` under the name the checkpoint uses (``quantizer.project_out``)."""

    def __init__(self, cfg: SpeakerConfig) -> None:
        super().__init__()
        self.project_out = nn.Linear(len(cfg.fsq_levels), cfg.latent_dim)


class SpeakerDecoder(nn.Module):
    """Global ids -> speaker vector: residual-FSQ codes -> project_out -> flatten -> project."""

    def __init__(self, cfg: SpeakerConfig) -> None:
        super().__init__()
        self.levels = cfg.fsq_levels
        self.quantizer = _FSQProjection(cfg)
        self.project = nn.Linear(cfg.latent_dim * cfg.token_num, cfg.out_dim)
        self._tables: dict[tuple[torch.device, torch.dtype], Tensor] = {}

    def code_table(self, device: torch.device, dtype: torch.dtype) -> Tensor:
        """The implicit FSQ codebook (codebook_size, len(levels)), cached per device and dtype.

        Id i has digit k = (i // prod(levels[:k])) % levels[k] (first level least significant),
        and code k = (digit - levels[k] // 2) / (levels[k] // 2).
        """
        key = (device, dtype)
        if key not in self._tables:
            levels = torch.tensor(self.levels, dtype=torch.int64)
            basis = fsq_basis(self.levels)
            ids = torch.arange(int(torch.prod(levels)))[:, None]
            half = levels // 2
            codes = ((ids // basis) % levels - half).to(torch.float32) / half
            self._tables[key] = codes.to(device=device, dtype=dtype)
        return self._tables[key]

    def forward(self, ids: Tensor) -> Tensor:
        """ids (B, G) int64 -> speaker vector (B, out_dim)."""
        codes = self.code_table(ids.device, self.project.weight.dtype)[ids]  # (B, G, levels)
        latent = self.quantizer.project_out(codes).transpose(1, 2)  # (B, G, D) -> (B, D, G)
        return self.project(latent.reshape(latent.shape[0], -1))  # channel-major flatten


class BiCodecDecoder(nn.Module):
    """The BiCodec decode path in plain PyTorch (weight norm folded, no encoder parts).

    Runs on any device and dtype; ``decode`` runs under ``torch.inference_mode``. Build with
    :meth:`from_pretrained` (loads weights) or ``BiCodecDecoder(config)`` (uninitialised values).
    """

    def __init__(self, config: BiCodecConfig) -> None:
        super().__init__()
        self.config = config
        self.quantizer = SemanticQuantizer(config.quantizer)
        self.speaker_encoder = SpeakerDecoder(config.speaker)
        self.prenet = Prenet(config.prenet)
        self.decoder = WaveGenerator(config.decoder)
        self._positions: dict[torch.device, Tensor] = {}

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> BiCodecDecoder:
        """Load a ``BiCodec/`` directory, or a checkpoint root that contains one.

        Weights are read tensor by tensor (no second full copy in memory) and weight norm is
        folded once. Raises :class:`~pipecat_veena.errors.CheckpointError` naming the file, the
        key and the shapes when the checkpoint does not fit the config.
        """
        model = load_decode_part(path, cls, device=device, dtype=dtype)
        model.decoder.channels_last_weights()
        return model

    @property
    def sample_rate(self) -> int:
        """Output sample rate in Hz (16000 for the official config)."""
        return self.config.sample_rate

    @property
    def hop_length(self) -> int:
        """Waveform samples per semantic token (320 for the official config)."""
        return self.config.hop_length

    @property
    def receptive_field(self) -> int:
        """Tokens of context, on each side, that can change a token's samples (67 official)."""
        return self.config.receptive_field

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the weights (and of the computation)."""
        return self.prenet.linear.weight.dtype

    @property
    def device(self) -> torch.device:
        """The device the weights live on."""
        return self.prenet.linear.weight.device

    def _masks(self, lengths: Tensor | None, steps: int) -> list[Tensor | None]:
        """Padding masks (B, 1, steps * f) at the token rate and after each up-sampling stage.

        All None when nothing is padded. One position ramp per device is cached and grown to the
        longest output seen, so masks cost no allocation beyond their own.
        """
        factors = [1]
        for rate in self.config.decoder.rates:
            factors.append(factors[-1] * rate)
        if lengths is None or bool((lengths >= steps).all()):
            return [None] * len(factors)
        ramp = self._positions.get(lengths.device)
        if ramp is None or ramp.numel() < steps * factors[-1]:
            ramp = torch.arange(steps * factors[-1], device=lengths.device)
            self._positions[lengths.device] = ramp
        masks = []
        for f in factors:
            keep = ramp[: steps * f] < (lengths[:, None] * f)
            masks.append(keep[:, None, :].to(self.dtype))
        return masks

    def forward(
        self,
        features: Tensor,
        speaker: Tensor,
        lengths: Tensor | None = None,
        keep: Tensor | None = None,
    ) -> Tensor:
        """Continuous part of the decode: differentiable, and what ``self.compile()`` compiles.

        Args:
            features: (B, T, C) projected codebook vectors (``quantizer`` output).
            speaker: (B, C) speaker vectors (``speaker_encoder`` output).
            lengths: (B,) valid tokens per item, or None when all are T.
            keep: (B, 2) int64 token range ``[a, b)`` per item whose samples are wanted, or
                None for all. The generator (most of the work) then runs over each range plus
                its own receptive field only; the prenet still runs over the whole window.

        Returns:
            (B, T * hop) waveform in [-1, 1], in the model dtype; zero past ``lengths * hop``.
            With ``keep``: (B, K * hop), item b's range first (K the longest range), the rest
            of its row unspecified.
        """
        masks = self._masks(lengths, features.shape[1])
        x = self.prenet(features, speaker, masks[0])
        x = x + speaker[:, :, None]  # broadcast the speaker vector over time
        if keep is not None:
            return self._generate_span(x, lengths, keep)
        wav = self.decoder(x, masks)[:, 0]  # (B, 1, N) -> (B, N)
        return masked(wav, masks[-1])

    def _generate_span(self, x: Tensor, lengths: Tensor | None, keep: Tensor) -> Tensor:
        """Run the generator over each row's kept tokens plus its own receptive field only.

        Row b's generator input is re-laid so that its kept tokens start at column ``m`` (the
        generator's receptive field) for every row; what lies outside the row's real tokens is
        padding, masked as the full decode masks it. Returns (B, K * hop), row b's kept samples
        first (K the longest kept span).
        """
        margins = self.config.wave_margins
        m = margins[0]
        batch, _, steps = x.shape
        lengths = x.new_full((batch,), steps, dtype=torch.int64) if lengths is None else lengths
        span = int((keep[:, 1] - keep[:, 0]).max())
        columns = keep[:, :1] - m + torch.arange(span + 2 * m, device=x.device)  # (B, W)
        gathered = x.gather(2, columns.clamp(0, steps - 1)[:, None, :].expand(-1, x.shape[1], -1))
        # Real input of row b in the new layout: tokens [0, lengths[b]) of its window.
        valid = torch.stack([m - keep[:, 0], m - keep[:, 0] + lengths], dim=1)
        return self.decoder.forward_span(gathered, valid, (m, m + span), margins)[:, 0]

    @torch.inference_mode()
    def decode(
        self,
        semantic_ids: Tensor,
        global_ids: Tensor,
        lengths: Tensor | None = None,
        keep: Tensor | None = None,
    ) -> Tensor:
        """Decode token ids to audio.

        Args:
            semantic_ids: (B, T) int64 in [0, codebook_size) (8192 official).
            global_ids: (B, G) int64 in [0, prod(fsq_levels)) (G = 32, 4096 ids official).
            lengths: optional (B,) int64: item b uses only its first lengths[b] tokens; the rest
                is padding and never changes the real samples.
            keep: optional (B, 2) int64 token ranges ``[a, b)`` within each item's tokens: only
                their samples are computed (see ``forward``), equal to the full decode's.

        Returns:
            (B, T * hop) float32 waveform in [-1, 1] at ``sample_rate``; zero past
            ``lengths[b] * hop``. With ``keep``: (B, K * hop), item b's range first.
        """
        self._check_ids(semantic_ids, global_ids, lengths)
        device = self.device
        if keep is not None:
            _check_keep(keep, lengths, semantic_ids.shape)
            keep = keep.to(device)
        semantic_ids, global_ids = semantic_ids.to(device), global_ids.to(device)
        lengths = None if lengths is None else lengths.to(device)
        features, speaker = self.quantizer(semantic_ids), self.speaker_encoder(global_ids)
        wav = self(features, speaker, lengths, keep)
        return wav.float()

    def _check_ids(self, semantic: Tensor, globals_: Tensor, lengths: Tensor | None) -> None:
        """Raise ValueError naming the problem when ids have the wrong shape, dtype or range."""
        cfg = self.config
        if semantic.dim() != 2 or semantic.dtype.is_floating_point:
            raise ValueError(f"semantic_ids must be an integer (B, T) tensor, got {semantic.shape}")
        batch, steps = semantic.shape
        if globals_.shape != (batch, cfg.speaker.token_num) or globals_.dtype.is_floating_point:
            raise ValueError(
                f"global_ids must be an integer ({batch}, {cfg.speaker.token_num}) tensor, "
                f"got {tuple(globals_.shape)} {globals_.dtype}"
            )
        _check_range("semantic_ids", semantic, cfg.quantizer.codebook_size)
        _check_range("global_ids", globals_, cfg.speaker.codebook_size)
        if lengths is not None:
            if lengths.shape != (batch,):
                raise ValueError(f"lengths must have shape ({batch},), got {tuple(lengths.shape)}")
            _check_range("lengths", lengths, steps + 1)


def _check_keep(keep: Tensor, lengths: Tensor | None, shape: torch.Size) -> None:
    """Raise ValueError unless keep is (B, 2) integer ranges, non-empty, within the tokens."""
    batch, steps = shape
    if keep.shape != (batch, 2) or keep.dtype.is_floating_point:
        raise ValueError(f"keep must be an integer ({batch}, 2) tensor, got {tuple(keep.shape)}")
    ends = torch.full((batch,), steps) if lengths is None else lengths.cpu()
    keep = keep.cpu()
    if bool(((keep[:, 0] < 0) | (keep[:, 1] <= keep[:, 0]) | (keep[:, 1] > ends)).any()):
        raise ValueError(
            f"keep ranges must satisfy 0 <= a < b <= the item's length, got {keep.tolist()} "
            f"for lengths {ends.tolist()}"
        )


def _check_range(name: str, ids: Tensor, size: int) -> None:
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= size):
        raise ValueError(
            f"{name} must lie in [0, {size}), got values in [{int(ids.min())}, {int(ids.max())}]"
        )


def masked(x: Tensor, mask: Tensor | None) -> Tensor:
    """x (B, N) with the padded samples (mask (B, 1, N) == 0) set to zero."""
    return x if mask is None else x * mask[:, 0]
