"""Strided attention (Sparse Transformer): a local window plus every stride-th earlier key."""

from __future__ import annotations

import math

import torch

from variants.attention.base import Attention, masked_attend, pad_to_multiple
from variants.attention.local import from_blocks, key_windows, to_blocks, window_mask
from variants.registry import register_attention


@register_attention
class StridedAttention(Attention):
    """Sparse Transformer strided pattern: the last `stride` keys plus every stride-th key.

    Query i attends to key j if (i - j) mod stride == 0 (the strided part) or if j is one of the
    `stride` nearest positions (the local part): i - stride < j <= i when causal, |i - j| < stride
    otherwise; causal also drops every j > i from the strided part. With stride ~ sqrt(L) every
    earlier position is reachable in two hops for O(L sqrt(L)) work. `stride="auto"` picks
    round(sqrt(L)) per call. Each part is computed on its own layout, without any (L, L) tensor:
    the local part as a sliding window of blocks of `stride`, the strided part by viewing the
    sequence as (L / stride, stride) and attending along each column; the two are merged with
    their logsumexps. The query itself belongs to both parts and is counted in the local one only.
    """

    name = "strided"
    exact = False
    time_complexity = "O(L sqrt(L) d)"
    memory_complexity = "O(L sqrt(L))"

    def __init__(self, *, causal: bool = False, stride: int | str = "auto"):
        super().__init__(causal=causal)
        if stride != "auto" and (
            isinstance(stride, bool) or not isinstance(stride, int) or stride <= 0
        ):
            raise ValueError(
                f"{self.name}: option 'stride' must be a positive integer or 'auto', got {stride!r}"
            )
        self.stride = stride

    def stride_for(self, seq_len: int) -> int:
        """The stride used at `seq_len`: the option, or round(sqrt(seq_len)) if it is 'auto'."""
        if self.stride == "auto":
            return max(1, round(math.sqrt(seq_len)))
        return self.stride

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        seq_len = q.shape[2]
        # A stride beyond L gives the same pattern as stride L (the local part already covers
        # every pair), without padding the sequence to the larger multiple.
        stride = min(self.stride_for(seq_len), seq_len)
        local_out, local_lse = self._local(q, k, v, stride)  # (B, H, L, D), (B, H, L)
        column_out, column_lse = self._columns(q, k, v, stride)  # (B, H, L, D), (B, H, L)
        # softmax over the union of two disjoint key sets, from the softmax over each: the local
        # part always holds the query itself, so `lse` is finite and rows without strided keys
        # (lse -inf) get weight 0.
        lse = torch.logaddexp(local_lse, column_lse)  # (B, H, L)
        local_weight = torch.exp(local_lse - lse).unsqueeze(-1)  # (B, H, L, 1)
        column_weight = torch.exp(column_lse - lse).unsqueeze(-1)  # (B, H, L, 1)
        return local_weight * local_out + column_weight * column_out  # (B, H, L, D)

    def _local(self, q, k, v, stride: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Softmax over the stride nearest keys (self included): out (B, H, L, D), lse (B, H, L)."""
        # Blocks of `stride` with one neighbour block on each allowed side cover the window
        # |i - j| < stride; the mask trims the window to exactly that.
        seq_len, fwd = q.shape[2], 0 if self.causal else 1
        q_blocks = to_blocks(q, stride)  # (B, H, n, s, D)
        k_windows = key_windows(k, stride, 1, fwd)  # (B, H, n, w*s, D)
        v_windows = key_windows(v, stride, 1, fwd)  # (B, H, n, w*s, D)
        mask = window_mask(
            seq_len, stride, 1, fwd, causal=self.causal, max_distance=stride - 1, device=q.device
        )  # (n, s, w*s)
        out, lse = masked_attend(q_blocks, k_windows, v_windows, mask)  # (B, H, n, s, [D])
        return from_blocks(out, seq_len), from_blocks(lse, seq_len)

    def _columns(self, q, k, v, stride: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Softmax over the keys a multiple of `stride` away (self excluded): out, lse."""
        # Position r * stride + c sits in row r, column c of the (rows, stride) view, so the
        # keys at a multiple of `stride` from a query are exactly the other entries of its column.
        seq_len = q.shape[2]
        q_cols, k_cols, v_cols = (
            pad_to_multiple(x, stride).unflatten(2, (-1, stride)).transpose(2, 3) for x in (q, k, v)
        )  # (B, H, s, m, D) each, m = ceil(L / s) rows
        rows = q_cols.shape[3]
        row = torch.arange(rows, device=q.device)
        # Self is left to the local part; causal keeps only earlier rows of the column.
        pair_ok = row[None, :] < row[:, None] if self.causal else row[None, :] != row[:, None]
        position = torch.arange(rows * stride, device=q.device).view(rows, stride).T  # (s, m)
        real_key = (position < seq_len)[:, None, :]  # (s, 1, m)
        mask = pair_ok & real_key  # (s, m, m)
        out, lse = masked_attend(q_cols, k_cols, v_cols, mask)  # (B, H, s, m, [D])
        out = out.transpose(2, 3).flatten(2, 3)[:, :, :seq_len]  # (B, H, L, D)
        lse = lse.transpose(2, 3).flatten(2, 3)[:, :, :seq_len]  # (B, H, L)
        return out, lse

    def flops(self, batch: int, heads: int, seq_len: int, head_dim: int) -> int:
        stride = min(self.stride_for(seq_len), seq_len)
        before = torch.arange(seq_len, dtype=torch.int64)  # positions before query i
        if self.causal:
            local = before.clamp(max=stride - 1) + 1
            strided = before // stride
        else:
            after = seq_len - 1 - before  # positions after query i
            local = before.clamp(max=stride - 1) + after.clamp(max=stride - 1) + 1
            strided = before // stride + after // stride
        pairs = int((local + strided).sum())
        return 4 * batch * heads * pairs * head_dim

    def extra_repr(self) -> str:
        return f"causal={self.causal}, stride={self.stride}"
