"""Linear attention (Katharopoulos et al. 2020): softmax replaced by a positive feature map.

    out_i = phi(q_i)^T sum_j phi(k_j) v_j^T / phi(q_i)^T sum_j phi(k_j),  phi(x) = elu(x) + 1

with j over all positions, or j <= i when causal. phi is applied to q and k as given, without
the 1/sqrt(d) of softmax attention (as the paper and its fast-transformers code). Time
O(L d^2), memory O(L d + d^2): the sums are one state per head, built in chunks when causal
(`kernelized`, shared with `performer`). Not an approximation of softmax attention but a
different attention: its `approx_rel_error` against exact attention does not shrink with any
option, and it has none beyond `causal`.

With a key padding mask or segment ids each document's real positions run as a sequence of
their own (`masking.per_document`): the sums restart at every document boundary and never hold
a padded key. Grouped KV heads (k, v with fewer heads than q) are taken as they are: the sums
are per KV head, read by each of its query heads, and the decode cache holds H_kv heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from variants.attention.common import kernelized
from variants.attention.common.base import Attention
from variants.attention.common.cache import StateCache
from variants.attention.common.masking import per_document
from variants.registry import register_attention


@register_attention
class LinearAttention(Attention):
    """Linear attention: phi(x) = elu(x) + 1 features of q and k, sums of phi(k) v^T per head."""

    family = "kernel"

    name = "linear"
    published_as = {"lra": "Linear Transformer"}
    exact = False
    time_complexity = "O(L d^2)"
    memory_complexity = "O(L d + d^2)"
    supports_decode = True
    independent_heads = True
    supports_padding_mask = supports_segments = True  # one document at a time
    native_gqa = native_gqa_decode = True  # sums per KV head

    @property
    def shift_invariant(self) -> bool:  # its pattern reads positions through i - j alone
        return True

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **masks) -> torch.Tensor:
        if masks:  # attention_mask and/or segment_ids
            return per_document(self.attend, q, k, v, **masks)
        phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1  # (B, H, L, D), (B, H_kv, L, D), positive
        return kernelized.feature_attention(phi_q, phi_k, v, causal=self.causal)

    def flops(self, batch: int, heads: int, seq_len: int, head_dim: int) -> int:
        return kernelized.feature_flops(batch, heads, seq_len, head_dim, head_dim)

    # --- decoding: the running sums, D x (D + 1) per head ----------------------------------
    def new_cache(self, batch_size, n_heads, head_dim, *, max_len, device, dtype):
        return StateCache(
            self.name, batch_size, n_heads, head_dim, head_dim, max_len=max_len, device=device,
            dtype=dtype,
        )  # fmt: skip

    def cache_prompt(self, q, k, v, cache: StateCache) -> None:
        cache.add(F.elu(k) + 1, v)

    def decode_step(self, q, k, v, cache: StateCache) -> torch.Tensor:
        cache.add(F.elu(k) + 1, v)
        return cache.read(F.elu(q) + 1).to(q.dtype)  # (B, H, 1, D)
