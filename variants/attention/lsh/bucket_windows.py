"""One LSH round's layout: positions sorted by bucket, cut into chunks of m, each chunk's window
(the previous chunk, then its own; the first chunk's previous is the last), the gradient of
those windows, and the additive score bias over a window.

Windows are strided views of rows gathered with the last chunk in front, never m x 2m copies;
every move is a row gather.
"""

from __future__ import annotations

import torch

from variants.attention.common import flash
from variants.attention.common.flash import SELF_MARGIN


class SortedRound:
    """The sort and unsort of one round of s sequences, for (s, Lp, E) tensors.

    order, slot: (s, Lp) position at each sorted slot and sorted slot of each position. All
    moves are row gathers: the gradient flows by gathering too, never by a scatter (on CPU
    PyTorch's index_add and scatter_add took 15 % of LSH's forward+backward at 4K, far more
    than gathers of the same rows).
    """

    def __init__(self, order: torch.Tensor, slot: torch.Tensor, m: int):
        n_seq, padded = order.shape
        self.n_seq, self.padded, self.m, self.n_chunks = n_seq, padded, m, padded // m
        start = torch.arange(n_seq, device=order.device).unsqueeze(-1) * padded  # (s, 1)
        sorted_rows = order + start  # (s, Lp)
        self.sorted_rows = sorted_rows.view(-1)  # (s*Lp,)
        self.position_rows = (slot + start).view(-1)  # (s*Lp,)
        # The last chunk's rows first: the previous chunk of the first chunk (wrap-around).
        if self.n_chunks > 1:
            sorted_rows = torch.cat([sorted_rows[:, -m:], sorted_rows], dim=1)  # (s, (C+1)*m)
        self.window_rows = sorted_rows.reshape(-1)  # (s * ((W-1)*m + Lp),)

    def sort(self, x: torch.Tensor) -> torch.Tensor:
        """(s, Lp, E) -> (s, C, m, E) in the round's sorted order."""
        rows = x.reshape(-1, x.shape[-1]).index_select(0, self.sorted_rows)  # (s*Lp, E)
        return rows.view(self.n_seq, self.n_chunks, self.m, x.shape[-1])

    def with_previous(self, x: torch.Tensor) -> torch.Tensor:
        """(s, Lp, E) -> (s, (W-1)*m + Lp, E): sorted, the last chunk repeated in front, the
        layout `own` and `windows` view, so the windows need no copy of their own."""
        rows = x.reshape(-1, x.shape[-1]).index_select(0, self.window_rows)
        return rows.view(self.n_seq, -1, x.shape[-1])

    def own(self, rows: torch.Tensor) -> torch.Tensor:
        """`with_previous` rows -> (s, C, m, E), each chunk's own rows (a view)."""
        return rows[:, -self.padded :].unflatten(1, (self.n_chunks, self.m))

    def windows(self, rows: torch.Tensor) -> torch.Tensor:
        """`with_previous` rows -> (s, C, W*m, E), each chunk's window: the previous chunk then
        its own (W = 1 with a single chunk), as `window_view` lays them out, without its copy."""
        if self.n_chunks == 1:
            return self.own(rows)
        return overlapping_windows(rows, self.n_chunks, self.m)

    def unsort(self, y: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """(s, C, m, E) -> (s, Lp, E) back in position order, into `out` if given."""
        flat = y.reshape(-1, y.shape[-1])  # (s*Lp, E)
        if out is None:
            return flat.index_select(0, self.position_rows).view(self.n_seq, self.padded, -1)
        return torch.index_select(flat, 0, self.position_rows, out=out.view(-1, y.shape[-1]))


def window_view(x: torch.Tensor) -> torch.Tensor:
    """Each chunk's keys: (G, C, m, E) -> (G, C, W*m, E), the previous chunk then its own.

    The previous chunk of a row's first is the row's last (wrap-around); with one chunk W = 1.
    A strided view of one copy of x with the last chunk prepended (see `overlapping_windows`).
    """
    n_chunks, m = x.shape[1], x.shape[2]
    if n_chunks == 1:
        return x
    flat = x.flatten(1, 2)  # (G, C*m, E)
    return overlapping_windows(torch.cat([flat[:, -m:], flat], dim=1), n_chunks, m)


def window_keys(x: torch.Tensor) -> torch.Tensor:
    """Per-row values (..., C, m) -> (..., C, 1, W*m), each chunk's window keys' values as
    `window_view` lays them out, ready to compare against the chunk's queries (..., C, m, 1)."""
    lead, (n_chunks, m) = x.shape[:-2], x.shape[-2:]
    windows = window_view(x.reshape(-1, n_chunks, m, 1))  # (G, C, W*m, 1)
    return windows.reshape(*lead, n_chunks, 1, -1)


def overlapping_windows(rows: torch.Tensor, n_chunks: int, m: int) -> torch.Tensor:
    """(G, (C+1)*m, E) rows, the last chunk's first, -> (G, C, 2m, E): window c is rows
    c*m .. c*m + 2m, a strided view, so consecutive windows share memory instead of being
    2m-row copies."""
    groups, _, width = rows.shape
    group_stride, row_stride, col_stride = rows.stride()
    return rows.as_strided(
        (groups, n_chunks, 2 * m, width),
        (group_stride, m * row_stride, row_stride, col_stride),
        rows.storage_offset(),
    )


class WindowGradient:
    """The gradient of rows (G, C, m, D) from the gradients of their windows, added one range of
    chunks at a time: the gradient of `window_view`, for window gradients that come in pieces.

    Chunk c's rows are the own half of window c and the previous half of window c + 1 (window
    0's previous half is the last chunk's). Ranges must come in order and cover 0 .. C once.
    """

    def __init__(self, like: torch.Tensor):
        self.grad = torch.empty_like(like)  # (G, C, m, D)
        self.n_chunks = like.shape[1]
        self.wrapped = None  # window 0's previous half, for the last chunk, which comes last

    def add(self, grad_windows: torch.Tensor, chunks: slice) -> None:
        """grad_windows: (G, c, W*m, D), the windows of `chunks` (a range start:stop)."""
        start, stop = chunks.start, chunks.stop
        if self.n_chunks == 1:
            self.grad.copy_(grad_windows)
            return
        previous, own = grad_windows.chunk(2, dim=2)  # (G, c, m, D) each; previous[:, i] is i-1's
        torch.add(own[:, :-1], previous[:, 1:], out=self.grad[:, start : stop - 1])
        self.grad[:, stop - 1].copy_(own[:, -1])
        if start == 0:
            self.wrapped = previous[:, 0].clone()  # not a view: the piece can go
        else:
            self.grad[:, start - 1] += previous[:, 0]

    def result(self) -> torch.Tensor:
        if self.wrapped is not None:
            self.grad[:, -1] += self.wrapped
            self.wrapped = None
        return self.grad


def window_bias(
    hidden: torch.Tensor | None, norm: torch.Tensor, *, out: torch.Tensor
) -> torch.Tensor:
    """Additive score bias laid out as `window_view`'s keys, written into `out` (G, c, m, W*m),
    a float tensor of norm's dtype.

    flash.masked_score where `hidden` ((G, c, m or 1, W*m), uint8) hides a key; on a token's
    score for itself -(2 |q| + SELF_MARGIN), which puts it SELF_MARGIN below the lowest score
    any other key can have (|q . k_hat| <= |q|): a token attends to itself only when it has no
    other key, with no precision lost to a huge constant. norm: (G, c, m, 1), the queries' |q|.
    """
    m = out.shape[2]
    bias = out.zero_() if hidden is None else flash.hidden_bias(hidden, out.dtype, out=out)
    own = bias[..., -m:]  # (G, C, m, m) view: the own chunk is the window's last
    own.diagonal(dim1=-2, dim2=-1).copy_(norm.squeeze(-1).mul(-2).sub_(SELF_MARGIN))
    return bias
