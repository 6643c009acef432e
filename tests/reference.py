"""Independent references for the tests: dense masks and explicit softmax, nothing from variants."""

from __future__ import annotations

import contextlib
import math

import torch


def dense_attention(q, k, v, mask=None, scale=None):
    """softmax(q k^T * scale, masked) v on explicit (L, L) scores; mask True = may attend.

    q, k, v: (B, H, L, D); mask: bool broadcastable to (B, H, L, L). Rows with no allowed key
    return zeros.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return probs @ v


def causal_mask(length, device=None):
    """(L, L) bool, True where j <= i."""
    idx = torch.arange(length, device=device)
    return idx[None, :] <= idx[:, None]


def shared_qk_reference(q, v, allowed=None, multiplicity=None):
    """The Reformer's shared-QK attention on explicit scores: unit keys k_j = q_j / |q_j|,
    scores q_i . k_j (no 1/sqrt(D)), and key i offered to query i only when `allowed` leaves
    it no other key.

    q, v: (B, H, L, D); allowed: (L, L) or (B, H, L, L) bool pattern (True = may attend), None
    for all pairs. `multiplicity` (same shape, counts) weighs each pair's exp(score) by how
    many times it is counted; None counts every pair once.
    """
    length = q.shape[2]
    if allowed is None:
        allowed = torch.ones(length, length, dtype=torch.bool)
    eye = torch.eye(length, dtype=torch.bool)
    others = allowed & ~eye
    alone = ~others.any(dim=-1, keepdim=True)
    mask = others | (eye & alone)
    keys = q / q.norm(dim=-1, keepdim=True)
    scores = q @ keys.transpose(-1, -2)
    if multiplicity is not None:
        scores = scores + multiplicity.clamp_min(1).log()
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return probs @ v


def qkv(batch=2, heads=3, length=16, head_dim=8, seed=0, dtype=torch.float64, requires_grad=False):
    """Random q, k, v (B, H, L, D); float64 by default so equality tests can be tight."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, heads, length, head_dim)
    return tuple(
        torch.randn(shape, generator=g, dtype=dtype).requires_grad_(requires_grad) for _ in range(3)
    )


def assert_causal(module, length=24, t=10, head_dim=8, seed=0, replay=False):
    """Changing q, k, v after position t leaves outputs at positions <= t unchanged.

    replay=True runs the second call inside `replaying()`, so a stochastic kernel reuses the
    random choices (LSH buckets) of the first.
    """
    from variants.attention.base import replaying

    q, k, v = qkv(1, 2, length, head_dim, seed=seed)
    out = module(q, k, v)
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, :, t + 1 :] = torch.randn_like(x[:, :, t + 1 :]) * 3
    with replaying() if replay else contextlib.nullcontext():
        out2 = module(q2, k2, v2)
    torch.testing.assert_close(out[:, :, : t + 1], out2[:, :, : t + 1])
    assert not torch.allclose(out[:, :, t + 1 :], out2[:, :, t + 1 :])


def assert_layout_independent(attend, tensors, replay=False):
    """attend(*tensors) gives the same outputs and gradients on (B, H, L, D) views of
    (B, L, H, D) tensors, the layout the model hands a kernel, as on contiguous copies.

    tensors: (1, H, L, D) each (with batch 1, flattening B*H gives a strided view, not a copy).
    replay: as in `assert_causal`, for the second call.
    """
    from variants.attention.base import replaying

    views = [x.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for x in tensors]
    dense = [x.detach().clone().requires_grad_() for x in tensors]
    assert not views[0].is_contiguous()
    out_views = attend(*views)
    with replaying() if replay else contextlib.nullcontext():
        out_dense = attend(*dense)
    torch.testing.assert_close(out_views, out_dense)
    weights = torch.randn_like(out_dense)
    got = torch.autograd.grad((out_views * weights).sum(), views)
    want = torch.autograd.grad((out_dense * weights).sum(), dense)
    torch.testing.assert_close(got, want)


# --- Hand-written dense masks of the pattern vocabulary (variants.patterns), one rule per
# pattern on python ints, written from the definitions and never from the library's code.


def rule_mask(length, rule):
    """(L, L) bool with [i, j] = rule(i, j), evaluated pair by pair."""
    return torch.tensor([[bool(rule(i, j)) for j in range(length)] for i in range(length)])


def causal_rule(i, j):
    return j <= i


def local_rule(block, back, forward):
    """Key block within [query block - back, query block + forward]."""
    return lambda i, j: i // block - back <= j // block <= i // block + forward


def band_rule(width):
    return lambda i, j: abs(i - j) < width


def strided_rule(stride):
    return lambda i, j: (i - j) % stride == 0


def global_rule(n_global, causal):
    """The first n_global keys for everyone; unless causal, every key for the first queries."""
    return lambda i, j: j < n_global or (not causal and i < n_global)


def summary_rule(block, width):
    """The last `width` positions of every block."""
    return lambda i, j: j % block >= block - width


def block_table_rule(table, block):
    """Query block qb sees key block kb where table[qb][kb] (random blocks, given the draw)."""
    return lambda i, j: bool(table[i // block][j // block])


def union_rule(*rules):
    return lambda i, j: any(rule(i, j) for rule in rules)
