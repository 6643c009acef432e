"""The pre-norm residual block: x + Attn(LN x), then x + FF(LN x)."""

from __future__ import annotations

import torch
from torch import nn

from variants.config import ModelConfig
from variants.layers import pre_norm_sublayers


class ResidualBlock(nn.Module):
    """Pre-norm transformer block; autograd stores every sublayer's activations for backward.

    x (batch, seq_len, d_model) -> (batch, seq_len, d_model); its sublayers are the
    `ModelConfig`'s (`variants.layers.pre_norm_sublayers`).
    """

    name = "residual"

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attn, self.ff = pre_norm_sublayers(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, L, d_model) -> (B, L, d_model)."""
        x = x + self.attn(x)  # (B, L, d_model)
        return x + self.ff(x)  # (B, L, d_model)


def sequential_stack(blocks: list[nn.Module]) -> nn.Module:
    """Blocks applied one after another: (B, L, d_model) -> (B, L, d_model)."""
    return nn.Sequential(*blocks)
