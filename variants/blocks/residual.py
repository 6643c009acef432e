"""The pre-norm residual block: x + Attn(LN x), then x + FF(LN x)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from variants.layers import pre_norm_sublayers


class ResidualBlock(nn.Module):
    """Pre-norm transformer block; autograd stores every sublayer's activations for backward.

    x (batch, seq_len, d_model) -> (batch, seq_len, d_model). `options` are those of
    `variants.layers.pre_norm_sublayers` (attention, attention_options, ff_mult, dropout,
    ff_chunks, causal, shared_qk, max_seq_len).
    """

    name = "residual"

    def __init__(self, d_model: int, n_heads: int, **options: Any):
        super().__init__()
        self.attn, self.ff = pre_norm_sublayers(d_model, n_heads, **options)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, L, d_model) -> (B, L, d_model)."""
        x = x + self.attn(x)  # (B, L, d_model)
        return x + self.ff(x)  # (B, L, d_model)


def sequential_stack(blocks: list[nn.Module]) -> nn.Module:
    """Blocks applied one after another: (B, L, d_model) -> (B, L, d_model)."""
    return nn.Sequential(*blocks)
