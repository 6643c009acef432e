"""Routing attention's layout: positions sorted by (cluster, position), each sorted query's
run of keys, the chunks' overlapping windows of rows and the score bias that hides keys outside
a query's run; cut into ranges of chunks whose windows stay within `common.buffers.PIECE_BYTES`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from variants.attention.common import buffers, flash
from variants.attention.common.buffers import index_dtype
from variants.attention.common.flash import SELF_MARGIN
from variants.attention.common.masking import SequenceDocuments


class ClusterLayout:
    """The sort by (cluster, position) and each sorted query's run of keys.

    clusters: (B, H, L); positions L..Lp-1 (padding) form an extra last cluster of their own,
    so no real query sees them. Attributes, over S = B*H sequences of Lp sorted slots:
    order_rows (S*Lp,) the row (of the flattened (S*Lp, D) inputs) at each sorted slot;
    slot_rows (S*Lp,) the sorted slot of each row; low, high (S, Lp) the first and last key of
    each sorted query, as offsets from the query's own slot (low <= 0 <= high).
    """

    def __init__(self, clusters, n_clusters: int, padded: int, window: int, causal: bool):
        batch, heads, length = clusters.shape
        device = clusters.device
        clusters = F.pad(clusters, (0, padded - length), value=n_clusters).flatten(0, 1)  # S, Lp
        positions = torch.arange(padded, device=device)
        # Clusters <= K and positions < Lp: one argsort orders by cluster, then position.
        order = (clusters * padded + positions).argsort(dim=-1)  # (S, Lp)
        slot = torch.empty_like(order).scatter_(-1, order, positions.expand_as(order))
        start = torch.arange(clusters.shape[0], device=device).unsqueeze(-1) * padded  # (S, 1)
        self.order_rows = (order + start).view(-1)
        self.slot_rows = (slot + start).view(-1)
        # Each sorted slot's cluster run [first, last].
        members = torch.zeros(clusters.shape[0], n_clusters + 1, dtype=torch.long, device=device)
        members.scatter_add_(-1, clusters, torch.ones_like(clusters))  # (S, K+1)
        ends = members.cumsum(dim=-1)  # (S, K+1) one past each cluster's last slot
        sorted_clusters = clusters.gather(-1, order)  # (S, Lp)
        first = (ends - members).gather(-1, sorted_clusters) - positions  # (S, Lp), <= 0
        last = ends.gather(-1, sorted_clusters) - 1 - positions  # (S, Lp), >= 0
        offsets = index_dtype(3 * min(window, padded))  # window_bias compares up to 2m away
        self.low = first.clamp_min(1 - window).to(offsets)
        self.high = (torch.zeros_like(last) if causal else last.clamp_max(window - 1)).to(offsets)


def sorted_rows(x: torch.Tensor, order_rows: torch.Tensor, m: int, windows: int) -> torch.Tensor:
    """(S, Lp, D) in position order -> (S, (C + W - 1) m, D): sorted, one chunk of zero rows in
    front (and W - 2 behind), so that chunk c's window starts at row c m."""
    n_seq, padded, head_dim = x.shape
    rows = x.new_zeros(n_seq, padded + (windows - 1) * m, head_dim)
    sorted_x = x.reshape(-1, head_dim).index_select(0, order_rows).view(n_seq, padded, head_dim)
    rows[:, m : m + padded] = sorted_x
    return rows


def chunk_ranges(n_seq: int, padded: int, m: int, windows: int, element_size: int):
    """(sequence, range of chunks) pairs whose score bias, c m (W m) floats, stays within
    PIECE_BYTES (one chunk at least), in order."""
    n_chunks = padded // m
    per_range = max(1, buffers.PIECE_BYTES // (m * windows * m * element_size))
    for s in range(n_seq):
        for start in range(0, n_chunks, per_range):
            yield s, slice(start, min(start + per_range, n_chunks))


def window_views(q_rows, unit_rows, v_rows, chunks: slice, m: int, windows: int):
    """One sequence's rows (R, D) -> the queries (1, c, m, D) of `chunks` and their windows'
    keys and values (1, c, W m, D), strided views without copies."""
    head_dim = q_rows.shape[-1]
    n = chunks.stop - chunks.start
    first = chunks.start * m
    query = q_rows[m + first : m + first + n * m].view(1, n, m, head_dim)

    def window(rows):
        stride = rows.stride(0)
        return rows.as_strided(
            (1, n, windows * m, head_dim),
            (0, m * stride, stride, rows.stride(1)),
            rows.storage_offset() + first * stride,
        )

    return query, window(unit_rows), window(v_rows)


class WindowDocuments:
    """Which keys of each chunk's window a sorted query may attend as far as documents and
    padding go (`masking.document_mask` on the positions the window rows hold), laid out as
    `window_bias`'s.

    documents: the forward's masks over the S sequences; order_rows: `ClusterLayout`'s (S*Lp,).
    """

    def __init__(self, documents: SequenceDocuments, order_rows, padded: int, m: int, windows):
        n_seq = order_rows.numel() // padded
        start = torch.arange(n_seq, device=order_rows.device).unsqueeze(-1) * padded  # (S, 1)
        positions = order_rows.view(n_seq, padded) - start  # (S, Lp) position at each slot
        # Laid out as `sorted_rows`; the zero rows read position 0, outside every query's run.
        self.positions = F.pad(positions, (m, (windows - 2) * m))  # (S, (C + W - 1) m)
        self.documents, self.m, self.windows = documents, m, windows

    def allowed(self, s: int, chunks: slice) -> torch.Tensor:
        """Bool (c, m, W m): sequence s's `chunks`, their queries against their windows' keys."""
        m, rows = self.m, self.positions[s]
        first, n = chunks.start * m, chunks.stop - chunks.start
        query = rows[m + first : m + first + n * m].view(1, n, m, 1)
        key = rows.unfold(0, self.windows * m, m)[chunks].view(1, n, 1, -1)  # window c: c m ..
        return self.documents.allowed(slice(s, s + 1), query, key)[0]


def window_bias(
    low, high, norm, chunks: slice, m: int, windows: int, dtype, allowed=None
) -> torch.Tensor:
    """Additive bias (1, c, m, W m) of one sequence's `chunks`: `flash.masked_score` on keys
    outside each query's run [low, high] (offsets from its slot, (Lp,) each) or not `allowed`
    ((c, m, W m) bool, `WindowDocuments`, or None), and on the query's own key
    -(2 |q| + SELF_MARGIN), so it attends to itself only when alone (as LSH's `window_bias`:
    |q . k_hat| <= |q| for every other key). norm: (R, 1) row norms."""
    rows = slice(chunks.start * m, chunks.stop * m)
    n = chunks.stop - chunks.start
    offsets = low.dtype
    # Key t of chunk row i's window sits at offset t - m - i from the query's slot.
    relative = torch.arange(windows * m, device=low.device, dtype=offsets) - m
    relative = relative - torch.arange(m, device=low.device, dtype=offsets).unsqueeze(-1)
    low_c = low[rows].view(n, m, 1)
    high_c = high[rows].view(n, m, 1)
    hidden = (relative < low_c) | (relative > high_c)  # (c, m, W m)
    if allowed is not None:
        hidden |= ~allowed
    bias = flash.hidden_bias(hidden, dtype)
    own_norm = norm[m + rows.start : m + rows.stop].view(n, m)
    bias[:, :, m : 2 * m].diagonal(dim1=-2, dim2=-1).copy_(own_norm.mul(-2).sub_(SELF_MARGIN))
    return bias.unsqueeze(0)
