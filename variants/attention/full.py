"""Exact softmax attention: the reference every other variant is measured against."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from variants.attention.base import Attention, masked_attend
from variants.checks import require_choice
from variants.registry import register_attention


@register_attention
class FullAttention(Attention):
    """Exact attention via scaled_dot_product_attention (impl=math: explicit L x L scores)."""

    name = "full"
    exact = True
    time_complexity = "O(L^2 d)"
    memory_complexity = "O(L) sdpa, O(L^2) math"

    def __init__(self, *, causal: bool = False, impl: str = "sdpa"):
        super().__init__(causal=causal)
        self.impl = require_choice(self.name, "impl", impl, ("sdpa", "math"))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.impl == "sdpa":
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        # The reference path materialises the (L, L) scores on purpose: it is the ablation that
        # shows what SDPA's fused kernels save.
        length = q.shape[2]
        mask = None
        if self.causal:
            mask = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
        out, _ = masked_attend(q, k, v, mask)  # (B, H, L, D)
        return out

    def flops(self, batch: int, heads: int, seq_len: int, head_dim: int) -> int:
        # QK^T and PV: 2 matmuls x 2 FLOPs per multiply-add x L x L x D; causal scores half.
        pairs = seq_len * (seq_len + 1) // 2 if self.causal else seq_len * seq_len
        return 4 * batch * heads * pairs * head_dim

    def extra_repr(self) -> str:
        return f"causal={self.causal}, impl={self.impl}"
