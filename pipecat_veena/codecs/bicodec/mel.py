"""The speaker encoder's input: a magnitude mel spectrogram on ``torch.stft`` (no torchaudio).

Same numbers as the reference's ``torchaudio.transforms.MelSpectrogram(power=1, norm="slaney",
mel_scale="slaney")``: a centred STFT with reflect padding, a periodic Hann window of
``win_length`` centred inside ``n_fft``, magnitudes (no log), then a Slaney-normalised
triangular filterbank on the Slaney mel scale. Letters: B batch, N samples, F frames
(``N // hop + 1``), K frequency bins (``n_fft // 2 + 1``), M mel bands.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from pipecat_veena.codecs.bicodec.config import MelConfig

#: The Slaney mel scale: linear below ``_LOG_FROM_HZ`` (``_HZ_PER_MEL`` Hz per mel), then
#: logarithmic with ``_LOG_STEP`` per mel (a factor 6.4 every 27 mels).
_HZ_PER_MEL = 200.0 / 3
_LOG_FROM_HZ = 1000.0
_LOG_STEP = math.log(6.4) / 27.0


def hz_to_mel(hz: Tensor) -> Tensor:
    """Frequencies in Hz -> Slaney mels (float64 in, float64 out)."""
    log_from_mel = _LOG_FROM_HZ / _HZ_PER_MEL
    logarithmic = log_from_mel + torch.log(hz.clamp(min=_LOG_FROM_HZ) / _LOG_FROM_HZ) / _LOG_STEP
    return torch.where(hz >= _LOG_FROM_HZ, logarithmic, hz / _HZ_PER_MEL)


def mel_to_hz(mel: Tensor) -> Tensor:
    """Slaney mels -> frequencies in Hz (the inverse of :func:`hz_to_mel`)."""
    log_from_mel = _LOG_FROM_HZ / _HZ_PER_MEL
    logarithmic = _LOG_FROM_HZ * torch.exp(_LOG_STEP * (mel - log_from_mel))
    return torch.where(mel >= log_from_mel, logarithmic, mel * _HZ_PER_MEL)


def slaney_filterbank(cfg: MelConfig) -> Tensor:
    """Triangular filters (K, M), each of area-normalised height ``2 / (upper - lower edge)``.

    Band m rises from edge m to edge m + 1 and falls to edge m + 2, the M + 2 edges spaced
    evenly in mels from ``f_min`` to ``f_max`` (Nyquist when None). Computed in float64.
    """
    f_max = cfg.f_max if cfg.f_max is not None else float(cfg.sample_rate // 2)
    bins = torch.linspace(0, cfg.sample_rate // 2, cfg.n_fft // 2 + 1, dtype=torch.float64)
    mel_range = hz_to_mel(torch.tensor([cfg.f_min, f_max], dtype=torch.float64))
    edges = mel_to_hz(torch.linspace(*mel_range.tolist(), cfg.n_mels + 2, dtype=torch.float64))
    widths = edges.diff()  # (M + 1,)
    offsets = edges[None, :] - bins[:, None]  # (K, M + 2): edge minus bin frequency
    rising = -offsets[:, :-2] / widths[:-1]
    falling = offsets[:, 2:] / widths[1:]
    bank = torch.minimum(rising, falling).clamp(min=0)
    return bank * (2.0 / (edges[2:] - edges[:-2]))


class MelSpectrogram(nn.Module):
    """Waveform (B, N) -> magnitude mel spectrogram (B, M, F), in the waveform's dtype.

    No parameters: the window and the filterbank are derived from the config, cached per device
    and dtype (so building the module on the meta device loses nothing).
    """

    def __init__(self, cfg: MelConfig) -> None:
        super().__init__()
        if cfg.win_length > cfg.n_fft:
            raise ValueError(f"mel win_length {cfg.win_length} exceeds n_fft {cfg.n_fft}")
        self.cfg = cfg
        self._tables: dict[tuple[torch.device, torch.dtype], tuple[Tensor, Tensor]] = {}

    def tables(self, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """(Hann window (win_length,), filterbank (K, M)) on ``device`` in ``dtype``."""
        key = (device, dtype)
        if key not in self._tables:
            window = torch.hann_window(self.cfg.win_length, dtype=torch.float64)
            bank = slaney_filterbank(self.cfg)
            self._tables[key] = (window.to(device, dtype), bank.to(device, dtype))
        return self._tables[key]

    def forward(self, wav: Tensor) -> Tensor:
        """wav (B, N) float, N > n_fft // 2 (reflect padding) -> (B, M, N // hop + 1)."""
        cfg = self.cfg
        window, bank = self.tables(wav.device, wav.dtype)
        spec = torch.stft(
            wav,
            cfg.n_fft,
            hop_length=cfg.hop_length,
            win_length=cfg.win_length,
            window=window,
            center=True,
            pad_mode="reflect",
            normalized=False,
            onesided=True,
            return_complex=True,
        ).abs()  # (B, K, F)
        return torch.einsum("bkf,km->bmf", spec, bank)
