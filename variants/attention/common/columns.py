"""The column layout of a strided pattern, shared by strided and combined attention.

Viewing a sequence as (L / s, s) rows and taking its columns puts every (i - j) mod s == 0 pair
of positions in one column, so the strided part of a pattern is a dense attention along each
column (`to_columns`, undone by `from_columns`); `stride_at` is the stride at a length.
"""

from __future__ import annotations

import math

import torch

from variants.attention.common.base import pad_to_multiple


def stride_at(stride: int | str, seq_len: int) -> int:
    """`stride`, or round(sqrt(seq_len)) (at least 1) if it is 'auto'."""
    return max(1, round(math.sqrt(seq_len))) if stride == "auto" else stride


def to_columns(x: torch.Tensor, stride: int) -> torch.Tensor:
    """(B, H, L, E) -> (B*H, s, rows, E), rows = ceil(L / s): column c holds positions c, c + s,
    ... (zero-padded to rows * s), so (i - j) mod s == 0 pairs are the pairs of one column. A
    view of x when L is a multiple of s."""
    x = pad_to_multiple(x, stride)
    return x.unflatten(2, (-1, stride)).transpose(2, 3).flatten(0, 1)


def from_columns(x: torch.Tensor, batch: int, heads: int) -> torch.Tensor:
    """(B*H, s, rows, E) -> (B, H, rows * s, E): undo `to_columns` (a view; padding kept)."""
    x = x.unflatten(0, (batch, heads)).transpose(2, 3)  # (B, H, rows, s, E)
    return x.flatten(2, 3)
