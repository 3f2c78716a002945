"""ECAPA-TDNN (the BiCodec speaker encoder's front), latent output only.

Mel frames -> conv (k5) -> three SE-Res2Blocks (dilations 2, 3, 4) -> their outputs concatenated
-> conv 1x1 -> ReLU: the frame-level latent the perceiver reads. The reference also pools the
latent into an x-vector (``pool``, ``bn``, ``linear``); that head feeds nothing BiCodec uses, so it
is not built and its checkpoint tensors are never read. Letters: B batch, C channels (512),
T mel frames. Every BatchNorm here runs in inference form (running statistics).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: Channels of each block (the reference's ``ECAPA_TDNN_GLOB_c512``).
ECAPA_CHANNELS = 512
#: Kernel of the first conv (padding keeps T).
FIRST_KERNEL = 5
#: Kernel and dilation of the Res2 convs of the three SE-Res2Blocks.
RES2_KERNEL = 3
RES2_DILATIONS = (2, 3, 4)
#: Res2Net scale: channels are split in this many groups, all but the last convolved in a chain.
RES2_SCALE = 8
#: Width of the squeeze-excitation bottleneck.
SE_BOTTLENECK = 128
#: Latent channels: the three blocks' outputs concatenated (3 * 512), kept at 1536.
LATENT_CHANNELS = 3 * ECAPA_CHANNELS
#: BatchNorm epsilon (torch's default, as in the reference).
BN_EPS = 1e-5


class BatchNorm(nn.Module):
    """BatchNorm1d in inference form: ``(x - running_mean) / sqrt(running_var + eps) * w + b``."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))

    def forward(self, x: Tensor) -> Tensor:
        """x (B, C, T) -> (B, C, T)."""
        return F.batch_norm(
            x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, BN_EPS
        )


class ConvReluBn(nn.Module):
    """Conv1d -> ReLU -> BatchNorm (the reference's order)."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel: int = 1, dilation: int = 1
    ) -> None:
        super().__init__()
        pad = dilation * (kernel - 1) // 2
        self.conv = nn.Conv1d(in_channels, out_channels, kernel, padding=pad, dilation=dilation)
        self.bn = BatchNorm(out_channels)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, C_in, T) -> (B, C_out, T)."""
        return self.bn(F.relu(self.conv(x)))


class Res2Conv(nn.Module):
    """Res2Net layer: C split in ``scale`` groups, chained convs, the last group passed through.

    Group i < scale - 1 is convolved (then ReLU, BatchNorm) after adding the previous group's
    output; the last group is kept as it is.
    """

    def __init__(self, channels: int, kernel: int, dilation: int, scale: int) -> None:
        super().__init__()
        if channels % scale:
            raise ValueError(f"Res2 channels {channels} not divisible by scale {scale}")
        self.width = channels // scale
        pad = dilation * (kernel - 1) // 2
        self.convs = nn.ModuleList(
            nn.Conv1d(self.width, self.width, kernel, padding=pad, dilation=dilation)
            for _ in range(scale - 1)
        )
        self.bns = nn.ModuleList(BatchNorm(self.width) for _ in range(scale - 1))

    def forward(self, x: Tensor) -> Tensor:
        """x (B, C, T) -> (B, C, T)."""
        groups = torch.split(x, self.width, dim=1)
        outs = []
        y = groups[0]
        for i, (conv, bn) in enumerate(zip(self.convs, self.bns, strict=True)):
            y = bn(F.relu(conv(y if i == 0 else y + groups[i])))
            outs.append(y)
        outs.append(groups[-1])
        return torch.cat(outs, dim=1)


class SqueezeExcite(nn.Module):
    """Scale each channel by a gate computed from the time-averaged channels."""

    def __init__(self, channels: int, bottleneck: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(channels, bottleneck)
        self.linear2 = nn.Linear(bottleneck, channels)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, C, T) -> (B, C, T)."""
        gate = torch.sigmoid(self.linear2(F.relu(self.linear1(x.mean(dim=2)))))  # (B, C)
        return x * gate[:, :, None]


class SERes2Block(nn.Module):
    """x + SE(conv1x1(Res2(conv1x1(x)))), each conv followed by ReLU and BatchNorm."""

    def __init__(self, channels: int, dilation: int) -> None:
        super().__init__()
        self.se_res2block = nn.Sequential(
            ConvReluBn(channels, channels),
            Res2Conv(channels, RES2_KERNEL, dilation, RES2_SCALE),
            ConvReluBn(channels, channels),
            SqueezeExcite(channels, SE_BOTTLENECK),
        )

    def forward(self, x: Tensor) -> Tensor:
        """x (B, C, T) -> (B, C, T)."""
        return x + self.se_res2block(x)


class EcapaTdnn(nn.Module):
    """Mel frames (B, T, n_mels) -> frame-level speaker latent (B, 1536, T)."""

    def __init__(self, n_mels: int) -> None:
        super().__init__()
        c = ECAPA_CHANNELS
        self.layer1 = ConvReluBn(n_mels, c, FIRST_KERNEL)
        self.layer2 = SERes2Block(c, RES2_DILATIONS[0])
        self.layer3 = SERes2Block(c, RES2_DILATIONS[1])
        self.layer4 = SERes2Block(c, RES2_DILATIONS[2])
        self.conv = nn.Conv1d(3 * c, LATENT_CHANNELS, 1)

    def forward(self, mels: Tensor) -> Tensor:
        """mels (B, T, n_mels) -> latent (B, 1536, T)."""
        x1 = self.layer1(mels.transpose(1, 2))  # (B, T, M) -> (B, M, T) -> (B, C, T)
        x2 = self.layer2(x1)
        x3 = self.layer3(x2)
        x4 = self.layer4(x3)
        return F.relu(self.conv(torch.cat([x2, x3, x4], dim=1)))
