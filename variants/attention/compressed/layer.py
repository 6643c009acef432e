"""Memory-compressed attention (Liu et al. 2018): attend to keys and values shortened f-fold.

Keys and values are compressed along the sequence: compressed block c summarises positions
[c*f, (c+1)*f - 1], giving C = ceil(L / f) keys; queries are not compressed. Without a causal
mask every query attends to all C compressed keys.

Causally, a compressed key summarises its whole block, so it may only be seen by queries at or
after the block's last position. A query at i therefore attends to
  - the compressed blocks that end before its own block starts (so they end at or before i), and
  - exactly, the raw keys of its own block up to itself, [floor(i/f)*f, i].
Nothing leaks, and no row is empty: position i always sees itself. A block that ends exactly at i
is seen raw, not also compressed, so no position is counted twice; with f = 1 and an identity
compression this is full causal attention. The two parts are softmaxes over disjoint key sets and
are merged with their logsumexps. Each part is an ordinary causal attention in its own layout
(see `PastBlocksAndOwnBlock`), so on CPU the fused kernels' causal flag masks both and no mask
tensor is built: O(L) memory beyond the compressed keys, where an explicit (L, C) mask and its
scores took O(L^2 / f) and ran slower than exact attention. Other devices take the explicit
path of `flash`, which does build the (C-1)^2 f and C f^2 scores.

Compression `method`:
  conv  a learned Conv1d over the head_dim channels with kernel = stride = f; separate convs for
        keys and values, each shared by all heads (the paper convolves the full model width;
        sharing across heads keeps the kernel independent of n_heads).
  mean  the average of the block's real positions.
  max   the per-channel maximum over the block's real positions.
A length that is not a multiple of f is padded internally. The partial last block is built only
from real positions for mean and max; conv sees the zero padding (and adds its bias), which is
acceptable because that block is a learned summary anyway. Causally it is never visible: it ends
after the last real position.

Masks (`attention_mask`, `segment_ids`): each document's real positions run as a sequence of
their own (`masking.per_document`), so the blocks are counted from the document's first real
token and every summary pools real keys of one document only (a summary of no real key does not
exist); causally the exact part is the query's own block of that sequence, up to itself. A
packed document is thus compressed exactly as it would be alone, and a right-padded sequence
exactly as the sequence without its padding; a padded run inside a sequence is cut out (the
tokens after it move up into its blocks). Summaries aligned to absolute positions instead would
straddle document boundaries: pooling each straddling block per document gives a summary set
that depends on the query's document, and dropping the blocks not wholly inside a document
hides a document's first keys from its own bidirectional queries; either also needs a mask in
both causal parts, where now the fused kernels' causal flag alone masks (no mask tensor, see
`PastBlocksAndOwnBlock`). Without masks the call is the unmasked one of before. The cost is a
Python loop over the batch's documents.

Grouped KV heads (k, v of H_kv heads dividing H): keys and values are compressed once per KV
head and never repeated; query head h reads KV head h // (H / H_kv) through the fused kernels'
own grouping (`PastBlocksAndOwnBlock`'s `OwnBlocks`; SDPA's `enable_gqa` non-causal), and the
decoding cache holds H_kv heads.

Unlike a public implementation, masked scores are -inf (not +inf) and there is no dropout on the
scores before the softmax.
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
    from its first real token (`per_document`; why in the module docstring).
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
    supports_padding_mask = supports_segments = True  # each document alone (module docstring)
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
        real positions attend as a sequence of their own (module docstring)."""
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
