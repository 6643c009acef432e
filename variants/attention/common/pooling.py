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


def real_block_mean(x: torch.Tensor, factor: int, attention_mask: torch.Tensor | None):
    """Mean over each block of `factor` positions of its real ones (`attention_mask` (B, L)
    True, or every position if None): (B, H, L, D) -> (B, H, C, D), and the real positions'
    count per block, (B, C) in x's dtype. A block with no real position has mean 0."""
    weight = real_weight(attention_mask, x.shape[0], x.shape[2], x.dtype, x.device)  # (B, L)
    weighted = x * weight[:, None, :, None]  # (B, H, L, D)
    sums = pad_to_multiple(weighted, factor).unflatten(2, (-1, factor)).sum(dim=3)
    counts = block_counts(weight, factor)  # (B, C)
    return sums / counts.clamp(min=1)[:, None, :, None], counts


def real_weight(attention_mask, batch, length, dtype, device) -> torch.Tensor:
    """(B, L) 1 at real positions, 0 at padding (every position real if the mask is None)."""
    if attention_mask is None:
        return torch.ones(batch, length, dtype=dtype, device=device)
    return attention_mask.to(dtype)


def block_counts(weight: torch.Tensor, factor: int) -> torch.Tensor:
    """(B, L) -> (B, C): the sum of `weight` over each block of `factor` positions."""
    return pad_to_multiple(weight[:, None], factor).unflatten(2, (-1, factor)).sum(dim=3)[:, 0]


def piece_mean(
    x: torch.Tensor, factor: int, attention_mask: torch.Tensor | None, segment_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """At every position, the mean of x over the real positions of its piece: the run of
    positions sharing its block of `factor` and its document (`segment_ids` (B, L),
    non-decreasing). (B, H, L, D) -> (B, H, L, D), and the piece's real count at every
    position, (B, L) in x's dtype; a piece with no real position has mean 0."""
    batch, heads, length, dim = x.shape
    new = torch.zeros(batch, length, dtype=torch.bool, device=x.device)
    new[:, ::factor] = True
    new[:, 1:] |= segment_ids[:, 1:] != segment_ids[:, :-1]
    piece = new.cumsum(dim=1) - 1  # (B, L): pieces numbered in position order
    n_pieces = int(piece[:, -1].max()) + 1
    flat = (piece + n_pieces * torch.arange(batch, device=x.device)[:, None]).reshape(-1)
    weight = real_weight(attention_mask, batch, length, x.dtype, x.device).reshape(-1)
    weighted = x.transpose(0, 1).reshape(heads, -1, dim) * weight[:, None]  # (H, B*L, D)
    sums = x.new_zeros(heads, batch * n_pieces, dim).index_add_(1, flat, weighted)
    counts = weight.new_zeros(batch * n_pieces).index_add_(0, flat, weight)[flat]  # (B*L,)
    means = sums[:, flat] / counts.clamp(min=1)[:, None]  # (H, B*L, D)
    return means.view(heads, batch, length, dim).transpose(0, 1), counts.view(batch, length)
