"""Memory-compressed attention (Liu et al. 2018): attend to keys and values shortened f-fold.

Keys and values are compressed along the sequence by `factor` f (`method`: conv, a learned
Conv1d shared by the heads; mean; max): block c summarises positions [c*f, (c+1)*f - 1];
queries are not compressed. Without a causal mask every query attends to all ceil(L / f)
summaries. Causally a query at i attends to the summaries of the blocks that end before its
own block starts, and exactly to the raw keys of its own block up to itself: nothing leaks, no
row is empty, and the two disjoint parts are merged by logsumexp, each on the fused kernels'
causal flag (`PastBlocksAndOwnBlock`), with no mask tensor. Masks: each document's real
positions run as a sequence of their own (`masking.per_document`), so a packed document is
compressed exactly as it would be alone. Grouped KV heads are compressed once per KV head and
never repeated.

The causal split, the methods, the masks (and why per document) in full:
docs/variants/compressed.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from variants.attention.common.base import Attention
from variants.attention.common.cache import PrefixCache, attend_prefix
from variants.attention.common.masking import per_document
from variants.attention.common.pooling import block_mean
from variants.attention.compressed.function import (
    PastBlocksAndOwnBlock,
    block_conv,
    block_max,
)
from variants.checks import require_choice, require_positive_int
from variants.registry import register_attention

METHODS = ("conv", "mean", "max")


@register_attention
class CompressedAttention(Attention):
    """Memory-compressed attention: keys and values shortened f-fold (strided conv, mean or max).

    Masks: each document's real positions attend as a sequence of their own, blocks counted
    from its first real token (`per_document`; why: docs/variants/compressed.md).
    """

    family = "fixed"
    takes_scale = True
    small_options = {"factor": 4}
    knobs = ("factor",)
    smaller_is_finer = ("factor",)

    name = "compressed"
    exact = False
    block_sparse_work = True
    time_complexity = "O(L^2 d / f)"
    memory_complexity = "O(L) fused, O(L^2 / f) explicit"
    supports_decode = True
    softmax_kernels = "flash"
    independent_heads = True
    supports_padding_mask = supports_segments = True  # docs/variants/compressed.md, "Masks"
    native_gqa = native_gqa_decode = True  # summaries per KV head, never repeated

    def __init__(
        self, *, causal: bool = False, factor: int = 4, method: str = "conv", head_dim: int = 64
    ):
        super().__init__(causal=causal)
        self.factor = require_positive_int(self.name, "factor", factor)
        self.method = require_choice(self.name, "method", method, METHODS)
        self.head_dim = require_positive_int(self.name, "head_dim", head_dim)
        if self.method == "conv":
            self.key_conv = nn.Conv1d(head_dim, head_dim, kernel_size=factor, stride=factor)
            self.value_conv = nn.Conv1d(head_dim, head_dim, kernel_size=factor, stride=factor)
        else:
            self.key_conv = self.value_conv = None

    def compress(self, x: torch.Tensor, conv: nn.Conv1d | None) -> torch.Tensor:
        """Summarise each block of `factor` positions: (B, H, L, D) -> (B, H, ceil(L/f), D)."""
        if self.method == "mean":
            return block_mean(x, self.factor)
        if self.method == "max":
            return block_max(x, self.factor)
        return block_conv(x, conv)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q (B, H, L, D), k, v (B, H_kv, L, D) -> (B, H, L, D); with masks, each document's
        real positions attend as a sequence of their own (docs/variants/compressed.md)."""
        if attention_mask is not None or segment_ids is not None:
            return per_document(
                self.attend, q, k, v, attention_mask=attention_mask, segment_ids=segment_ids
            )
        if self.method == "conv" and q.shape[-1] != self.head_dim:
            raise ValueError(
                f"{self.name}: option 'head_dim'={self.head_dim} must equal the inputs' head_dim "
                f"{q.shape[-1]} (the conv compression has head_dim channels)"
            )
        keys = self.compress(k, self.key_conv)  # (B, H_kv, C, D)
        values = self.compress(v, self.value_conv)  # (B, H_kv, C, D)
        if not self.causal:
            gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}  # the plain call else
            return F.scaled_dot_product_attention(q, keys, values, **gqa)  # (B, H, L, D)
        return PastBlocksAndOwnBlock.apply(q, k, v, keys, values, self.factor)  # (B, H, L, D)

    # --- decoding: the summaries of finished blocks, then the open block's raw keys ---------
    def new_cache(self, batch_size, n_heads, head_dim, *, max_len, device, dtype):
        return PrefixCache(
            self.name, batch_size, n_heads, head_dim, block=self.factor, max_len=max_len,
            device=device, dtype=dtype,
        )  # fmt: skip

    def cache_prompt(self, q, k, v, cache: PrefixCache) -> None:
        cache.reserve(k.shape[2])
        full = k.shape[2] // self.factor * self.factor
        if full:
            keys = self.compress(k[:, :, :full], self.key_conv)  # (B, H, c, D)
            values = self.compress(v[:, :, :full], self.value_conv)
            cache.keys_buffer[:, :, : keys.shape[2]] = keys
            cache.values_buffer[:, :, : keys.shape[2]] = values
            cache.summaries = keys.shape[2]
        cache.open = k.shape[2] - full
        open_rows = slice(cache.summaries, cache.summaries + cache.open)
        cache.keys_buffer[:, :, open_rows] = k[:, :, full:]
        cache.values_buffer[:, :, open_rows] = v[:, :, full:]

    def decode_step(self, q, k, v, cache: PrefixCache) -> torch.Tensor:
        """The query sees the summaries of the blocks before its own and its own block up to
        itself: the contiguous prefix of the cache. A finished block is then compressed into
        one summary, which replaces its raw keys."""
        cache.reserve(1)
        row = cache.summaries + cache.open
        cache.keys_buffer[:, :, row : row + 1] = k
        cache.values_buffer[:, :, row : row + 1] = v
        cache.open += 1
        out = attend_prefix(q, *cache.visible())  # (B, H, 1, D)
        if cache.open == self.factor:
            keys, values = cache.open_block()  # (B, H, f, D) each
            keys = self.compress(keys, self.key_conv)  # (B, H, 1, D)
            values = self.compress(values, self.value_conv)
            cache.keys_buffer[:, :, cache.summaries : cache.summaries + 1] = keys
            cache.values_buffer[:, :, cache.summaries : cache.summaries + 1] = values
            cache.summaries, cache.open = cache.summaries + 1, 0
        return out

    def flops(self, batch: int, heads: int, seq_len: int, head_dim: int) -> int:
        """Scored pairs x 4 B H d, plus the two compression convs' 2 B H C f d^2 each (conv only).

        Non-causal: L x C pairs. Causal: query i scores floor(i/f) compressed blocks and
        (i mod f) + 1 raw keys of its own block. Mean and max pooling are not matmuls and are
        not counted.
        """
        factor = self.factor
        n_blocks = -(-seq_len // factor)
        if self.causal:
            full_blocks, rest = divmod(seq_len, factor)
            past_pairs = factor * full_blocks * (full_blocks - 1) // 2 + rest * full_blocks
            own_pairs = full_blocks * factor * (factor + 1) // 2 + rest * (rest + 1) // 2
            pairs = past_pairs + own_pairs
        else:
            pairs = seq_len * n_blocks
        attention = 4 * batch * heads * pairs * head_dim
        if self.method != "conv":
            return attention
        # Each of C outputs per (batch, head) is a head_dim x (f * head_dim) matrix-vector product.
        compression = 2 * 2 * batch * heads * n_blocks * factor * head_dim * head_dim
        return attention + compression

    def extra_repr(self) -> str:
        return f"causal={self.causal}, factor={self.factor}, method={self.method}"
