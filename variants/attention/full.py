"""Exact softmax attention: the reference every other variant is measured against."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from variants.attention.base import Attention, masked_attend, shared_qk_keys, without_self
from variants.attention.cache import KVCache, attend_prefix
from variants.attention.masking import document_mask
from variants.checks import require_bool, require_choice
from variants.registry import register_attention


@register_attention
class FullAttention(Attention):
    """Exact attention via scaled_dot_product_attention (impl=math: explicit L x L scores).

    With `shared_qk=True` (set by a shared-QK model) the Reformer's conventions apply: keys are
    unit-normalised, k_hat = k / |k|, and a query does not attend to itself unless it has no
    other key. That takes an explicit (L, L) bool mask, so shared-QK full attention holds
    O(L^2) bytes even through SDPA.

    Masks: `key_padding_mask` and `segment_ids` become one (B, 1, L, L) bool mask (with the
    causal and shared-QK conditions), so they too hold O(B L^2) bytes through SDPA. Grouped KV
    heads are never repeated: SDPA's `enable_gqa`, and `impl=math` views q as (B, H_kv, G, L, D)
    against (B, H_kv, 1, L, D) keys; the decoding cache holds H_kv heads.
    """

    name = "full"
    exact = True
    time_complexity = "O(L^2 d)"
    memory_complexity = "O(L) sdpa, O(L^2) math"
    supports_decode = True
    softmax_kernels = "sdpa"
    independent_heads = True
    supports_padding_mask = supports_segments = True
    native_gqa = native_gqa_decode = True

    def __init__(self, *, causal: bool = False, impl: str = "sdpa", shared_qk: bool = False):
        super().__init__(causal=causal)
        self.impl = require_choice(self.name, "impl", impl, ("sdpa", "math"))
        self.shared_qk = require_bool(self.name, "shared_qk", shared_qk)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        key_padding_mask: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # q (B, H, L, D); k, v (B, H_kv, L, D)
        mask = self._mask(q.shape[2], q.device, key_padding_mask, segment_ids)
        # mask: None, (L, L) or, with padding or documents, (B, 1, L, L) bool
        if self.shared_qk:
            k = shared_qk_keys(k)  # (B, H, L, D)
        grouped = k.shape[1] != q.shape[1]
        if self.impl == "sdpa":
            is_causal = self.causal and mask is None
            gqa = {"enable_gqa": True} if grouped else {}  # the exact call of before otherwise
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=is_causal, **gqa
            )
        # The reference path materialises the (L, L) scores on purpose: it is the ablation that
        # shows what SDPA's fused kernels save.
        if mask is None and self.causal:
            mask = torch.ones(q.shape[2], q.shape[2], dtype=torch.bool, device=q.device).tril()
        if grouped:  # query groups as a dim of their own, against one key head each
            batch, heads, length, dim = q.shape
            q = q.unflatten(1, (k.shape[1], -1))  # (B, H_kv, G, L, D)
            k, v = k[:, :, None], v[:, :, None]  # (B, H_kv, 1, L, D)
            mask = mask if mask is None or mask.dim() == 2 else mask[:, :, None]
            out, _ = masked_attend(q, k, v, mask)  # (B, H_kv, G, L, D)
            return out.reshape(batch, heads, length, dim)
        out, _ = masked_attend(q, k, v, mask)  # (B, H, L, D)
        return out

    # --- decoding: every key and value, read once per token by the fused kernel -------------
    def new_cache(self, batch_size, n_heads, head_dim, *, max_len, device, dtype):
        return KVCache(
            self.name, batch_size, n_heads, head_dim, max_len=max_len, device=device, dtype=dtype
        )

    def cache_prompt(self, q, k, v, cache: KVCache) -> None:
        cache.append(shared_qk_keys(k) if self.shared_qk else k, v)

    def decode_step(self, q, k, v, cache: KVCache) -> torch.Tensor:
        """Appends the position to the reserved buffers and attends over the (B, H, n, D) view
        of every key so far: one read of the cache, no copy. Under shared QK the query's own
        key is left out unless it is the only one."""
        self.cache_prompt(q, k, v, cache)
        keys, values = cache.keys(), cache.values()  # (B, H, n, D) views
        if self.shared_qk and cache.length > 1:
            keys, values = keys[:, :, :-1], values[:, :, :-1]
        return attend_prefix(q, keys, values)  # (B, H, 1, D); keys of H_kv heads

    def _mask(
        self,
        length: int,
        device: torch.device,
        key_padding_mask: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """The (L, L) shared-QK mask or, with padding or documents, the (B, 1, L, L) mask,
        True where a query may attend; None without any of them (SDPA's own causal path)."""
        masked = key_padding_mask is not None or segment_ids is not None
        if not (self.shared_qk or masked):
            return None
        position = torch.arange(length, device=device)
        allowed = torch.ones(length, length, dtype=torch.bool, device=device)
        if self.causal:
            allowed = allowed.tril()
        if masked:
            documents = document_mask(
                key_padding_mask, segment_ids, position[:, None], position[None, :]
            )  # (B, L, L)
            allowed = (allowed & documents)[:, None]  # (B, 1, L, L)
        if not self.shared_qk:
            return allowed
        is_self = position[:, None] == position[None, :]  # (L, L)
        return without_self(allowed, is_self)

    def flops(self, batch: int, heads: int, seq_len: int, head_dim: int) -> int:
        # QK^T and PV: 2 matmuls x 2 FLOPs per multiply-add x L x L x D; causal scores half.
        pairs = seq_len * (seq_len + 1) // 2 if self.causal else seq_len * seq_len
        return 4 * batch * heads * pairs * head_dim

    def extra_repr(self) -> str:
        return f"causal={self.causal}, impl={self.impl}, shared_qk={self.shared_qk}"
