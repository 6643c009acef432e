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
are merged with their logsumexps. The own-block part works on (L/f, f, f) blocks, never on an
(L, L) mask.

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

Unlike a public implementation, masked scores are -inf (not +inf) and there is no dropout on the
scores before the softmax.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from variants.attention.base import Attention, masked_attend, pad_to_multiple
from variants.checks import require_choice, require_positive_int
from variants.registry import register_attention

METHODS = ("conv", "mean", "max")


def block_mean(x: torch.Tensor, factor: int) -> torch.Tensor:
    """Mean over each block of `factor` real positions: (B, H, L, D) -> (B, H, C, D)."""
    length = x.shape[2]
    blocks = pad_to_multiple(x, factor).unflatten(2, (-1, factor))  # (B, H, C, f, D)
    starts = torch.arange(0, length, factor, device=x.device)  # (C,)
    real_counts = (length - starts).clamp(max=factor).to(x.dtype)  # (C,) only the last may be < f
    return blocks.sum(dim=3) / real_counts[:, None]  # (B, H, C, D)


def block_max(x: torch.Tensor, factor: int) -> torch.Tensor:
    """Per-channel maximum over each block of `factor` positions: (B, H, L, D) -> (B, H, C, D)."""
    pad = -x.shape[2] % factor
    padded = F.pad(x, (0, 0, 0, pad), value=float("-inf"))  # (B, H, C*f, D); padding never wins
    return padded.unflatten(2, (-1, factor)).amax(dim=3)  # (B, H, C, D)


def block_conv(x: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """Strided convolution over each block (kernel = stride): (B, H, L, D) -> (B, H, C, D).

    With kernel = stride the windows do not overlap, so the conv is one matmul of each flattened
    block with the kernel, shared by all heads; that avoids the channels-first transposes and is
    faster than Conv1d's own kernels at these shapes.
    """
    factor = conv.stride[0]
    blocks = pad_to_multiple(x, factor).unflatten(2, (-1, factor))  # (B, H, C, f, D); zero pad
    kernel = conv.weight.permute(0, 2, 1).flatten(1)  # (D_out, f*D_in), matches blocks' order
    return F.linear(blocks.flatten(3), kernel, conv.bias)  # (B, H, C, D)


def merge_partials(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> torch.Tensor:
    """Softmax attention over the union of two disjoint key sets, from each set's result.

    out_*: (..., D) outputs, lse_*: (...) logsumexps of their scores. Set a may be empty
    (lse -inf, out 0); set b must not be. The weight of a is exp(lse_a) / (exp(lse_a) +
    exp(lse_b)) = sigmoid(lse_a - lse_b), which is 0 with a zero gradient for an empty set a.
    """
    weight_a = torch.sigmoid(lse_a - lse_b).unsqueeze(-1)  # (..., 1)
    return out_b + weight_a * (out_a - out_b)  # (..., D)


@register_attention
class CompressedAttention(Attention):
    """Memory-compressed attention: keys and values shortened f-fold (strided conv, mean or max)."""

    name = "compressed"
    exact = False
    time_complexity = "O(L^2 d / f)"
    memory_complexity = "O(L^2 / f)"

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

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.method == "conv" and q.shape[-1] != self.head_dim:
            raise ValueError(
                f"{self.name}: option 'head_dim'={self.head_dim} must equal the inputs' head_dim "
                f"{q.shape[-1]} (the conv compression has head_dim channels)"
            )
        keys = self.compress(k, self.key_conv)  # (B, H, C, D)
        values = self.compress(v, self.value_conv)  # (B, H, C, D)
        if not self.causal:
            return F.scaled_dot_product_attention(q, keys, values)  # (B, H, L, D)
        return self._causal_attend(q, k, v, keys, values)

    def _causal_attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
    ) -> torch.Tensor:
        """Compressed earlier blocks + exact own block up to the query, merged by logsumexp.

        q, k, v: (B, H, L, D) raw; keys, values: (B, H, C, D) compressed. Returns (B, H, L, D).
        """
        length, factor = q.shape[2], self.factor
        query_block = torch.arange(length, device=q.device) // factor  # (L,)
        key_block = torch.arange(keys.shape[2], device=q.device)  # (C,)
        ended_before = key_block[None, :] < query_block[:, None]  # (L, C)
        out_past, lse_past = masked_attend(q, keys, values, ended_before)  # (B, H, L, D), (B, H, L)

        # Padded keys sit after the last real query in the last block, so the triangle hides them.
        q_blocks, k_blocks, v_blocks = (
            pad_to_multiple(x, factor).unflatten(2, (-1, factor)) for x in (q, k, v)
        )  # (B, H, C, f, D)
        up_to_self = torch.ones(factor, factor, dtype=torch.bool, device=q.device).tril()  # (f, f)
        out_own, lse_own = masked_attend(q_blocks, k_blocks, v_blocks, up_to_self)
        out_own = out_own.flatten(2, 3)[:, :, :length]  # (B, H, L, D)
        lse_own = lse_own.flatten(2, 3)[:, :, :length]  # (B, H, L)

        return merge_partials(out_past, lse_past, out_own, lse_own)  # (B, H, L, D)

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
