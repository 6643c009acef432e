"""MoBA, Mixture of Block Attention (Lu et al. 2025): each query attends to its top-k key blocks.
The layer (`MoBAAttention`, the registry's entry); NSA shares the rest, in `common`: `selection`
(which blocks a query sees) and `selected_blocks` (`SelectedBlocks`, the autograd function that
attends to them).

Keys are cut into blocks of `block_size`. Causally a query at i scores every block that ends
before its own block begins by <q_i, mean of the block's keys>, takes the `top_k - 1` highest
and always its own block (causal inside), and attends with one softmax (scale 1/sqrt(d)) over
their union; the choice is per query and head, with no gradient through it. Bidirectionally
every other block is a candidate and the own block is seen whole. Memory O(L top_k d); time
O(L top_k b d + L (L / b) d). Grouped KV heads are taken as they are; decoding on
`cache.BlockKVCache` follows the forward's rule. Masks: no query attends, or routes by, a key of
another document or a padded key; padded queries' outputs are 0.

How it runs, decoding, grouped heads and the masks' rules in full: docs/variants/moba.md.
"""

from __future__ import annotations

import torch

from variants.attention.common.base import Attention
from variants.attention.common.cache import BlockKVCache
from variants.attention.common.masking import masking_masks, on_real_prefix
from variants.attention.common.pooling import block_mean
from variants.attention.common.selected_blocks import SelectedBlocks
from variants.attention.common.selection import (
    DocumentRouting,
    attend_selected,
    block_select_pairs,
    top_blocks,
)
from variants.checks import require_positive_int
from variants.registry import register_attention


@register_attention
class MoBAAttention(Attention):
    """MoBA: per query, its own block plus the top_k - 1 past blocks by <q, mean key>."""

    family = "selection"
    takes_scale = True
    small_options = {"block_size": 8, "top_k": 3}
    knobs = ("top_k", "block_size")

    name = "moba"
    exact = False
    block_sparse_work = True
    time_complexity = "O(L k b d + L^2 d / b)"
    memory_complexity = "O(L k d)"
    softmax_kernels = "flash"
    supports_decode = True
    independent_heads = True
    supports_padding_mask = supports_segments = True  # docs/variants/moba.md, "Masks"
    native_gqa = native_gqa_decode = True  # block means and keys per KV head

    def __init__(self, *, causal: bool = False, block_size: int = 128, top_k: int = 4):
        super().__init__(causal=causal)
        self.block_size = require_positive_int(self.name, "block_size", block_size)
        self.top_k = require_positive_int(self.name, "top_k", top_k)

    def selection(self, q: torch.Tensor, k: torch.Tensor, **masks) -> torch.Tensor:
        """Each query's selected other blocks: (B, H, L, S) int64 block indices, -1 where there
        are fewer candidates than S = top_k - 1 slots. masks: `attention_mask`,
        `segment_ids` (B, L), if given (docs/variants/moba.md, "Masks")."""
        slots = self.top_k - 1
        with torch.no_grad():
            if not masks:
                means = block_mean(k, self.block_size)  # (B, H_kv, n, D)
                return top_blocks(q, means, self.block_size, slots, self.causal)
            routing = DocumentRouting(q, k, self.block_size, **masks)
            return top_blocks(
                q, routing.summaries, self.block_size, slots, self.causal, routing.adjust
            )

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **masks) -> torch.Tensor:
        """q (B, H, L, D), k and v (B, H_kv, L, D) -> (B, H, L, D); masks:
        `attention_mask`, `segment_ids` (B, L), if given (the call without them is MoBA's of
        before)."""
        # A padded tail common to the batch: the real prefix runs alone (docs/variants/moba.md: no
        # real query routes by or attends a padded key) and the tail's outputs are 0.
        if (out := on_real_prefix(self.attend, [q, k, v], masks)) is not None:
            return out
        masks = masking_masks(masks)  # e.g. the prefix's padding mask once nothing is padded
        selected = self.selection(q, k, **masks)  # (B, H, L, S)
        if not masks:
            return SelectedBlocks.apply(q, k, v, selected, self.block_size, self.causal)
        keep, segments = masks.get("attention_mask"), masks.get("segment_ids")
        if keep is not None:  # a padded query's output is 0 (the base class): it needs no block
            selected.masked_fill_(~keep[:, None, :, None], -1)
        return SelectedBlocks.apply(q, k, v, selected, self.block_size, self.causal, keep, segments)

    # --- decoding: every key and value, and the mean key of every finished block ------------
    def new_cache(self, batch_size, n_heads, head_dim, *, max_len, device, dtype):
        return BlockKVCache(
            self.name, batch_size, n_heads, head_dim, block=self.block_size,
            summarise_values=False, max_len=max_len, device=device, dtype=dtype,
        )  # fmt: skip

    def cache_prompt(self, q, k, v, cache: BlockKVCache) -> None:
        cache.append(k, v)
        finished = k.shape[2] // self.block_size * self.block_size
        if finished:
            cache.add_summaries(block_mean(k[:, :, :finished], self.block_size))

    def decode_step(self, q, k, v, cache: BlockKVCache) -> torch.Tensor:
        cache.append(k, v)
        means, _ = cache.summaries()  # (B, H_kv, n, D): the finished blocks, before q's own
        out = attend_selected(q, cache, means, self.top_k - 1)  # (B, H, 1, D)
        if cache.length % self.block_size == 0:  # the own block has ended: its mean
            cache.add_summaries(block_mean(cache.keys()[:, :, -self.block_size :], self.block_size))
        return out

    def flops(self, batch: int, heads: int, seq_len: int, head_dim: int) -> int:
        """4 B H d x the pairs scored (own block causal or whole, plus up to top_k - 1 whole
        other blocks per query, the short last block by its real keys) plus the routing
        scores, 2 B H d x (query, candidate block) pairs."""
        pairs, candidates = block_select_pairs(seq_len, self.block_size, self.top_k, self.causal)
        return 4 * batch * heads * pairs * head_dim + 2 * batch * heads * candidates * head_dim

    def extra_repr(self) -> str:
        return f"causal={self.causal}, block_size={self.block_size}, top_k={self.top_k}"
