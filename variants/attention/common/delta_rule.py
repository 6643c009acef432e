"""The delta rule's kernel, with or without a decay (deltanet, gated_deltanet):
`chunked_delta_rule`, the chunked WY / UT form (docs/variants/deltanet.md derives it; the decay
is folded in as flash-linear-attention's chunk_gated_delta_rule), through which autograd runs.
`delta_rule_flops`: its useful multiply-adds."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def chunked_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    chunk: int,
    log_decay: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The delta rule's outputs in the chunked WY / UT form (module docstring), and its final
    state M = S^T.

    q, k: (*S, L, D) unit rows; v: (*S, L, D); beta: (*S, L), S the sequences' dims, e.g.
    (B, H); k and v may broadcast against q and beta (grouped KV heads: k, v (B, H_kv, 1, L, D)
    for q (B, H_kv, G, L, D), so that the keys are never repeated; the state and the keys'
    beta-weighted products are per query head). Returns (*S, L, D) and (*S, D, D). Padding to
    a multiple of the chunk uses beta = 0 and zero keys: the state is unchanged.

    log_decay: (*S, L) log alpha_t <= 0, or None (no decay: DeltaNet) for the gated delta rule
    M_t = alpha_t (I - beta_t k_t k_t^T) M_{t-1} + beta_t k_t v_t^T. With G_t the cumulative
    log-decay within its chunk, position t sees the chunk's start state through exp(G_t) and
    position s <= t through exp(G_t - G_s): differences of sums of logs, each factor <= 1, never
    a product of many small numbers nor a ratio of two of them.
    """
    *sequences, length, head_dim = q.shape
    chunk = min(chunk, length)
    pad = -length % chunk
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        beta = F.pad(beta, (0, pad))
        if log_decay is not None:
            log_decay = F.pad(log_decay, (0, pad))  # alpha = 1
    n_chunks = (length + pad) // chunk
    q, k, v = (x.reshape(*x.shape[:-2], n_chunks, chunk, head_dim) for x in (q, k, v))
    beta = beta.reshape(*sequences, n_chunks, chunk, 1)
    k_beta, v_beta = k * beta, v * beta  # (B, H, N, C, D)
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu_()  # j >= i
    later = upper.triu(1)  # j > i
    strict = k_beta @ k.transpose(-1, -2)  # (B, H, N, C, C)
    decayed_k_beta, end_k, start_q, chunk_decays = k_beta, k, q, [None] * n_chunks
    if log_decay is not None:
        cumulative = log_decay.reshape(*sequences, n_chunks, chunk).cumsum(-1)  # G: (B, H, N, C)
        # exp(G_i - G_j) for j <= i, 0 above the diagonal (exp(-inf): no NaN in its gradient)
        pair_decay = cumulative[..., :, None] - cumulative[..., None, :]  # (B, H, N, C, C)
        pair_decay = pair_decay.masked_fill(later, float("-inf")).exp()
        strict = strict * pair_decay
        from_start = cumulative.exp()[..., None]  # exp(G_i): (B, H, N, C, 1)
        decayed_k_beta, start_q = k_beta * from_start, q * from_start
        end_k = k * (cumulative[..., -1:] - cumulative).exp()[..., None]  # exp(G_C - G_j) k_j
        chunk_decays = cumulative[..., -1].exp()[..., None, None].unbind(-3)  # (B, H, 1, 1) each
    strict = strict.masked_fill(upper, 0)
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    t = torch.linalg.solve_triangular(strict + eye, eye.expand_as(strict), upper=False)
    w, u = t @ decayed_k_beta, t @ v_beta  # (B, H, N, C, D)
    state = q.new_zeros(*sequences, head_dim, head_dim)  # M = S^T: o = q M
    starts, corrected = [], []
    # unbind, not indexing: the backward of one index of a tensor is a zero tensor of its whole
    # size, which made the loop's backward quadratic in the number of chunks.
    chunks = zip(u.unbind(-3), w.unbind(-3), end_k.unbind(-3), chunk_decays, strict=True)
    for u_c, w_c, k_c, decay_c in chunks:
        u_c = u_c - w_c @ state  # (B, H, C, D)
        starts.append(state)
        corrected.append(u_c)
        if decay_c is not None:
            state = state * decay_c
        state = state + k_c.transpose(-1, -2) @ u_c
    starts = torch.stack(starts, dim=-3)  # (B, H, N, D, D)
    corrected = torch.stack(corrected, dim=-3)  # (B, H, N, C, D)
    scores = q @ k.transpose(-1, -2)  # (B, H, N, C, C)
    if log_decay is not None:
        scores = scores * pair_decay
    scores = scores.masked_fill(later, 0)
    out = start_q @ starts + scores @ corrected  # (B, H, N, C, D)
    return out.reshape(*sequences, -1, head_dim)[..., :length, :], state


def delta_rule_flops(batch: int, heads: int, seq_len: int, head_dim: int, chunk: int) -> int:
    """2 x multiply-adds of the chunked form: per position 3 d^2 (W M_0, K^T U', Q M_0)
    and, with C = min(chunk, L), 2.5 C d for the triangular products (B K K^T, T B K,
    T B V, lower(Q K^T), its product with U', half each) and C^2 / 6 for the solve. The decay's
    element-wise products are not counted (no multiply-add of a matmul)."""
    c, d = min(chunk, seq_len), head_dim
    per_position = 3 * d * d + 2.5 * c * d + c * c / 6
    return int(2 * batch * heads * seq_len * per_position)
