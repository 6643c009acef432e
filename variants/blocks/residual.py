"""The pre-norm residual block: x + Attn(LN x), then x + FF(LN x)."""

from __future__ import annotations

import torch
from torch import nn


class ResidualBlock(nn.Module):
    """Pre-norm transformer block; autograd stores every sublayer's activations for backward.

    x (batch, seq_len, d_model) -> (batch, seq_len, d_model); `attn` and `ff` are its
    pre-normed sublayers (`variants.layers.pre_norm_sublayers`), built by the model.
    """

    name = "residual"

    def __init__(self, attn: nn.Module, ff: nn.Module):
        super().__init__()
        self.attn, self.ff = attn, ff

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, L, d_model) -> (B, L, d_model)."""
        x = x + self.attn(x)  # (B, L, d_model)
        return x + self.ff(x)  # (B, L, d_model)


def sequential_stack(blocks: list[nn.Module]) -> nn.Module:
    """Blocks applied one after another: (B, L, d_model) -> (B, L, d_model)."""
    return nn.Sequential(*blocks)
