"""Mamba-2's kernel: `chunked_ssd`, the SSD block decomposition (Dao & Gu 2024, section 6) of
M_t = a_t M_{t-1} + k_t v_t^T, o_t = q_t M_t (M = S: d x d per head), through which autograd
runs. Within a chunk of C positions, with G_i the cumulative log-decay from the chunk's start
and L_ij = exp(G_i - G_j) for j <= i (0 above: the segment sums of the paper's `segsum`),

    O = (L * Q K^T) V + diag(exp(G)) Q M_0         quadratic within the chunk, plus its start
    M_next = exp(G_C) M_0 + (exp(G_C - G) * K)^T V   the chunk's state, one recurrence over chunks

All but the recurrence (one scale and add of d x d per chunk) run batched over the chunks. Every
decay is exp of a difference of sums of logs, each <= 1: never a product of many small numbers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def chunked_ssd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The SSD's outputs (module docstring) and its final state M.

    q, k, v: (*S, L, D), S the sequences' dims, e.g. (B, H); log_decay: (*S, L) log a_t <= 0.
    k and v may broadcast against q and log_decay (grouped KV heads: k, v (B, H_kv, 1, L, D)
    for q (B, H_kv, G, L, D): never repeated; the state is per query head). Returns (*S, L, D)
    and (*S, D, D). Padding to a multiple of the chunk uses a = 1 and zero keys: the state is
    unchanged.
    """
    *sequences, length, head_dim = q.shape
    chunk = min(chunk, length)
    pad = -length % chunk
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        log_decay = F.pad(log_decay, (0, pad))
    n_chunks = (length + pad) // chunk
    q, k, v = (x.reshape(*x.shape[:-2], n_chunks, chunk, head_dim) for x in (q, k, v))
    cumulative = log_decay.reshape(*sequences, n_chunks, chunk).cumsum(-1)  # G: (B, H, N, C)
    later = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu_(1)  # j > i
    # L_ij = exp(G_i - G_j), j <= i; exp(-inf) above the diagonal: 0, and no NaN in its gradient
    pair_decay = cumulative[..., :, None] - cumulative[..., None, :]  # (B, H, N, C, C)
    pair_decay = pair_decay.masked_fill(later, float("-inf")).exp()
    within = ((q @ k.transpose(-1, -2)) * pair_decay) @ v  # (B, H, N, C, D)
    end_k = k * (cumulative[..., -1:] - cumulative).exp()[..., None]  # exp(G_C - G_j) k_j
    chunk_states = end_k.transpose(-1, -2) @ v  # (B, H, N, D, D)
    chunk_decays = cumulative[..., -1].exp()[..., None, None]  # exp(G_C): (B, H, N, 1, 1)
    state = q.new_zeros(*sequences, head_dim, head_dim)
    starts = []
    # unbind, not indexing: the backward of one index would be a zero tensor of the whole size.
    for decay_c, state_c in zip(chunk_decays.unbind(-3), chunk_states.unbind(-3), strict=True):
        starts.append(state)
        state = state * decay_c + state_c
    starts = torch.stack(starts, dim=-3)  # (B, H, N, D, D)
    out = (q * cumulative.exp()[..., None]) @ starts + within  # (B, H, N, C, D)
    return out.reshape(*sequences, -1, head_dim)[..., :length, :], state
