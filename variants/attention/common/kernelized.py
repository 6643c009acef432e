"""Attention through feature maps: the normalised linear attention `linear` and `performer` share.

Given non-negative features phi(q_i), phi(k_j) (width E) of the queries and keys,

    out_i = phi(q_i)^T S_i / phi(q_i)^T z_i,   S_i = sum_j phi(k_j) v_j^T,   z_i = sum_j phi(k_j)

with j over all positions, or j <= i when causal; the values get a column of ones, v' = [v, 1],
so one state S' = sum_j phi(k_j) v'_j^T (E x (D+1)) holds both S and z. Non-causal, S' is one
matmul. Causal, `causal_product` works in chunks of CHUNK positions (dense within a chunk, a
running state across them, groups of chunks vectorised within STATE_BYTES), and its backward is
three more such products: never more than O(L (E + D)) plus one group of states is held.
Grouped KV heads are taken as they are: the G query heads of a group read their KV head's
states.

The chunked products and grouped heads in full: docs/variants/common.md, "Feature-map attention".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Positions per chunk: the intra-chunk scores cost CHUNK (E + D) multiply-adds per position,
# the states and their read-out 2 E D. 32, 64 and 128 measured within the (loaded) machine's
# noise of each other at 32K for performer and linear shapes; 64 keeps the triangle's work
# below the states' for E >= D = 64.
CHUNK = 64
# Bytes of one group's chunk states (and their cumulative sum), the largest temporary.
STATE_BYTES = 4 * 2**20


def feature_attention(
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    denominator_eps: float | torch.Tensor = 0.0,
) -> torch.Tensor:
    """Normalised linear attention over feature maps (formula in the module docstring).

    phi_q: (B, H, L, E) and phi_k: (B, H_kv, L, E), non-negative; v: (B, H_kv, L, D), H_kv
    dividing H (grouped KV heads: docs/variants/common.md). Returns (B, H, L, D) in v's dtype.
    `denominator_eps` (a number, or a tensor broadcasting to (B, H_kv, 1, 1)): added to every
    feature of the key sum z_i in the denominator only (phi(q_i)^T (z_i + eps)), as
    performer-pytorch's causal path. A row whose denominator
    still underflows to 0 (every weight 0) gives 0, never NaN: the denominator is clamped at the
    dtype's smallest normal number, where the numerator is 0 too.
    """
    batch, kv_heads, length, head_dim = v.shape
    heads = phi_q.shape[1]
    group = heads // kv_heads
    values = torch.cat([v, v.new_ones(batch, kv_heads, length, 1)], dim=-1)  # (B, H_kv, L, D+1)
    if causal:
        # (S, G, L, *) for the queries, (S, 1, L, *) for keys and values; S = B*H_kv
        a = phi_q.reshape(batch * kv_heads, group, length, -1)
        b, c = (x.flatten(0, 1).unsqueeze(1) for x in (phi_k, values))
        numerator = CausalProduct.apply(a, b, c).view(batch, heads, length, head_dim + 1)
    else:
        state = phi_k.transpose(-1, -2) @ values  # (B, H_kv, E, D+1)
        rows = phi_q.reshape(batch, kv_heads, group * length, -1)  # (B, H_kv, G*L, E)
        numerator = (rows @ state).view(batch, heads, length, head_dim + 1)  # (B, H, L, D+1)
    out, denominator = numerator.split([head_dim, 1], dim=-1)  # (B, H, L, D), (B, H, L, 1)
    if isinstance(denominator_eps, torch.Tensor) and denominator_eps.dim() == 4:
        denominator_eps = denominator_eps.repeat_interleave(group, 1)  # per KV head -> per head
    return out / padded_denominator(denominator, phi_q, denominator_eps)


def padded_denominator(
    denominator: torch.Tensor, phi_q: torch.Tensor, eps: float | torch.Tensor
) -> torch.Tensor:
    """phi(q)^T z + eps * sum(phi(q)) (= phi(q)^T (z + eps)), clamped at the smallest normal
    number. denominator: (B, H, L, 1); phi_q: (B, H, L, E)."""
    if not isinstance(eps, torch.Tensor) and eps == 0:
        padded = denominator
    else:
        padded = denominator + eps * phi_q.sum(dim=-1, keepdim=True).to(denominator.dtype)
    return padded.clamp_min(torch.finfo(denominator.dtype).tiny)


def causal_product(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, *, reverse: bool = False
) -> torch.Tensor:
    """out_{g,i} = sum_h sum_{j <= i} (a_{g,i} . b_{h,j}) c_{h,j}, or over j >= i with
    `reverse`; no autograd.

    a: (S, G_a, L, E); b: (S, G_b, L, E); c: (S, G_b, L, F): G_a heads read the sums over G_b
    heads (grouped KV heads: G_a = G, G_b = 1 forward; the reverse in the backward). Returns
    (S, G_a, L, F). Chunked as docs/variants/common.md says:
    O(L CHUNK (E + F) + L E F) time, temporaries within STATE_BYTES (one chunk at least).
    One sequence at a time, so that every group of chunks is a contiguous block and the batched
    matmuls run on it (and on its transposes) in place: slices across sequences made the
    matmuls copy their operands, which took as long as the matmuls.

    Runs in float32 (or float64 if an input is) with autocast off, and returns c's dtype: a
    running sum over thousands of positions loses most of its digits in a half type, and
    autocast would hand the in-place products operands of another type than their outputs.
    """
    out_dtype = c.dtype
    work = torch.promote_types(torch.promote_types(a.dtype, b.dtype), torch.float32)
    with torch.autocast(a.device.type, enabled=False):
        out = _causal_product(a.to(work), b.to(work), c.to(work), reverse=reverse)
    return out.to(out_dtype)


def _causal_product(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, *, reverse: bool
) -> torch.Tensor:
    n_seq, reading, length, width = a.shape
    summed, out_width = b.shape[1], c.shape[-1]
    pad = -length % CHUNK
    if pad:
        # Zero rows: as keys and values they add nothing, as queries their outputs are dropped.
        a, b, c = (F.pad(x, (0, 0, 0, pad)) for x in (a, b, c))
    n_chunks = (length + pad) // CHUNK
    # (S, G_*, C, n, *) each
    a, b, c = (x.reshape(n_seq, x.shape[1], n_chunks, CHUNK, x.shape[-1]) for x in (a, b, c))
    out = c.new_empty(n_seq, reading, n_chunks, CHUNK, out_width)  # (S, G_a, C, n, F)
    per_group = max(1, STATE_BYTES // (width * out_width * c.element_size()))
    groups = [slice(g, min(g + per_group, n_chunks)) for g in range(0, n_chunks, per_group)]
    for s in range(n_seq):
        carry = c.new_zeros(width * out_width)  # the states of the chunks already done
        for group in reversed(groups) if reverse else groups:
            b_g, c_g = b[s, :, group], c[s, :, group]  # (G_b, Cg, n, *), each head contiguous
            size = b_g.shape[1]
            own = torch.bmm(b_g[0].transpose(-1, -2), c_g[0]).view(size, -1)  # (Cg, E*F)
            for h in range(1, summed):
                own.view(size, width, out_width).baddbmm_(b_g[h].transpose(-1, -2), c_g[h])
            # Each chunk's predecessors (successors, in reverse) in the group, plus the carry.
            before = own.flip(0).cumsum(0).flip(0) if reverse else own.cumsum(0)  # inclusive
            total = before[0] if reverse else before[-1]
            carry_next = carry + total
            before.sub_(own).add_(carry)
            carry = carry_next
            before = before.view(size, width, out_width)  # (Cg, E, F)
            for g in range(reading):
                a_g = a[s, g, group]  # (Cg, n, E) contiguous
                out_g = out[s, g, group]  # (Cg, n, F) view
                torch.bmm(a_g, before, out=out_g)
                for h in range(summed):
                    scores = torch.bmm(a_g, b_g[h].transpose(-1, -2))  # (Cg, n, n)
                    scores = scores.triu_() if reverse else scores.tril_()
                    out_g.baddbmm_(scores, c_g[h])
    return out.view(n_seq, reading, -1, out_width)[:, :, :length]


class CausalProduct(torch.autograd.Function):
    """out_i = sum_{j <= i} (a_i . b_j) c_j with gradients by three more causal products:

        da_i = sum_{j <= i} (g_i . c_j) b_j     db_j = sum_{i >= j} (c_j . g_i) a_i
        dc_j = sum_{i >= j} (b_j . a_i) g_i

    for g the gradient of out (each summed over the heads of the other side, `causal_product`).
    Saves a, b, c only.
    """

    @staticmethod
    def forward(ctx, a, b, c):
        """a: (S, G_a, L, E); b: (S, G_b, L, E); c: (S, G_b, L, F) -> (S, G_a, L, F)."""
        ctx.save_for_backward(a, b, c)
        return causal_product(a, b, c)

    @staticmethod
    def backward(ctx, grad_out):
        a, b, c = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_a = causal_product(grad_out, c, b) if ctx.needs_input_grad[0] else None
        grad_b = causal_product(c, grad_out, a, reverse=True) if ctx.needs_input_grad[1] else None
        grad_c = causal_product(b, a, grad_out, reverse=True) if ctx.needs_input_grad[2] else None
        return grad_a, grad_b, grad_c


def feature_flops(batch: int, heads: int, seq_len: int, features: int, head_dim: int) -> int:
    """Useful forward FLOPs of `feature_attention`: building the state S' and reading it out,
    2 x 2 B H L E (D+1), causal or not (the causal chunks' triangle replaces the per-position
    read-out of a running state, an implementation choice, so it is not counted again)."""
    return 4 * batch * heads * seq_len * features * (head_dim + 1)
