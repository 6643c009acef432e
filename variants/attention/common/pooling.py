"""Block summaries shared by compressed attention, MoBA and NSA."""

from __future__ import annotations

import torch

from variants.attention.common.base import pad_to_multiple


def block_mean(x: torch.Tensor, factor: int) -> torch.Tensor:
    """Mean over each block of `factor` real positions: (B, H, L, D) -> (B, H, C, D)."""
    length = x.shape[2]
    blocks = pad_to_multiple(x, factor).unflatten(2, (-1, factor))  # (B, H, C, f, D)
    starts = torch.arange(0, length, factor, device=x.device)  # (C,)
    real_counts = (length - starts).clamp(max=factor).to(x.dtype)  # (C,) only the last may be < f
    return blocks.sum(dim=3) / real_counts[:, None]  # (B, H, C, D)
