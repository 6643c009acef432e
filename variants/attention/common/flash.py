"""Softmax attention that returns its logsumexp, and its backward given any output and logsumexp.

Kernels that split a query's keys into disjoint parts (LSH rounds, strided attention's windows
and columns, compressed attention's past blocks and own block) attend to each part and combine
the parts' outputs by their logsumexps, o = sum_p exp(lse_p - LSE) o_p; each part's gradient is
a standard attention backward given the *combined* o and LSE, so no gradient flows through the
logsumexps. On CPU both directions run on PyTorch's fused flash-attention kernels (private ATen
ops), on CUDA on the memory-efficient SDPA kernels (float32 and half types); other devices and
dtypes take explicit matmuls. `path(device, dtype)` says which (`fused` | `explicit`): every
record's `kernel_path`.

The merge, its backward and the paths in full: docs/variants/common.md, "Parts merged by
logsumexp".
"""

from __future__ import annotations

import torch

from variants.attention.common.masking import repeat_kv

# The score bias of a hidden key. Finite, so that a bias is one multiply of a bool mask
# (torch.where(hidden, -inf, 0) took 3-4x as long on CPU), and a row with every key hidden
# stays finite: its logsumexp is about MASKED_SCORE, so it weighs exactly 0 when combined with
# a part that has a real key. Next to any real score exp(MASKED_SCORE - lse) is exactly 0 in
# every float type (float16 takes half its lowest value instead: see `masked_score`).
MASKED_SCORE = -1e30
# How far below every other key a token's own score is put (LSH's and routing's `window_bias`):
# finite, unlike a masked score, so a row whose other keys are all masked falls back to the token
# itself, and exp(-100) vanishes next to any real key (underflow in float32, 4e-44 in float64).
SELF_MARGIN = 100.0
# False forces the explicit path that other devices take (tests run both).
FUSED_CPU_KERNELS = hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward")
FUSED_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
# The same on CUDA: the memory-efficient kernels (no float64).
FUSED_CUDA_KERNELS = hasattr(torch.ops.aten, "_scaled_dot_product_efficient_attention_backward")
FUSED_CUDA_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# The memory-efficient kernel pads its logsumexp to a multiple of this many queries, and wants
# the rows of an additive bias aligned to this many elements.
CUDA_LSE_ALIGN, CUDA_BIAS_ALIGN = 32, 16
FUSED, EXPLICIT = "fused", "explicit"


def fused_on(device_type: str, dtype: torch.dtype) -> bool:
    """Whether the fused kernels take tensors of `dtype` on a device of `device_type`."""
    if device_type == "cpu":
        return FUSED_CPU_KERNELS and dtype in FUSED_DTYPES
    if device_type == "cuda":
        return FUSED_CUDA_KERNELS and dtype in FUSED_CUDA_DTYPES
    return False


def fused(x: torch.Tensor) -> bool:
    """Whether the fused kernels take `x` (its device and dtype), unless disabled."""
    return fused_on(x.device.type, x.dtype)


def fused_kind(x: torch.Tensor) -> str | None:
    """Which fused kernels take `x`: "cpu" (flash), "cuda" (memory-efficient), or None."""
    return x.device.type if fused(x) else None


def efficient_ops():
    """CUDA's memory-efficient attention forward and backward ops (a function: the CPU tests
    stand in for them)."""
    aten = torch.ops.aten
    return (
        aten._scaled_dot_product_efficient_attention,
        aten._scaled_dot_product_efficient_attention_backward,
    )


def path(device: torch.device | str, dtype: torch.dtype) -> str:
    """`fused` or `explicit`: which path `attend` and `attend_backward` take there."""
    return FUSED if fused_on(torch.device(device).type, dtype) else EXPLICIT


def masked_score(dtype: torch.dtype) -> float:
    """MASKED_SCORE, or half the lowest finite value of `dtype` where that is higher (float16):
    a row with every key hidden must keep a finite logsumexp, which then weighs 0 in a merge
    (the fused float16 kernel gave such a row a weight, and the explicit path NaN, at -inf)."""
    return max(MASKED_SCORE, torch.finfo(dtype).min / 2)


def hidden_bias(
    hidden: torch.Tensor, dtype: torch.dtype, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Additive bias from a mask of hidden keys (bool or uint8, nonzero = hidden): 0 or
    `masked_score`, in `dtype`; written into `out` (the mask broadcast to its shape) if given.
    A copy and one multiply: uint8 masks convert 4x as fast as bool ones on CPU."""
    bias = hidden.new_empty(hidden.shape, dtype=dtype) if out is None else out
    return bias.copy_(hidden).mul_(masked_score(dtype))


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

    q: (B, N, Lq, D); k, v: (B, N_kv, Lk, D) (any strides with a contiguous last dimension)
    with N_kv dividing N: query set n reads key set n // (N / N_kv) (grouped heads, as SDPA's
    `enable_gqa`; the fused CPU kernel takes them as they are, the other paths repeat them);
    bias: additive, broadcastable to (B, N, Lq, Lk), or None; causal: key j is hidden from
    query i when j > i (square, top-left aligned). A row whose keys are all hidden gets an lse
    of about MASKED_SCORE (or -inf where that is not finite), so it weighs 0 when merged with a
    part that has keys. Returns out (B, N, Lq, D) and lse (B, N, Lq), the latter in float32 for
    half types (as the fused kernels).
    """
    kind = fused_kind(q)
    if kind == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, is_causal=causal, attn_mask=bias, scale=scale
        )
        return out, lse
    k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])  # (B, N, Lk, D) each
    if kind == "cuda":
        forward, _ = efficient_ops()
        out, lse, _, _ = forward(q, k, v, _cuda_bias(bias, q, k), True, 0.0, causal, scale=scale)
        return out, lse[..., : q.shape[-2]]  # (B, N, Lq, D), (B, N, Lq)
    return _explicit_attend(q, k, v, scale=scale, bias=bias, causal=causal)


def _explicit_attend(q, k, v, *, scale, bias, causal):
    """`attend` in explicit matmuls (devices and dtypes without fused kernels)."""
    scores = _scores(q, k, scale, bias, causal)  # (B, N, Lq, Lk), at least float32
    lse = scores.logsumexp(dim=-1)  # (B, N, Lq)
    probs = scores.sub_(_finite(lse).unsqueeze(-1)).exp_()
    return torch.matmul(probs.to(v.dtype), v), lse


def merge_into(
    out: torch.Tensor, lse: torch.Tensor, part_out: torch.Tensor, part_lse: torch.Tensor
) -> None:
    """Fold one more part into a running result, in place: afterwards `out` and `lse` are the
    softmax attention and logsumexp over the union of the keys so far and the part's keys.

    out, part_out: (..., D); lse, part_lse: (..., 1), in the dtype `attend` returns. A part
    whose row had every key hidden (lse about MASKED_SCORE, or -inf) weighs exactly 0.
    part_out is scaled in place (callers pass a temporary): one buffer the size of the output
    fewer per merge.
    """
    total = torch.logaddexp(lse, part_lse)  # (..., 1)
    kept = (lse - total).exp_().to(out.dtype)
    added = (part_lse - total).exp_().to(out.dtype)
    out.mul_(kept).add_(part_out.mul_(added))
    lse.copy_(total)


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

    Shapes as in `attend` (grouped key sets too). Returns grad_q (B, N, Lq, D), grad_k and
    grad_v (B, N_kv, Lk, D), a shared key's gradient summed over the query sets that read it.
    """
    kind = fused_kind(q)
    if kind == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse, 0.0, causal, attn_mask=bias, scale=scale
        )
    kv_sets = k.shape[1]
    k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])  # (B, N, Lk, D) each
    backward = _cuda_backward if kind == "cuda" else _explicit_backward
    grad_q, grad_k, grad_v = backward(
        grad_out, q, k, v, out, lse, scale=scale, bias=bias, causal=causal
    )
    return grad_q, _sum_groups(grad_k, kv_sets), _sum_groups(grad_v, kv_sets)


def _sum_groups(grad: torch.Tensor, kv_sets: int) -> torch.Tensor:
    """The gradient of `repeat_kv`: (B, N, L, D) -> (B, kv_sets, L, D), each group summed."""
    if grad.shape[1] == kv_sets:
        return grad
    return grad.unflatten(1, (kv_sets, -1)).sum(dim=2)


def _explicit_backward(grad_out, q, k, v, out, lse, *, scale, bias, causal):
    """`attend_backward` in explicit matmuls."""
    dtypes = (q.dtype, k.dtype, v.dtype)
    probs = _scores(q, k, scale, bias, causal)  # (B, N, Lq, Lk), at least float32
    probs.sub_(_finite(lse).unsqueeze(-1).to(probs.dtype)).exp_()
    grad_out, out, q, k, v = (x.to(probs.dtype) for x in (grad_out, out, q, k, v))
    grad_v = probs.transpose(-1, -2) @ grad_out  # (B, N, Lk, D)
    row = (grad_out * out).sum(dim=-1, keepdim=True)  # (B, N, Lq, 1)
    grad_scores = (grad_out @ v.transpose(-1, -2)).sub_(row).mul_(probs)  # (B, N, Lq, Lk)
    grad_q = (grad_scores @ k).mul_(scale)  # (B, N, Lq, D)
    grad_k = (grad_scores.transpose(-1, -2) @ q).mul_(scale)  # (B, N, Lk, D)
    return tuple(g.to(dtype) for g, dtype in zip((grad_q, grad_k, grad_v), dtypes, strict=True))


def _cuda_bias(bias, q, k) -> torch.Tensor | None:
    """An additive bias as the memory-efficient kernel takes it: (B, N, Lq, Lk) in q's dtype,
    broadcast dims as stride 0, each row starting at a multiple of CUDA_BIAS_ALIGN elements
    (a padded copy if not)."""
    if bias is None:
        return None
    shape = (*q.shape[:-1], k.shape[-2])  # (B, N, Lq, Lk)
    bias = bias.to(q.dtype).expand(shape)
    if bias.stride(-1) == 1 and bias.stride(-2) % CUDA_BIAS_ALIGN == 0:
        return bias
    width = -(-shape[-1] // CUDA_BIAS_ALIGN) * CUDA_BIAS_ALIGN
    aligned = bias.new_empty(*shape[:-1], width)[..., : shape[-1]]  # rows at aligned offsets
    return aligned.copy_(bias)


def _cuda_backward(grad_out, q, k, v, out, lse, *, scale, bias, causal):
    """`attend_backward` on CUDA's memory-efficient kernel; lse (B, N, Lq) is padded back to
    the kernel's CUDA_LSE_ALIGN multiple (the padding rows are never read)."""
    length = lse.shape[-1]
    padded = torch.zeros(
        (*lse.shape[:-1], -(-length // CUDA_LSE_ALIGN) * CUDA_LSE_ALIGN),
        dtype=torch.float32,
        device=lse.device,
    )
    padded[..., :length] = lse
    seed = offset = torch.empty((), dtype=torch.int64)  # no dropout: never read
    _, backward = efficient_ops()
    grad_q, grad_k, grad_v, _ = backward(
        grad_out,
        q,
        k,
        v,
        _cuda_bias(bias, q, k),
        out,
        padded,
        seed,
        offset,
        0.0,
        [True, True, True, False],
        causal,
        scale=scale,
    )
    return grad_q, grad_k, grad_v


def _finite(lse: torch.Tensor) -> torch.Tensor:
    """lse with -inf (a row with every key at -inf: MASKED_SCORE overflows in float16) as 0, so
    exp(score - lse) is 0 for such a row instead of NaN."""
    return torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))


def _scores(q, k, scale, bias, causal) -> torch.Tensor:
    """scale q k^T + bias, causal positions at -inf: (B, N, Lq, Lk), a fresh tensor in float32
    for half types (the softmax of half-precision scores loses most of its digits)."""
    scores = torch.matmul(q, k.transpose(-1, -2))  # (B, N, Lq, Lk)
    if scores.dtype in (torch.float16, torch.bfloat16):
        scores = scores.float()
    scores.mul_(scale)
    if bias is not None:
        scores.add_(bias)
    if causal:
        later = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu_(1)
        scores.masked_fill_(later, float("-inf"))
    return scores
