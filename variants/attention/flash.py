"""Softmax attention that returns its logsumexp, and its backward given any output and logsumexp.

Kernels that split a query's keys into disjoint parts (LSH rounds, compressed attention's past
blocks and own block) attend to each part, then combine the parts' outputs with their
logsumexps: o = sum_p exp(lse_p - LSE) o_p with LSE = logsumexp_p lse_p. The gradient of the
combined o with respect to each part's q, k, v is a standard attention backward of that part
given the *combined* o and LSE (the flash-attention form, dS = P (dO V^T - rowsum(dO * o)) with
P = exp(S - LSE)), so no gradient flows through the logsumexps themselves.

On CPU both directions run on PyTorch's fused flash-attention kernels: private ATen ops (what
`F.scaled_dot_product_attention` calls on CPU, plus the logsumexp it does not return). Other
devices, other dtypes, or a PyTorch without them take explicit matmuls.
"""

from __future__ import annotations

import torch

# The score bias of a hidden key. Finite, so that a bias is one multiply of a bool mask
# (torch.where(hidden, -inf, 0) took 3-4x as long on CPU), and a row with every key hidden
# stays finite: its logsumexp is about MASKED_SCORE, so it weighs exactly 0 when combined with
# a part that has a real key. Next to any real score exp(MASKED_SCORE - lse) is exactly 0 in
# every float type (float16 rounds it to -inf).
MASKED_SCORE = -1e30
# False forces the explicit path that other devices take (tests run both).
FUSED_CPU_KERNELS = hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward")
FUSED_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def fused(x: torch.Tensor) -> bool:
    """Whether the fused CPU kernels take `x`: CPU floating tensors, unless disabled."""
    return FUSED_CPU_KERNELS and x.device.type == "cpu" and x.dtype in FUSED_DTYPES


def hidden_bias(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive bias from a bool mask (True = may attend): 0 or MASKED_SCORE, in `dtype`."""
    return (~allowed).to(dtype).mul_(MASKED_SCORE)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    bias: torch.Tensor | None = None,
    causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scale q k^T + bias) v and its logsumexp, without autograd.

    q: (B, N, Lq, D); k, v: (B, N, Lk, D) (any strides with a contiguous last dimension);
    bias: additive, broadcastable to (B, N, Lq, Lk), or None; causal: key j is hidden from
    query i when j > i (square, top-left aligned). Every row must keep at least one key.
    Returns out (B, N, Lq, D) and lse (B, N, Lq).
    """
    if fused(q):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, is_causal=causal, attn_mask=bias, scale=scale
        )
        return out, lse
    scores = _scores(q, k, scale, bias, causal)  # (B, N, Lq, Lk)
    lse = scores.logsumexp(dim=-1)  # (B, N, Lq)
    probs = scores.sub_(lse.unsqueeze(-1)).exp_()
    return torch.matmul(probs, v), lse


def attend_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    *,
    scale: float,
    bias: torch.Tensor | None = None,
    causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of `attend` w.r.t. q, k, v, with the probabilities normalised by `lse` and the
    row term taken from `out` (pass the combined output and logsumexp of several parts).

    Shapes as in `attend`. Returns grad_q (B, N, Lq, D), grad_k and grad_v (B, N, Lk, D).
    """
    if fused(q):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse, 0.0, causal, attn_mask=bias, scale=scale
        )
    probs = _scores(q, k, scale, bias, causal).sub_(lse.unsqueeze(-1)).exp_()  # (B, N, Lq, Lk)
    grad_v = probs.transpose(-1, -2) @ grad_out  # (B, N, Lk, D)
    row = (grad_out * out).sum(dim=-1, keepdim=True)  # (B, N, Lq, 1)
    grad_scores = (grad_out @ v.transpose(-1, -2)).sub_(row).mul_(probs)  # (B, N, Lq, Lk)
    return (grad_scores @ k).mul_(scale), (grad_scores.transpose(-1, -2) @ q).mul_(scale), grad_v


def _scores(q, k, scale, bias, causal) -> torch.Tensor:
    """scale q k^T + bias, causal positions at -inf: (B, N, Lq, Lk), a fresh tensor."""
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)  # (B, N, Lq, Lk)
    if bias is not None:
        scores.add_(bias)
    if causal:
        later = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu_(1)
        scores.masked_fill_(later, float("-inf"))
    return scores
