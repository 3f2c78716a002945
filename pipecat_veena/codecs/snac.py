"""SNAC (24 kHz, the Veena / Orpheus codec) as a frame-window ``AudioCodec``.

One frame is 7 LLM tokens: the codes of three levels of a residual VQ with strides 4, 2, 1
(slot 0 -> level 0; slots 1, 4 -> level 1; slots 2, 3, 5, 6 -> level 2, order kept), decoded into
2048 samples at 24 kHz. Letters: B batch, T frames, K = 7 codes per frame, N = T * 2048 samples.

Our wrapper around ``snac.SNAC`` changes three things, all on its own copy of the model:
weight norm is folded into plain weights at load; windows of different lengths share one batch
with the padded steps zeroed before every time-mixing convolution (so padding never leaks into
real samples); and SNAC's ``NoiseBlock`` (``torch.randn`` per call, so overlapping windows
disagree) is replaced by noise that is a fixed function of the absolute sample position, making a
window decode equal to the full decode. ``noise=False`` turns the noise off.

A window's decode computes only what its kept frames need: before each stage of the decoder the
activations are cut to the kept span plus the receptive field of the stages still to run, so the
context frames cost only the first, coarse stages (``SnacCodec._decode_span``).
"""

from __future__ import annotations

import functools
import json
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parametrize

from pipecat_veena.codecs.base import AudioCodec, CodecWindow
from pipecat_veena.errors import CheckpointError

#: The hubertsiuzdak/snac_24khz config (the codec of Orpheus, Veena and Maya1).
SNAC_24KHZ_CONFIG: dict = {
    "sampling_rate": 24000,
    "encoder_dim": 48,
    "encoder_rates": [2, 4, 8, 8],
    "decoder_dim": 1024,
    "decoder_rates": [8, 8, 4, 2],
    "attn_window_size": None,
    "codebook_size": 4096,
    "codebook_dim": 8,
    "vq_strides": [4, 2, 1],
    "noise": True,
    "depthwise": True,
}
# Two noise tables of coprime prime lengths per noise block: position p draws
# (a[p % P1] + b[p % P2]) / sqrt(2), standard normal and not periodic before P1 * P2 steps.
_NOISE_PERIODS = (65521, 65519)


@dataclass
class _Batch:
    """What the hooks need to know about the batch being decoded (set under the codec's lock).

    Column 0 of row b's activations lies ``origins[b]`` output samples from the start of its
    window (negative: before it); a stage with ``spf`` steps per frame has it at step
    ``origins[b] * spf // samples_per_frame`` (crops fall on whole steps of every later stage).
    """

    lengths: torch.Tensor | None = None  # (B,) frames of each row's window
    starts: torch.Tensor | None = None  # (B,) absolute start frame of each row
    origins: torch.Tensor | None = None  # (B,) samples
    samples_per_frame: int = 1

    def offsets(self, spf: int) -> torch.Tensor:
        """(B,) window-relative step of column 0 at a rate of ``spf`` steps per frame."""
        return self.origins * spf // self.samples_per_frame


class _PositionalNoise(nn.Module):
    """SNAC's noise injection ``x + noise * linear(x)`` with noise keyed by absolute position."""

    def __init__(self, linear: nn.Module, batch: _Batch, generator: torch.Generator) -> None:
        super().__init__()
        self.linear = linear
        self._batch = batch
        self.steps_per_frame = 1  # set by SnacCodec._prepare from the stage it sits in
        device = linear.weight.device
        for name, period in zip(("table_a", "table_b"), _NOISE_PERIODS, strict=True):
            self.register_buffer(name, torch.randn(period, generator=generator).to(device), False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, C, T') at this block's rate -> same shape with position-keyed noise added."""
        spf, batch = self.steps_per_frame, self._batch
        first = batch.starts * spf + batch.offsets(spf)  # (B,) absolute step of column 0
        pos = first[:, None] + torch.arange(x.shape[-1], device=x.device)
        a, b = self.table_a, self.table_b
        noise = (a[pos % a.numel()] + b[pos % b.numel()]) * 0.5**0.5  # (B, T') standard normal
        return x + noise[:, None, :].to(x.dtype) * self.linear(x)


class SnacCodec(AudioCodec):
    """SNAC decoding windows of 7-code frames; thread-safe, one decode at a time.

    Runs on ``device`` (CPU by default); ``decode_windows`` blocks, so call it off the event loop.
    """

    codes_per_frame = 7
    condition_size = 0

    def __init__(
        self,
        model: nn.Module,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        noise: bool = True,
        noise_seed: int = 0,
    ) -> None:
        if getattr(model, "attn_window_size", None) is not None:
            raise CheckpointError(
                "this SNAC config has local attention (attn_window_size set), whose blocks break "
                "window decoding: use an attention-free config such as snac_24khz"
            )
        self.model = model.eval().to(device=device, dtype=dtype or torch.float32)
        strides = list(model.vq_strides)
        self.levels = len(strides)
        self.codebook_size = int(model.codebook_size)
        self.sample_rate = int(model.sampling_rate)
        self.samples_per_frame = int(model.hop_length) * strides[0]
        self._slots = _slot_levels(strides)  # level of each slot, in slot order
        if len(self._slots) != self.codes_per_frame:
            raise CheckpointError(
                f"SNAC vq_strides {strides} give {len(self._slots)} codes per "
                "frame; the Orpheus layout needs 7 (use snac_24khz)"
            )
        self.noise = noise and _has_noise(model)
        self._batch = _Batch(samples_per_frame=self.samples_per_frame)
        self._lock = threading.Lock()
        self._latent_per_frame = strides[0]
        self._prepare(noise_seed)
        self.context_frames = math.ceil(receptive_radius(model.decoder) / strides[0])
        stages = list(model.decoder.model)
        # Steps (at its input rate) each stage's output can still depend on, each side.
        self._margins = [
            math.ceil(receptive_radius(nn.Sequential(*stages[i:]))) for i in range(len(stages))
        ]
        self.device = next(self.model.parameters()).device
        self.dtype = next(self.model.parameters()).dtype

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        *,
        noise: bool = True,
        noise_seed: int = 0,
    ) -> SnacCodec:
        """Load a local SNAC directory (config.json + pytorch_model.bin); never downloads."""
        from snac import SNAC

        path = Path(path)
        missing = [n for n in ("config.json", "pytorch_model.bin") if not (path / n).is_file()]
        if missing:
            raise CheckpointError(
                f"{path} is not a SNAC checkpoint directory (missing {', '.join(missing)}): "
                "point at a local copy of hubertsiuzdak/snac_24khz (or <checkpoint>/snac_24khz)"
            )
        return cls(
            SNAC.from_pretrained(str(path)),
            device=device,
            dtype=dtype,
            noise=noise,
            noise_seed=noise_seed,
        )

    def frames_to_levels(self, frames: np.ndarray) -> list[np.ndarray]:
        """De-interleave (T, 7) frames into the level codes [(T,), (2T,), (4T,)], order kept."""
        return [frames[:, self._slots == level].reshape(-1) for level in range(self.levels)]

    def check_frames(self, frames: np.ndarray) -> None:
        """Raise ValueError unless ``frames`` is a non-empty (T, 7) int array of codes in range."""
        if frames.ndim != 2 or frames.shape[1] != self.codes_per_frame or frames.shape[0] < 1:
            raise ValueError(f"SNAC frames must have shape (T >= 1, 7), got {frames.shape}")
        if not np.issubdtype(frames.dtype, np.integer):
            raise ValueError(f"SNAC codes must be integers, got dtype {frames.dtype}")
        bad = np.argwhere((frames < 0) | (frames >= self.codebook_size))
        if len(bad):
            t, slot = (int(v) for v in bad[0])
            raise ValueError(
                f"SNAC code {int(frames[t, slot])} (frame {t}, slot {slot}) is outside "
                f"[0, {self.codebook_size}): pass codes, not LLM ids (Orpheus: code = id - 128266 "
                f"- 4096 * slot)"
            )

    @torch.inference_mode()
    def decode_windows(self, windows: Sequence[CodecWindow]) -> list[np.ndarray]:
        """Decode windows of 7-code frames in one batch (no padding leaks between rows).

        Args:
            windows: each ``frames`` (T_i, 7) int codes in [0, 4096), ``condition`` None,
                ``start`` the absolute frame index (keys the noise).

        Returns:
            float32 (kept_frames_i * 2048,) per window (its ``keep`` range, else all of it), in
            [-1, 1] at 24 kHz.
        """
        for window in windows:
            self.check_frames(window.frames)
            if window.condition is not None:
                raise ValueError("SNAC takes no condition: pass CodecWindow(condition=None)")
        if not windows:
            return []
        lengths = [w.num_frames for w in windows]
        t_max = max(lengths)
        padded = np.zeros((len(windows), t_max, self.codes_per_frame), dtype=np.int64)
        for row, window in zip(padded, windows, strict=True):
            row[: window.num_frames] = window.frames
        # (B, t_max, 7) -> per level (B, t_max * codes of that level per frame), order kept
        codes = [
            torch.from_numpy(padded[:, :, self._slots == level].reshape(len(windows), -1)).to(
                self.device
            )
            for level in range(self.levels)
        ]
        keep = torch.tensor([w.kept for w in windows], device=self.device)
        with self._lock:
            batch = self._batch
            batch.starts = torch.tensor([w.start for w in windows], device=self.device)
            batch.lengths = torch.tensor(lengths, device=self.device)
            try:
                latents = self.model.quantizer.from_codes(codes)  # (B, C, t_max * 4)
                audio = self._decode_span(latents, keep)  # (B, K * 2048)
            finally:
                batch.lengths = batch.starts = batch.origins = None
        audio = audio.float().cpu().numpy()
        hop = self.samples_per_frame
        return [audio[i, : (b - a) * hop].copy() for i, (a, b) in enumerate(keep.tolist())]

    def _decode_span(self, latents: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Decode each row's kept frames, computing each stage only where the output needs it.

        Args:
            latents: (B, C, T * 4) quantizer output over the whole windows.
            keep: (B, 2) frame range ``[a, b)`` of each row's window whose audio is wanted.

        Returns:
            (B, K * 2048) audio, row b's kept samples first (K the longest kept range).

        Before each stage, row b is cut to its kept range plus the stage's margin (the
        receptive field of the stages from there on) and laid out from column 0; what falls
        outside the row's window is zeroed by the padding hooks, as the window's own zero
        padding would be. The kept samples are then those of the whole-window decode.
        """
        batch, x = self._batch, latents
        span = int((keep[:, 1] - keep[:, 0]).max())
        spf = self._latent_per_frame
        batch.origins = torch.zeros_like(keep[:, 0])
        for stage, margin in zip(self.model.decoder.model, self._margins, strict=True):
            start = keep[:, 0] * spf - margin  # (B,) window-relative first step to compute
            columns = (start - batch.offsets(spf))[:, None] + torch.arange(
                span * spf + 2 * margin, device=x.device
            )
            # Columns past what the previous stage computed lie beyond every kept sample's
            # reach (margins only shrink): clamped, they read junk that no kept sample sees.
            columns = columns.clamp(0, x.shape[-1] - 1)[:, None, :].expand(-1, x.shape[1], -1)
            x = x.gather(2, columns)
            batch.origins = start * (self.samples_per_frame // spf)
            x = stage(x)
            spf *= _upsampling(stage)
        first = int(batch.offsets(spf)[0] - keep[0, 0] * spf)  # the same for every row
        return x[:, 0, -first : -first + span * spf]

    def _prepare(self, noise_seed: int) -> None:
        """Fold weight norm, hook the padding mask and swap in (or drop) the noise blocks."""
        for module in self.model.modules():
            if parametrize.is_parametrized(module, "weight"):
                parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)
        generator = torch.Generator().manual_seed(noise_seed)
        for module in self.model.decoder.modules():
            if isinstance(module, nn.Sequential):
                for i, child in enumerate(module):
                    if type(child).__name__ == "NoiseBlock":
                        module[i] = (
                            _PositionalNoise(child.linear, self._batch, generator)
                            if self.noise
                            else nn.Identity()
                        )
        spf = self._latent_per_frame  # steps per frame at the input of each module, in order
        for module in self.model.decoder.modules():
            if _mixes_time(module):
                module.register_forward_pre_hook(functools.partial(self._mask_padding, spf))
            if isinstance(module, _PositionalNoise):
                module.steps_per_frame = spf
            if isinstance(module, nn.ConvTranspose1d):
                spf *= module.stride[0]

    def _mask_padding(
        self, spf: int, module: nn.Module, args: tuple[torch.Tensor]
    ) -> tuple[torch.Tensor]:
        """Zero each row's steps outside its own window, as its standalone decode's padding would.

        ``spf``: steps per frame at the module's input.
        """
        batch = self._batch
        x = args[0]  # (B, C, T')
        pos = batch.offsets(spf)[:, None] + torch.arange(x.shape[-1], device=x.device)
        inside = (pos >= 0) & (pos < (batch.lengths * spf)[:, None])
        return (x * inside[:, None, :].to(x.dtype),)


def receptive_radius(decoder: nn.Module) -> float:
    """Half-width of the decoder's receptive field, in latent steps (input steps of ``decoder``).

    Walks the time-mixing layers in forward order: a convolution reaches ``max(padding,
    dilation * (k - 1) - padding)`` steps at its own rate, a transposed convolution
    ``max(k - 1 - padding, padding) / stride`` of its input steps; rates grow by each stride.
    """
    radius, rate = 0.0, 1
    for module in decoder.modules():
        if isinstance(module, nn.ConvTranspose1d):
            (k,), (s,), (p,) = module.kernel_size, module.stride, module.padding
            radius += max(k - 1 - p, p) / s / rate
            rate *= s
        elif isinstance(module, nn.Conv1d):
            (k,), (d,), (p,) = module.kernel_size, module.dilation, module.padding
            radius += max(p, d * (k - 1) - p) / rate
    return radius


def write_random_checkpoint(
    directory: str | Path, *, seed: int = 0, config: dict | None = None
) -> Path:
    """Write a SNAC directory with random weights (``config.json`` + ``pytorch_model.bin``).

    For tests and benchmarks: the architecture of ``config`` (default ``SNAC_24KHZ_CONFIG``) with
    torch's default initialisation under ``torch.manual_seed(seed)``.
    """
    from snac import SNAC

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = dict(config or SNAC_24KHZ_CONFIG)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = SNAC(**config)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    torch.save(model.state_dict(), directory / "pytorch_model.bin")
    return directory


def _slot_levels(strides: list[int]) -> np.ndarray:
    """Level of each slot of a frame: a depth-first walk of the code tree (Orpheus order)."""

    def walk(level: int) -> list[int]:
        if level == len(strides) - 1:
            return [level]
        children = strides[level] // strides[level + 1]
        return [level] + [s for _ in range(children) for s in walk(level + 1)]

    return np.array(walk(0), dtype=np.int64)


def _upsampling(module: nn.Module) -> int:
    """How many output steps a module makes of each input step (its transposed convs' strides)."""
    factor = 1
    for layer in module.modules():
        if isinstance(layer, nn.ConvTranspose1d):
            factor *= layer.stride[0]
    return factor


def _mixes_time(module: nn.Module) -> bool:
    if isinstance(module, nn.ConvTranspose1d):
        return True
    return isinstance(module, nn.Conv1d) and module.kernel_size[0] > 1


def _has_noise(model: nn.Module) -> bool:
    return any(type(m).__name__ == "NoiseBlock" for m in model.modules())
