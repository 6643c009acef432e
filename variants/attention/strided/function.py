"""Strided attention's kernel: the pattern's two disjoint parts (`strided_parts`) and
`LocalAndColumns`, the local windows and the columns attended apart and merged by their
logsumexps, forward and backward (an autograd function; `StridedParts` lays them out)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from variants import patterns
from variants.attention.common import flash
from variants.attention.common.base import pad_to_multiple
from variants.attention.common.columns import from_columns, to_columns
from variants.attention.common.local import sum_windows, to_blocks, window_mask, windows_of
from variants.attention.common.masking import document_mask


def strided_parts(stride: int, causal: bool) -> tuple[patterns.Pattern, patterns.Pattern]:
    """The two disjoint parts of the strided pattern: the band of the `stride` nearest keys
    (with the query itself) and the other stride-th keys, each intersected with `Causal` if
    causal."""
    local = patterns.Band(stride)
    columns = patterns.Strided(stride) & ~patterns.Band(stride)  # the band holds i == j
    if causal:
        return local & patterns.Causal(), columns & patterns.Causal()
    return local, columns


class LocalAndColumns(torch.autograd.Function):
    """Strided attention as two attentions over disjoint keys, merged by their logsumexps.

    local    blocks of s queries against windows of the previous (and, unmasked, the next)
             block: (B*H, n, s, D) against (B*H, n, w*s, D), with a (1, n, s, w*s) bias shared
             by batch and heads that keeps the s nearest keys (and drops missing edge keys).
    columns  position r*s + c is row r of column c: (B*H, s, rows, D). Causally row r sees the
             earlier rows, which is a plain causal attention of rows 1.. against rows ..-2 (no
             mask tensor); unmasked, every other real row, with a (1, s, rows, rows) bias.
    Both run on the fused kernels where available (`flash`); the backward runs each part's
    attention backward given the merged output and logsumexp, so no (L, L) tensor and no
    scores are saved: O(L sqrt(L)) time; memory O(L d) plus the two biases (L * w*s and
    s * rows^2 = L * rows entries, O(L sqrt(L)) each, shared by batch and heads; causal
    columns need none).
    """

    @staticmethod
    def forward(ctx, q, k, v, stride, causal, attention_mask=None, segment_ids=None):
        """q: (B, H, L, D); k, v: (B, H_kv, L, D), H_kv dividing H (grouped heads: query
        head h reads key head h // (H / H_kv), never repeated); stride s <= L;
        attention_mask, segment_ids: (B, L) or None (`masking.document_mask`, folded into
        both parts' biases, which are then per sequence). Returns (B, H, L, D)."""
        parts = StridedParts(q, stride, causal, attention_mask, segment_ids, k.shape[1])
        local_out, local_lse = flash.attend(*parts.local_inputs(q, k, v), **parts.local_options)
        out = parts.from_blocks(local_out)  # (B, H, Lp, D)
        lse = parts.from_blocks(local_lse.unsqueeze(-1))  # (B, H, Lp, 1)
        if parts.rows > 1:
            column_out, column_lse = flash.attend(
                *parts.column_inputs(q, k, v), **parts.column_options
            )  # (B*H, s, rows', D), (B*H, s, rows')
            column_out = parts.from_columns(column_out)  # (B, H, Lp', D), Lp' = rows' * s
            column_lse = parts.from_columns(column_lse.unsqueeze(-1))  # (B, H, Lp', 1)
            # Into the rows that have column keys, views of out and lse.
            flash.merge_into(parts.queried(out), parts.queried(lse), column_out, column_lse)
        ctx.parts = parts
        ctx.save_for_backward(q, k, v, out, lse)
        return out[:, :, : q.shape[2]]  # (B, H, L, D)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        parts = ctx.parts
        grad_out = pad_to_multiple(grad_out, parts.stride).contiguous()  # (B, H, Lp, D)
        grad_q, grad_k, grad_v = parts.local_backward(
            flash.attend_backward(
                parts.to_blocks(grad_out),
                *parts.local_inputs(q, k, v),
                parts.to_blocks(out),
                parts.to_blocks(lse).squeeze(-1),
                **parts.local_options,
            )
        )  # (B, H, L, D) each
        if parts.rows > 1:
            column_grads = parts.column_backward(
                flash.attend_backward(
                    parts.query_columns(grad_out),
                    *parts.column_inputs(q, k, v),
                    parts.query_columns(out),
                    parts.query_columns(lse).squeeze(-1),
                    **parts.column_options,
                )
            )  # (B, H, L, D) each
            for grad, column_grad in zip((grad_q, grad_k, grad_v), column_grads, strict=True):
                grad += column_grad
        return grad_q, grad_k, grad_v, None, None, None, None


class StridedParts:
    """The layouts of `LocalAndColumns`' two parts and the moves between them and positions.

    Positions are (B, H, Lp, E) with Lp = rows * s, L zero-padded; `queried` and the column
    layouts cover only the rows that have column keys (rows 1.. causally, all unmasked).

    The parts' 4-D layouts put blocks (or columns) on the fused kernels' head axis and the
    sequences' heads in their batch, (B*H, M, ., E), so one bias is shared by batch and heads.
    With grouped heads (k of H_kv < H heads) the heads must be the kernels' head axis, where
    they map query head h to key head h // (H / H_kv) (`flash.attend`): the layout is then
    (B*M, H or H_kv, ., E), a view at batch 1, and the bias (B*M or M, 1, ., .).
    """

    def __init__(
        self,
        q: torch.Tensor,
        stride: int,
        causal: bool,
        attention_mask: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
        kv_heads: int | None = None,
    ):
        self.batch, self.heads, self.length, head_dim = q.shape
        self.stride, self.causal = stride, causal
        self.grouped = kv_heads not in (None, self.heads)
        self.rows = -(-self.length // stride)
        self.look_forward = 0 if causal else 1
        scale = head_dim**-0.5
        masks = {"attention_mask": attention_mask, "segment_ids": segment_ids}
        masked = attention_mask is not None or segment_ids is not None
        local, columns = strided_parts(stride, causal)
        allowed = window_mask(
            local, self.length, stride, 1, self.look_forward, device=q.device, **masks
        )  # (n, s, w*s), or (B, n, s, w*s) with masks
        self.local_options = {"scale": scale, "bias": self._bias(~allowed, q.dtype)}
        if causal and not masked:
            # Row r of a column against the rows before it: `columns` (i - j a positive
            # multiple of s) in the layout `column_inputs` sets up, with the kernels' own
            # causal flag and no mask tensor (the tests check it against the pattern).
            self.column_options = {"scale": scale, "causal": True}
            return
        row = torch.arange(self.rows, device=q.device)
        position = row[None, :] * stride + torch.arange(stride, device=q.device)[:, None]
        if causal:  # the layout of `column_inputs`: queries rows 1.., keys rows ..-2
            query, key = position[:, 1:, None], position[:, None, :-1]  # (s, r, 1), (s, 1, r)
        else:
            query, key = position[:, :, None], position[:, None, :]  # (s, rows, 1), (s, 1, rows)
        allowed = columns.allows(query, key) & (key < self.length)  # (s, rows', rows_k)
        if masked:
            allowed = allowed & document_mask(attention_mask, segment_ids, query, key)
        # A query row may now have no column key at all: its finite logsumexp weighs 0 in the
        # merge (`flash.masked_score`), and its local part always holds the query itself.
        self.column_options = {"scale": scale, "bias": self._bias(~allowed, q.dtype)}

    def _bias(self, hidden: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The additive bias of a part from its hidden pairs: (1, ...) shared by batch and
        heads, or, for a per-sequence (B, ...) mask, (B*H, ...) in the parts' batch layout
        (grouped: (M, 1, ., .) repeated over the batch, or (B*M, 1, ., .))."""
        bias = flash.hidden_bias(hidden, dtype)
        if self.grouped:
            if hidden.dim() == 3:
                bias = bias[None].expand(self.batch, *bias.shape)  # (B, M, ., .)
            return bias.flatten(0, 1)[:, None]  # (B*M, 1, ., .)
        if hidden.dim() == 3:
            return bias[None]  # (1, n or s, ., .)
        return bias[:, None].expand(self.batch, self.heads, *bias.shape[1:]).flatten(0, 1)

    def _batched(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, M, ., E) -> the parts' 4-D layout: (B*N, M, ., E), grouped (B*M, N, ., E)."""
        if self.grouped:
            return x.transpose(1, 2).flatten(0, 1)
        return x.flatten(0, 1)

    def _unbatched(self, x: torch.Tensor) -> torch.Tensor:
        """The parts' 4-D layout -> (B, N, M, ., E), N the heads it holds (H or H_kv)."""
        if self.grouped:
            return x.unflatten(0, (self.batch, -1)).transpose(1, 2)
        return x.unflatten(0, (self.batch, -1))

    # --- local part ---------------------------------------------------------------------------
    def to_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, Lp or L, E) -> (B*H, n, s, E) (grouped: (B*n, H, s, E))."""
        return self._batched(to_blocks(x, self.stride))

    def from_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """(B*H, n, s, E) (grouped: (B*n, H, s, E)) -> (B, H, Lp, E)."""
        if self.grouped:
            return self._unbatched(x).flatten(2, 3)
        return x.reshape(self.batch, self.heads, -1, x.shape[-1])

    def local_inputs(self, q, k, v):
        """Query blocks (B*H, n, s, D) and key and value windows (B*H_kv, n, w*s, D)
        (grouped: (B*n, H or H_kv, ., D))."""
        windows = (self._batched(windows_of(x, self.stride, 1, self.look_forward)) for x in (k, v))
        return self.to_blocks(q), *windows

    def local_backward(self, grads):
        """Gradients of the local inputs back to positions: (B, H, L, D) each."""
        grad_q, grad_k, grad_v = grads
        grad_q = self.from_blocks(grad_q)[:, :, : self.length]
        layout = (self.length, self.stride, 1, self.look_forward)
        grad_k, grad_v = (sum_windows(self._unbatched(g), *layout) for g in (grad_k, grad_v))
        return grad_q.contiguous(), grad_k.contiguous(), grad_v.contiguous()

    # --- columns ------------------------------------------------------------------------------
    def columns(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, L or Lp, E) -> (B*H, s, rows, E) view: column c holds positions c, c+s, ...
        (grouped: (B*s, H, rows, E))."""
        if self.grouped:
            return self._batched(to_columns(x, self.stride).unflatten(0, (self.batch, -1)))
        return to_columns(x, self.stride)

    def query_columns(self, x: torch.Tensor) -> torch.Tensor:
        """The queries' column layout (B*H, s, rows', E): rows 1.. causally, else all."""
        columns = self.columns(x)
        return (columns[:, :, 1:] if self.causal else columns).contiguous()

    def column_inputs(self, q, k, v):
        """Queries (B*H, s, rows', D); keys and values of the same rows' layout: causally the
        rows before the last, so that row r's keys are rows < r under a plain causal mask."""
        keys = (self.columns(x) for x in (k, v))
        if self.causal:
            keys = (x[:, :, :-1] for x in keys)
        return self.query_columns(q), *(x.contiguous() for x in keys)

    def from_columns(self, x: torch.Tensor) -> torch.Tensor:
        """(B*N, s, rows', E) (grouped: (B*s, N, rows', E)) -> (B, N, rows' * s, E), the
        positions of `queried`; N the heads x holds (H, or H_kv for keys' gradients)."""
        if self.grouped:
            return from_columns(self._unbatched(x).flatten(0, 1), self.batch, x.shape[1])
        return from_columns(x, self.batch, x.shape[0] // self.batch)

    def queried(self, x: torch.Tensor) -> torch.Tensor:
        """The positions with column keys, as a view of (B, H, Lp, E): from row 1 causally."""
        return x[:, :, self.stride :] if self.causal else x

    def column_backward(self, grads):
        """Gradients of the column inputs back to positions: (B, H, L, D) each."""
        grad_q, grad_k, grad_v = (self.from_columns(g) for g in grads)  # (B, H, rows' * s, D)
        if self.causal:  # queries were rows 1.., keys rows ..-2
            pad_q, pad_kv = (self.stride, 0), (0, self.stride)
            grad_q = F.pad(grad_q, (0, 0, *pad_q))
            grad_k, grad_v = (F.pad(g, (0, 0, *pad_kv)) for g in (grad_k, grad_v))
        return tuple(g[:, :, : self.length] for g in (grad_q, grad_k, grad_v))
