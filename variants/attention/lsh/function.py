"""LSH's autograd function: every sorted chunk attends to its window, one round at a time, and
the rounds are combined by their logsumexps; the backward is a flash backward per round given
the combined output and logsumexp, so nothing per round is saved.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from variants.attention.common import flash
from variants.attention.common.base import norm_floor
from variants.attention.common.buffers import ScratchBuffer, chunk_pieces, sequence_slices
from variants.attention.lsh.bucket_windows import SortedRound, WindowGradient, window_bias
from variants.attention.lsh.masks import RoundMasks, round_mask


class RoundsWindowAttention(torch.autograd.Function):
    """Every sorted chunk attends to its window (previous chunk, itself); rounds combined.

    Forward: per round, the sequence is sorted, each chunk's m queries attend over their
    window's keys with the additive `window_bias`, giving out_r and lse_r, which go back to
    position order and are folded into the running combination o = sum_r softmax_r(lse_r) out_r
    (the online-softmax update, one round at a time). Keys are the unit-normalised queries and
    scores q . k_hat (shared QK, no 1/sqrt(d)).

    Backward without a per-round softmax: o is a softmax over the union of the rounds' windows,
    so every pair's probability is exp(score - LSE) with the combined LSE = logsumexp_r lse_r,
    and the gradient of each round is a standard attention backward given the *combined* o and
    LSE (the flash-attention form: dS = P (dO V^T - rowsum(dO * o))).

    Memory: both directions work on slices of one round of a few sequences (`sequence_slices`),
    sorting them on the fly, so no sorted copy of the R rounds is held or saved: only q, v (in
    position order), their norms, the sort orders, the combined output and LSE and the uint8
    mask are saved. The
    windows are strided views of the sorted keys and values, gathered with the last chunk in
    front (`SortedRound.with_previous`), never m x 2m copies.
    On CPU the fused flash kernels run both directions (measured 1.5-2x faster than explicit
    matmul + softmax passes); elsewhere the explicit path of `flash.attend` does.
    """

    @staticmethod
    def forward(ctx, q, v, hidden, order, slot, m):
        """q, v: (S, Lp, D) in position order, S = B*H; hidden: uint8 (S, R, C, m or 1, W*m) keys
        a query must not see, a `RoundMasks` that builds them per slice and round, or None;
        order: (S, R, Lp) position at each sorted slot; slot: (S, R, Lp) sorted slot of each
        position; m: chunk length. Returns o (S, Lp, D)."""
        n_seq, rounds, padded = order.shape
        # Row gathers and the `out=` writes below want dense rows; one copy here, if any.
        q, v = q.contiguous(), v.contiguous()
        norm = q.norm(dim=-1, keepdim=True).clamp_min_(norm_floor(q.dtype))  # (S, Lp, 1)
        combined = torch.empty_like(q)  # (S, Lp, D)
        total_lse = None  # (S, Lp, 1), in the dtype the kernels return
        bias_buffer = ScratchBuffer(q)
        for part in sequence_slices(q, m, n_chunks=padded // m):
            for r in range(rounds):
                sorted_round = SortedRound(order[part, r], slot[part, r], m)
                q_rows = sorted_round.with_previous(q[part])  # (s, (W-1)*m + Lp, D)
                v_rows = sorted_round.with_previous(v[part])  # (s, (W-1)*m + Lp, D)
                norm_rows = sorted_round.with_previous(norm[part])  # (s, (W-1)*m + Lp, 1)
                unit_rows = q_rows * norm_rows.reciprocal()  # as in backward
                norm_r = sorted_round.own(norm_rows)  # (s, C, m, 1)
                q_r = sorted_round.own(q_rows)  # (s, C, m, D)
                keys, values = sorted_round.windows(unit_rows), sorted_round.windows(v_rows)
                bias = bias_buffer.view((*q_r.shape[:-1], keys.shape[2]))  # (s, C, m, W*m)
                window_bias(round_mask(hidden, part, r), norm_r, out=bias)
                out_r, lse_r = flash.attend(q_r, keys, values, bias=bias, scale=1.0)  # (s,C,m,[D])
                del keys, values, unit_rows
                unsort = sorted_round.unsort
                if r == 0:
                    unsort(out_r, out=combined[part])  # (s, Lp, D)
                    lse = unsort(lse_r.unsqueeze(-1))  # (s, Lp, 1)
                    continue
                # The online softmax over rounds: no difference of lse values is exponentiated
                # at more than ~2|q| + SELF_MARGIN (a self-only row), so float32 keeps its digits.
                lse_r = unsort(lse_r.unsqueeze(-1))  # (s, Lp, 1)
                flash.merge_into(combined[part], lse, unsort(out_r), lse_r)
            if total_lse is None:
                total_lse = lse.new_empty(*q.shape[:-1], 1)
            total_lse[part] = lse
        ctx.m = m
        # A RoundMasks (above MASK_BYTES) is kept as it is: it rebuilds the masks in backward.
        ctx.masks = hidden if isinstance(hidden, RoundMasks) else None
        if ctx.masks is not None:
            hidden = None
        ctx.save_for_backward(q, v, norm, hidden, order, slot, combined, total_lse)
        return combined  # (S, Lp, D)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_combined):
        q, v, norm, hidden, order, slot, combined, total_lse = ctx.saved_tensors
        if ctx.masks is not None:
            hidden = ctx.masks
        m, rounds = ctx.m, order.shape[1]
        grad_combined = grad_combined.contiguous()
        grad_q, grad_v = torch.empty_like(q), torch.empty_like(v)  # (S, Lp, D) each
        bias_buffer = ScratchBuffer(q)
        for part in sequence_slices(q, m, n_chunks=q.shape[1] // m):
            for r in range(rounds):
                sorted_round = SortedRound(order[part, r], slot[part, r], m)
                q_rows = sorted_round.with_previous(q[part])  # (s, (W-1)*m + Lp, D)
                v_rows = sorted_round.with_previous(v[part])  # (s, (W-1)*m + Lp, D)
                norm_rows = sorted_round.with_previous(norm[part])  # (s, (W-1)*m + Lp, 1)
                inv_norm_rows = norm_rows.reciprocal()
                unit_rows = q_rows * inv_norm_rows  # (s, (W-1)*m + Lp, D)
                q_r, unit = sorted_round.own(q_rows), sorted_round.own(unit_rows)  # (s,C,m,D)
                norm_r, inv_norm = sorted_round.own(norm_rows), sorted_round.own(inv_norm_rows)
                grad_out = sorted_round.sort(grad_combined[part])  # (s, C, m, D)
                out = sorted_round.sort(combined[part])  # (s, C, m, D)
                lse = sorted_round.sort(total_lse[part]).squeeze(-1)  # (s, C, m)
                keys, values = sorted_round.windows(unit_rows), sorted_round.windows(v_rows)
                hidden_r = round_mask(hidden, part, r)
                grad_unit, grad_v_r = WindowGradient(unit), WindowGradient(unit)
                grad_q_parts = []
                for chunks in chunk_pieces(q_r.shape, keys.shape[2], q.element_size()):
                    bias = bias_buffer.view((*q_r[:, chunks].shape[:-1], keys.shape[2]))
                    hidden_c = None if hidden_r is None else hidden_r[:, chunks]
                    window_bias(hidden_c, norm_r[:, chunks], out=bias)  # (s, c, m, W*m)
                    grad_q_c, grad_keys, grad_values = flash.attend_backward(
                        grad_out[:, chunks],
                        q_r[:, chunks],
                        keys[:, chunks],
                        values[:, chunks],
                        out[:, chunks],
                        lse[:, chunks],
                        bias=bias,
                        scale=1.0,
                    )  # (s, c, m, D), (s, c, W*m, D) twice
                    grad_q_parts.append((chunks, grad_q_c))
                    grad_unit.add(grad_keys, chunks)
                    grad_v_r.add(grad_values, chunks)
                del grad_out, out, grad_keys, grad_values
                grad_unit, grad_v_r = grad_unit.result(), grad_v_r.result()  # (s, C, m, D)
                # unit = q / |q|: the key role's gradient loses its radial part, divided by |q|.
                radial = (grad_unit * unit).sum(dim=-1, keepdim=True)  # (s, C, m, 1)
                tangent = grad_unit.sub_(unit.mul_(radial))  # (s, C, m, D)
                grad_q_r = torch.empty_like(tangent)  # (s, C, m, D)
                for chunks, grad_q_c in grad_q_parts:
                    torch.addcmul(
                        grad_q_c, tangent[:, chunks], inv_norm[:, chunks], out=grad_q_r[:, chunks]
                    )
                del grad_q_parts
                if r == 0:
                    sorted_round.unsort(grad_q_r, out=grad_q[part])
                    sorted_round.unsort(grad_v_r, out=grad_v[part])
                else:
                    grad_q[part] += sorted_round.unsort(grad_q_r)
                    grad_v[part] += sorted_round.unsort(grad_v_r)
        return grad_q, grad_v, None, None, None, None
