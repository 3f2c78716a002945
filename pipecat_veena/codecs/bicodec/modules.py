"""BiCodec decode blocks: Vocos ConvNeXt backbone (prenet) and DAC-style wave generator.

Letters: B batch, C channels, T time steps at the block's own rate. Every block takes an optional
``mask`` (B, 1, T) of ones on real steps and zeros on padding, and zeroes the padded steps before
every conv that mixes time, so that a right-padded batch item computes exactly what it would alone.
Per-step ops (norms, linears, Snake) may leave garbage on padded steps: the next time-mixing conv
never sees it. Weight-normed convs of the reference are plain convs here (folded at load); the
classes :class:`FoldedConv1d` / :class:`FoldedConvTranspose1d` mark them for the loader.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pipecat_veena.codecs.bicodec.config import (
    DOWNSAMPLE_LAYERS,
    RESIDUAL_DILATIONS,
    VOCOS_KERNEL,
    WAVE_KERNEL,
    PrenetConfig,
    WaveGeneratorConfig,
)

#: Added to Snake's alpha before the reciprocal, as in the reference (avoids 1/0).
SNAKE_EPS = 1e-9
#: LayerNorm / AdaLN epsilon of the Vocos blocks.
NORM_EPS = 1e-6


class FoldedConv1d(nn.Conv1d):
    """A Conv1d stored with weight norm in the checkpoint, folded into ``weight`` at load.

    Runs on the generator's channels-last layout: x (B, C, 1, T) with channels-last strides
    (memory order B, T, C), as a 2-D conv of height 1. oneDNN then skips the layout reorders it
    does around every NCW conv (measured 1.1x to 4x faster per conv on these CPUs).
    """

    def forward(self, x: Tensor) -> Tensor:
        """x (B, C_in, 1, T) -> (B, C_out, 1, T_out), channels-last."""
        return F.conv2d(
            x,
            self.weight.unsqueeze(2),
            self.bias,
            stride=(1, self.stride[0]),
            padding=(0, self.padding[0]),
            dilation=(1, self.dilation[0]),
            groups=self.groups,
        )


class FoldedConvTranspose1d(nn.ConvTranspose1d):
    """A ConvTranspose1d stored with weight norm (norm per *input* channel), folded at load.

    Runs on the channels-last (B, C, 1, T) layout, like :class:`FoldedConv1d`.
    """

    def forward(self, x: Tensor) -> Tensor:
        """x (B, C_in, 1, T) -> (B, C_out, 1, T * stride), channels-last."""
        return F.conv_transpose2d(
            x,
            self.weight.unsqueeze(2),
            self.bias,
            stride=(1, self.stride[0]),
            padding=(0, self.padding[0]),
            groups=self.groups,
        )


def official_parameters(
    model: nn.Module,
) -> Iterator[tuple[str, str, nn.Module, Tensor, bool]]:
    """Walk ``model``'s parameters and persistent buffers as the official checkpoint names them.

    Buffers are the saved statistics of encoder layers (BatchNorm running mean and variance);
    the decode path has none. The order is fixed.

    Yields:
        (key prefix, tensor name, owning module, tensor, folded): ``folded`` is True for
        the weight of a weight-normed conv, stored as ``weight_g`` / ``weight_v`` in the file.
    """
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        folded = isinstance(module, FoldedConv1d | FoldedConvTranspose1d)
        for name, param in module.named_parameters(recurse=False):
            yield prefix, name, module, param, folded and name == "weight"
        for name, buffer in module.named_buffers(recurse=False):
            if name not in module._non_persistent_buffers_set:
                yield prefix, name, module, buffer, False


def masked(x: Tensor, mask: Tensor | None) -> Tensor:
    """Zero the padded time steps of ``x`` (B, C, [1,] T) where ``mask`` (B, 1, [1,] T) is 0."""
    return x if mask is None else x * mask


def _inplace_ok(x: Tensor) -> bool:
    """In-place updates are safe when autograd does not need the tensor (inference)."""
    return not (torch.is_grad_enabled() and x.requires_grad)


class Snake1d(nn.Module):
    """Snake activation ``y = x + sin(alpha * x)^2 / (alpha + 1e-9)``, per channel."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: Tensor, *, inplace: bool = False) -> Tensor:
        """Apply Snake to x (B, C, ...) per channel; with ``inplace`` the result overwrites x."""
        alpha = self.alpha.view(1, -1, *([1] * (x.dim() - 2)))
        if not _inplace_ok(x):  # autograd needs every intermediate: plain out-of-place ops
            return x + (alpha + SNAKE_EPS).reciprocal() * torch.sin(alpha * x).pow(2)
        s = torch.mul(x, alpha).sin_()
        s.mul_(s).mul_((alpha + SNAKE_EPS).reciprocal())
        if inplace:
            return x.add_(s)
        return s.add_(x)


class AdaLayerNorm(nn.Module):
    """LayerNorm without affine, then a per-item scale and shift computed from the condition."""

    def __init__(self, condition_dim: int, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.scale = nn.Linear(condition_dim, dim)
        self.shift = nn.Linear(condition_dim, dim)

    def forward(self, x: Tensor, cond: Tensor) -> Tensor:
        """Normalise x (B, T, C) and modulate it with cond (B, condition_dim)."""
        y = F.layer_norm(x, (self.dim,), eps=NORM_EPS)
        return torch.addcmul(self.shift(cond)[:, None, :], y, self.scale(cond)[:, None, :])


class ConvNeXtBlock(nn.Module):
    """Depthwise conv (k7) -> norm -> MLP (GELU) -> layer scale, with a residual."""

    def __init__(self, dim: int, intermediate_dim: int, condition_dim: int | None) -> None:
        super().__init__()
        pad = (VOCOS_KERNEL - 1) // 2
        self.dwconv = nn.Conv1d(dim, dim, VOCOS_KERNEL, padding=pad, groups=dim)
        self.norm = (
            AdaLayerNorm(condition_dim, dim) if condition_dim else nn.LayerNorm(dim, eps=NORM_EPS)
        )
        self.pwconv1 = nn.Linear(dim, intermediate_dim)
        self.pwconv2 = nn.Linear(intermediate_dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, cond: Tensor | None, mask: Tensor | None) -> Tensor:
        """x (B, C, T) -> (B, C, T)."""
        y = self.dwconv(masked(x, mask)).transpose(1, 2)  # (B, C, T) -> (B, T, C)
        y = self.norm(y, cond) if cond is not None else self.norm(y)
        y = self.pwconv2(F.gelu(self.pwconv1(y)))
        y = (y * self.gamma).transpose(1, 2)  # (B, T, C) -> (B, C, T)
        return x.add_(y) if _inplace_ok(x) else x + y


class VocosBackbone(nn.Module):
    """Embed conv (k7, ``input_channels`` -> dim) -> norm -> ConvNeXt blocks -> final LayerNorm."""

    def __init__(
        self,
        dim: int,
        intermediate_dim: int,
        num_layers: int,
        condition_dim: int | None = None,
        input_channels: int | None = None,
    ) -> None:
        super().__init__()
        pad = (VOCOS_KERNEL - 1) // 2
        self.embed = nn.Conv1d(input_channels or dim, dim, VOCOS_KERNEL, padding=pad)
        self.norm = (
            AdaLayerNorm(condition_dim, dim) if condition_dim else nn.LayerNorm(dim, eps=NORM_EPS)
        )
        self.convnext = nn.ModuleList(
            ConvNeXtBlock(dim, intermediate_dim, condition_dim) for _ in range(num_layers)
        )
        self.final_layer_norm = nn.LayerNorm(dim, eps=NORM_EPS)

    def forward(self, x: Tensor, cond: Tensor | None, mask: Tensor | None) -> Tensor:
        """x (B, C_in, T) -> (B, T, C)."""
        x = self.embed(masked(x, mask)).transpose(1, 2)  # (B, C, T) -> (B, T, C)
        x = self.norm(x, cond) if cond is not None else self.norm(x)
        x = x.transpose(1, 2)  # (B, T, C) -> (B, C, T)
        for block in self.convnext:
            x = block(x, cond, mask)
        return self.final_layer_norm(x.transpose(1, 2))  # (B, C, T) -> (B, T, C)


class _TripleSkip(nn.Module):
    """The reference's SamplingBlock at ratio 1: conv path and both skips are x, so 3 * x."""

    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, C) -> 3 * x as (B, C, T)."""
        return (x * 3).transpose(1, 2)  # (B, T, C) -> (B, C, T)


def sampling_stages(dim: int, intermediate_dim: int, count: int) -> nn.ModuleList:
    """The reference's ``downsample`` stages at ratio 1: (SamplingBlock, 2-layer backbone) each.

    Shared by the prenet and the semantic encoder; their checkpoint keys are
    ``downsample.{i}.1.*`` (the sampling block has no tensors at ratio 1).
    """
    return nn.ModuleList(
        nn.ModuleList([_TripleSkip(), VocosBackbone(dim, intermediate_dim, DOWNSAMPLE_LAYERS)])
        for _ in range(count)
    )


def run_sampling_stages(stages: nn.ModuleList, x: Tensor, mask: Tensor | None) -> Tensor:
    """x (B, T, C) through ``sampling_stages`` -> (B, T, C)."""
    for skip, backbone in stages:
        x = backbone(skip(x), None, mask)
    return x


class Prenet(nn.Module):
    """Feature decoder: quantized semantic features + speaker vector -> generator input."""

    def __init__(self, cfg: PrenetConfig) -> None:
        super().__init__()
        self.use_tanh_at_final = cfg.use_tanh_at_final
        self.linear_pre = nn.Linear(cfg.input_channels, cfg.vocos_dim)
        dim, inter = cfg.vocos_dim, cfg.vocos_intermediate_dim
        self.downsample = sampling_stages(dim, inter, len(cfg.sample_ratios))
        self.vocos_backbone = VocosBackbone(dim, inter, cfg.vocos_num_layers, cfg.condition_dim)
        self.linear = nn.Linear(cfg.vocos_dim, cfg.out_channels)

    def forward(self, z: Tensor, cond: Tensor, mask: Tensor | None) -> Tensor:
        """z (B, T, input_channels), cond (B, condition_dim) -> (B, out_channels, T)."""
        x = run_sampling_stages(self.downsample, self.linear_pre(z), mask)
        x = self.vocos_backbone(x.transpose(1, 2), cond, mask)  # (B, T, C) -> (B, C, T) in
        x = self.linear(x)
        if self.use_tanh_at_final:
            x = torch.tanh(x)
        return x.transpose(1, 2)  # (B, T, C) -> (B, C, T)


class ResidualUnit(nn.Module):
    """x + conv1(snake(conv7_dilated(snake(x))))."""

    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        pad = dilation * (WAVE_KERNEL - 1) // 2
        self.block = nn.ModuleList(
            [
                Snake1d(dim),
                FoldedConv1d(dim, dim, WAVE_KERNEL, dilation=dilation, padding=pad),
                Snake1d(dim),
                FoldedConv1d(dim, dim, 1),
            ]
        )

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """x (B, C, 1, T) -> (B, C, 1, T), channels-last; mask (B, 1, 1, T)."""
        snake1, conv7, snake2, conv1 = self.block
        y = snake1(x)
        if mask is not None:
            y = y.mul_(mask) if _inplace_ok(y) else y * mask
        y = conv1(snake2(conv7(y), inplace=True))
        return x.add_(y) if _inplace_ok(x) else x + y


class DecoderBlock(nn.Module):
    """Snake -> transposed conv (x rate) -> residual units with dilations 1, 3, 9."""

    def __init__(self, in_dim: int, out_dim: int, kernel: int, rate: int) -> None:
        super().__init__()
        up = FoldedConvTranspose1d(
            in_dim, out_dim, kernel, stride=rate, padding=(kernel - rate) // 2
        )
        units = [ResidualUnit(out_dim, d) for d in RESIDUAL_DILATIONS]
        self.block = nn.ModuleList([Snake1d(in_dim), up, *units])

    def forward(self, x: Tensor, mask_in: Tensor | None, mask_out: Tensor | None) -> Tensor:
        """x (B, C_in, 1, T) -> (B, C_out, 1, T * rate); masks at the input and output rates."""
        snake, up, *units = self.block
        x = up(masked(snake(x), mask_in))
        for unit in units:
            x = unit(x, mask_out)
        return x


class WaveGenerator(nn.Module):
    """Features (B, C, T) at the token rate -> waveform (B, d_out, T * prod(rates)) in [-1, 1]."""

    def __init__(self, cfg: WaveGeneratorConfig) -> None:
        super().__init__()
        pad = (WAVE_KERNEL - 1) // 2
        layers: list[nn.Module] = [
            FoldedConv1d(cfg.input_channel, cfg.channels, WAVE_KERNEL, padding=pad)
        ]
        dims = [cfg.channels // 2**i for i in range(len(cfg.rates) + 1)]
        for i, (rate, kernel) in enumerate(zip(cfg.rates, cfg.kernel_sizes, strict=True)):
            layers.append(DecoderBlock(dims[i], dims[i + 1], kernel, rate))
        layers += [
            Snake1d(dims[-1]),
            FoldedConv1d(dims[-1], cfg.d_out, WAVE_KERNEL, padding=pad),
            nn.Tanh(),
        ]
        self.model = nn.ModuleList(layers)

    @torch.no_grad()
    def channels_last_weights(self) -> None:
        """Re-lay each conv weight in memory so that its 4-D view is channels-last.

        Same values and shapes; oneDNN then uses the weights without a reorder on every call
        (measured up to 1.5x faster per conv). Call once after loading.
        """
        for module in self.modules():
            if isinstance(module, FoldedConv1d | FoldedConvTranspose1d):
                weight = module.weight.data.unsqueeze(2)
                module.weight.data = weight.contiguous(memory_format=torch.channels_last)[:, :, 0]

    def forward(self, x: Tensor, masks: list[Tensor | None]) -> Tensor:
        """x (B, C, T) -> (B, d_out, T * hop).

        ``masks[i]`` (B, 1, T_i) is the padding mask at the input rate of stage i (0: tokens,
        last: samples). Internally the time axis is the width of a height-1 image in
        channels-last memory (see :class:`FoldedConv1d`).
        """
        masks = [None if m is None else m[:, :, None, :] for m in masks]  # (B, 1, 1, T_i)
        x = x[:, :, None, :].contiguous(memory_format=torch.channels_last)  # (B, C, 1, T)
        first, *blocks, snake, last, _ = self.model
        x = first(masked(x, masks[0]))
        for i, block in enumerate(blocks):
            x = block(x, masks[i], masks[i + 1])
        return torch.tanh(last(masked(snake(x, inplace=True), masks[-1])))[:, :, 0, :]

    def forward_span(
        self, x: Tensor, valid: Tensor, keep: tuple[int, int], margins: list[int]
    ) -> Tensor:
        """The samples of tokens ``keep`` only: each stage computes its span plus its own context.

        Equal (to float rounding) to ``forward`` on the same input cropped to those samples, at
        a fraction of its cost: after every time-mixing layer the tensor is cut down to what the
        rest of the generator still needs (``margins``, from ``BiCodecConfig.wave_margins``),
        so the high-rate stages, most of the work, run over little more than the kept span.

        Args:
            x: (B, C, T) generator input at the token rate.
            valid: (B, 2) int64 token range ``[lo, hi)`` of real input per row; outside it the
                input counts as zero padding (a stream edge or the end of a window), as in
                ``forward``'s masks.
            keep: token range ``[a, b)`` whose samples are returned, with ``margins[0]`` tokens
                of input on each side (or padding beyond ``valid``).
            margins: context per crop point, in samples of its rate (see ``wave_margins``).

        Returns:
            (B, d_out, (b - a) * hop) waveform in [-1, 1].
        """
        a, b = keep
        points = iter(margins)
        span = [0, x.shape[-1], 1]  # covered [lo, hi) at the current rate, samples per token
        # Padding of every row (a stream's start, a window's end) is zero at each layer's input
        # as it is past the tensor's edge, so no row needs it computed.
        real = int(valid[:, 0].min()), int(valid[:, 1].max())

        def crop(t: Tensor, rate: int = 1) -> tuple[Tensor, Tensor | None]:
            """Cut t (B, C, 1, W) to the next crop point's span; its padding mask there."""
            span[0], span[1], span[2] = span[0] * rate, span[1] * rate, span[2] * rate
            m, f = next(points), span[2]
            lo = max(span[0], a * f - m, real[0] * f)
            hi = min(span[1], b * f + m, real[1] * f)
            if (lo, hi) != (span[0], span[1]):
                t = t[..., lo - span[0] : hi - span[0]]
                t = t.contiguous(memory_format=torch.channels_last)
                span[0], span[1] = lo, hi
            pos = torch.arange(lo, hi, device=t.device)
            keep_ = (pos >= valid[:, :1] * f) & (pos < valid[:, 1:] * f)  # (B, W)
            mask = None if bool(keep_.all()) else keep_[:, None, None, :].to(t.dtype)
            return t, mask

        x = x[:, :, None, :].contiguous(memory_format=torch.channels_last)  # (B, C, 1, T)
        first, *blocks, snake, last, _ = self.model
        x, mask = crop(x)
        x, mask = crop(first(masked(x, mask)))
        for block in blocks:
            up_snake, up, *units = block.block
            x, mask_out = crop(up(masked(up_snake(x), mask)), up.stride[0])
            for unit in units:
                x, mask_out = crop(unit(x, mask_out))
            mask = mask_out
        wav = torch.tanh(last(masked(snake(x, inplace=True), mask)))[:, :, 0, :]
        f = span[2]
        return wav[..., a * f - span[0] : b * f - span[0]]
