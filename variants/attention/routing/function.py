"""Routing attention's autograd function: sorted chunks attend over their windows on the
fused kernels, and the backward is their flash backward given the saved output and logsumexp."""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from variants.attention.common import flash
from variants.attention.common.base import norm_floor
from variants.attention.routing.cluster_windows import (
    chunk_ranges,
    sorted_rows,
    window_bias,
    window_views,
)


class ClusterWindowAttention(torch.autograd.Function):
    """Shared-QK attention of sorted chunks over their windows, each query limited to its run.

    Forward: q and v are sorted into rows with a chunk of zero rows in front (and behind, when
    not causal), so that every chunk's window (previous chunk, own chunk[, next chunk]) is a
    strided view; keys are the unit rows. A few chunks at a time (`chunk_ranges`) the fused
    kernel attends with `window_bias`, and the outputs go back to position order. The
    backward is the flash backward of every range given the saved output and logsumexp, with
    the window gradients added back onto the rows they view and the key role's gradient taken
    through the normalisation. Saves the sorted rows, the output, logsumexp and the offsets.
    """

    @staticmethod
    def forward(ctx, q, v, order_rows, slot_rows, low, high, m, causal, documents=None):
        """q, v: (S, Lp, D) in position order; order_rows, slot_rows: (S*Lp,); low, high:
        (S, Lp) key offsets of each sorted query; m: chunk length; documents: a
        `WindowDocuments` (the forward's masks) or None. Returns o (S, Lp, D)."""
        n_seq, padded, head_dim = q.shape
        windows = 2 if causal else 3
        q_rows, v_rows = (sorted_rows(x, order_rows, m, windows) for x in (q, v))
        norm = q_rows.norm(dim=-1, keepdim=True).clamp_min_(norm_floor(q_rows.dtype))  # (S, R, 1)
        unit = q_rows / norm  # (S, R, D), R = (C + W - 1) m rows
        out = q.new_empty(n_seq, padded, head_dim)  # sorted order
        lse = None
        for s, chunks in chunk_ranges(n_seq, padded, m, windows, q.element_size()):
            query, keys, values = window_views(q_rows[s], unit[s], v_rows[s], chunks, m, windows)
            allowed = None if documents is None else documents.allowed(s, chunks)
            bias = window_bias(low[s], high[s], norm[s], chunks, m, windows, q.dtype, allowed)
            out_c, lse_c = flash.attend(query, keys, values, bias=bias, scale=1.0)
            rows = slice(chunks.start * m, chunks.stop * m)
            out[s, rows] = out_c.reshape(-1, head_dim)
            if lse is None:
                lse = lse_c.new_empty(n_seq, padded)
            lse[s, rows] = lse_c.reshape(-1)
        del unit, norm  # recomputed by the backward; not held while the result is gathered
        ctx.m, ctx.windows, ctx.documents = m, windows, documents
        ctx.save_for_backward(q_rows, v_rows, order_rows, slot_rows, low, high, out, lse)
        return out.view(-1, head_dim).index_select(0, slot_rows).view(n_seq, padded, head_dim)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        q_rows, v_rows, order_rows, slot_rows, low, high, out, lse = ctx.saved_tensors
        m, windows, documents = ctx.m, ctx.windows, ctx.documents
        n_seq, padded, head_dim = out.shape
        grad_sorted = grad_out.reshape(-1, head_dim).index_select(0, order_rows)
        grad_sorted = grad_sorted.view(n_seq, padded, head_dim)
        norm = q_rows.norm(dim=-1, keepdim=True).clamp_min_(norm_floor(q_rows.dtype))  # (S, R, 1)
        unit = q_rows / norm
        grad_q, grad_unit, grad_v = (torch.zeros_like(q_rows) for _ in range(3))  # (S, R, D)
        for s, chunks in chunk_ranges(n_seq, padded, m, windows, q_rows.element_size()):
            query, keys, values = window_views(q_rows[s], unit[s], v_rows[s], chunks, m, windows)
            allowed = None if documents is None else documents.allowed(s, chunks)
            bias = window_bias(low[s], high[s], norm[s], chunks, m, windows, q_rows.dtype, allowed)
            rows = slice(chunks.start * m, chunks.stop * m)
            shape = query.shape  # (1, c, m, D)
            grad_query, grad_keys, grad_values = flash.attend_backward(
                grad_sorted[s, rows].view(shape),
                query,
                keys,
                values,
                out[s, rows].view(shape),
                lse[s, rows].view(shape[:-1]),
                bias=bias,
                scale=1.0,
            )  # (1, c, m, D), (1, c, W*m, D) twice
            grad_q[s, m + rows.start : m + rows.stop] += grad_query.reshape(-1, head_dim)
            for w in range(windows):  # window w of chunk c views rows (c + w) m ..
                piece = slice(rows.start + w * m, rows.stop + w * m)
                part = slice(w * m, (w + 1) * m)
                grad_unit[s, piece] += grad_keys[0, :, part].reshape(-1, head_dim)
                grad_v[s, piece] += grad_values[0, :, part].reshape(-1, head_dim)
        del grad_sorted
        # unit = q / |q|: the key role's gradient loses its radial part, divided by |q|.
        radial = torch.linalg.vecdot(grad_unit, unit).unsqueeze(-1)  # (S, R, 1), no (S, R, D)
        grad_q += grad_unit.sub_(unit.mul_(radial)).div_(norm)
        # Free the (S, R, D) temporaries before the gathers below allocate the results: at
        # 2^20 tokens each is 1 GiB, and this was the step's peak.
        del grad_unit, unit, radial
        own = slice(m, m + padded)  # the sorted rows, without the zero chunks around them
        grads = []
        for grad in (grad_q, grad_v):
            grads.append(grad[:, own].reshape(-1, head_dim).index_select(0, slot_rows))
        grad_q, grad_v = (g.view(n_seq, padded, head_dim) for g in grads)
        return grad_q, grad_v, None, None, None, None, None, None, None
