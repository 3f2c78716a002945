"""Perceiver resampler: a variable-length latent sequence -> a fixed number of learned queries.

``num_latents`` learned vectors cross-attend (keys and values over the latents themselves plus
the projected context), then pass a GEGLU feed-forward, each with a residual, ``depth`` times;
an RMSNorm closes. Letters: B batch, T context steps, L latents (32), D model width
(``latent_dim``), H heads, E head width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: Blocks of cross-attention + feed-forward (the reference's default).
PERCEIVER_DEPTH = 2
#: Attention heads and their width (inner width H * E = 512, whatever D is).
PERCEIVER_HEADS = 8
PERCEIVER_HEAD_DIM = 64
#: Feed-forward expansion: the GEGLU's inner width is ``int(D * mult * 2 / 3)``.
FF_MULT = 4


class CrossAttention(nn.Module):
    """Multi-head attention of the latents over [latents; context] (no bias, no norm)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        inner = PERCEIVER_HEADS * PERCEIVER_HEAD_DIM
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_kv = nn.Linear(dim, 2 * inner, bias=False)
        self.to_out = nn.Linear(inner, dim, bias=False)

    def _heads(self, x: Tensor) -> Tensor:
        """(B, S, H * E) -> (B, H, S, E)."""
        return x.unflatten(-1, (PERCEIVER_HEADS, PERCEIVER_HEAD_DIM)).transpose(1, 2)

    def forward(self, latents: Tensor, context: Tensor) -> Tensor:
        """latents (B, L, D), context (B, T, D) -> (B, L, D)."""
        k, v = self.to_kv(torch.cat([latents, context], dim=1)).chunk(2, dim=-1)  # (B, L+T, HE)
        out = F.scaled_dot_product_attention(
            self._heads(self.to_q(latents)), self._heads(k), self._heads(v)
        )  # (B, H, L, E), scaled by 1 / sqrt(E)
        return self.to_out(out.transpose(1, 2).flatten(2))


class GEGLU(nn.Module):
    """Split the last dim in (value, gate) halves: value * GELU(gate)."""

    def forward(self, x: Tensor) -> Tensor:
        """x (..., 2 I) -> (..., I)."""
        value, gate = x.chunk(2, dim=-1)
        return F.gelu(gate) * value


class FeedForward(nn.Sequential):
    """Linear (D -> 2 I) -> GEGLU -> Linear (I -> D); indices 0 and 2 as in the checkpoint."""

    def __init__(self, dim: int) -> None:
        inner = int(dim * FF_MULT * 2 / 3)
        super().__init__(nn.Linear(dim, 2 * inner), GEGLU(), nn.Linear(inner, dim))


class RMSNorm(nn.Module):
    """x / ||x|| * sqrt(D) * gamma over the last dim."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = dim**0.5
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        """x (..., D) -> (..., D)."""
        return F.normalize(x, dim=-1) * self.scale * self.gamma


class PerceiverResampler(nn.Module):
    """Context (B, T, context_dim) -> L latents (B, L, D)."""

    def __init__(self, dim: int, context_dim: int, num_latents: int) -> None:
        super().__init__()
        self.proj_context = nn.Linear(context_dim, dim)
        self.latents = nn.Parameter(torch.zeros(num_latents, dim))
        self.layers = nn.ModuleList(
            nn.ModuleList([CrossAttention(dim), FeedForward(dim)]) for _ in range(PERCEIVER_DEPTH)
        )
        self.norm = RMSNorm(dim)

    def forward(self, context: Tensor) -> Tensor:
        """context (B, T, context_dim) -> (B, L, D)."""
        x = self.proj_context(context)
        latents = self.latents.expand(x.shape[0], -1, -1)
        for attention, feed_forward in self.layers:
            latents = attention(latents, x) + latents
            latents = feed_forward(latents) + latents
        return self.norm(latents)
