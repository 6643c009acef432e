"""NSA, Native Sparse Attention (Yuan et al. 2025): compressed, selected and window branches.
The layer (`NSAAttention`, the registry's entry); beside it `function` (the compressed and
window branches' autograd functions).

Keys and values are cut into blocks of `block_size`. A query at i reads three softmax branches
(scale 1/sqrt(d)): compressed, over the summaries (`compress`: mean | mlp) of the blocks that
ended at or before i (none: 0); selected, its own block (causal) and the `n_select - 1` earlier
blocks with the largest compressed-branch probability (no gradient through the choice);
window, i - window < j <= i. Output g_cmp o_cmp + g_sel o_sel + g_win o_win, the gates
`gates[..., 0:3]` computed by the layer from the token. Causal only; grouped KV heads taken as
they are; decoding on `cache.BlockKVCache`. Under masks no branch reads a key of another
document or a padded key, and padded queries' outputs are 0.

Each branch's full rule, how it runs, decoding and the masks' rules: docs/variants/nsa.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from variants.attention.common.base import Attention, pad_to_multiple
from variants.attention.common.cache import BlockKVCache, attend_prefix
from variants.attention.common.masking import masking_masks, on_real_prefix
from variants.attention.common.pooling import block_mean, real_block_mean
from variants.attention.common.selected_blocks import SelectedBlocks
from variants.attention.common.selection import (
    DocumentBlocks,
    attend_selected,
    block_select_pairs,
    top_blocks,
)
from variants.attention.nsa.function import CompressedBranch, GatedSum, WindowBranch
from variants.checks import require_bool, require_choice, require_positive_int
from variants.registry import register_attention

COMPRESS = ("mean", "mlp")


@register_attention
class NSAAttention(Attention):
    """NSA: gated compressed, selected (top-n blocks) and sliding-window branches."""

    family = "selection"
    takes_scale = True
    small_options = {"block_size": 8, "n_select": 3, "window": 16}
    knobs = ("n_select", "window")

    name = "nsa"
    exact = False
    block_sparse_work = True
    time_complexity = "O(L (n b + w + L / b) d)"
    memory_complexity = "O(L n d)"
    softmax_kernels = "flash"
    bidirectional_supported = False
    bidirectional_reason = (
        "NSA's branches are defined on the past (blocks that ended, a window back to i)"
    )
    n_gates = 3
    supports_decode = True
    independent_heads = True
    supports_padding_mask = supports_segments = True  # docs/variants/nsa.md, "Masks"
    native_gqa = native_gqa_decode = True  # every branch reads the KV heads as they are

    def __init__(
        self,
        *,
        causal: bool = True,
        block_size: int = 64,
        n_select: int = 16,
        window: int = 512,
        compress: str = "mlp",
        shared_selection: bool = False,
        head_dim: int = 64,
    ):
        super().__init__(causal=causal)
        self.block_size = require_positive_int(self.name, "block_size", block_size)
        self.n_select = require_positive_int(self.name, "n_select", n_select)
        self.window = require_positive_int(self.name, "window", window)
        self.compress = require_choice(self.name, "compress", compress, COMPRESS)
        self.shared_selection = require_bool(self.name, "shared_selection", shared_selection)
        self.head_dim = require_positive_int(self.name, "head_dim", head_dim)
        self.key_mlp = self.value_mlp = None
        if self.compress == "mlp":
            self.key_mlp = BlockMLP(block_size, head_dim)
            self.value_mlp = BlockMLP(block_size, head_dim)

    def compressed(self, x: torch.Tensor, mlp: BlockMLP | None) -> torch.Tensor:
        """One vector per block of `block_size`: (B, H, L, D) -> (B, H, ceil(L / b), D). A short
        last block is summarised too (mean of its real positions; the MLP sees zero padding),
        though no query ever sees it: it ends after the last position."""
        if mlp is None:
            return block_mean(x, self.block_size)
        return mlp(x)

    def _check_head_dim(self, head_dim: int) -> None:
        if self.compress == "mlp" and head_dim != self.head_dim:
            raise ValueError(
                f"{self.name}: option 'head_dim'={self.head_dim} must equal the inputs' head_dim "
                f"{head_dim} (the mlp compression maps blocks of head_dim channels)"
            )

    def real_compressed(
        self, x: torch.Tensor, mlp: BlockMLP | None, attention_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """`compressed` with padding left out: the mean of each block's real positions, or
        the MLP on x with padded positions zeroed. (B, H, L, D) -> (B, H, ceil(L / b), D)."""
        if attention_mask is None:
            return self.compressed(x, mlp)
        if mlp is None:
            return real_block_mean(x, self.block_size, attention_mask)[0]
        return mlp(x * attention_mask[:, None, :, None].to(x.dtype))

    def attend(self, q, k, v, gates, **masks) -> torch.Tensor:
        """q (B, H, L, D), k and v (B, H_kv, L, D), gates (B, H, L, 3) -> (B, H, L, D); masks:
        `attention_mask`, `segment_ids` (B, L), if given (docs/variants/nsa.md, "Masks")."""
        self._check_head_dim(q.shape[-1])
        # A padded tail common to the batch: the real prefix runs alone (docs/variants/nsa.md:
        # every branch is causal, so no real query reads a key or a summary there) and the
        # tail's outputs are 0 (its gates get no gradient).
        if (out := on_real_prefix(self.attend, [q, k, v, gates], masks)) is not None:
            return out
        masks = masking_masks(masks)  # e.g. the prefix's padding mask once nothing is padded
        if masks:
            return self._attend_masked(q, k, v, gates, **masks)
        keys = self.compressed(k, self.key_mlp)  # (B, H_kv, n, D)
        values = self.compressed(v, self.value_mlp)  # (B, H_kv, n, D)
        out_cmp = CompressedBranch.apply(q, keys, values, self.block_size)  # (B, H, L, D)
        with torch.no_grad():
            slots, shared = self.n_select - 1, self.shared_selection
            selected = top_blocks(q, keys, self.block_size, slots, True, per_group=shared)
        out_sel = SelectedBlocks.apply(q, k, v, selected, self.block_size, True)
        out_win = WindowBranch.apply(q, k, v, self.window)
        return GatedSum.apply(gates.to(q.dtype), out_cmp, out_sel, out_win)

    def _attend_masked(self, q, k, v, gates, attention_mask=None, segment_ids=None):
        """`attend` under masks: each branch's rule of docs/variants/nsa.md, "Masks"."""
        block = self.block_size
        docs = DocumentBlocks(attention_mask, segment_ids, q.shape[2], block)
        keys = self.real_compressed(k, self.key_mlp, attention_mask)  # (B, H_kv, n, D)
        values = self.real_compressed(v, self.value_mlp, attention_mask)  # (B, H_kv, n, D)
        out_cmp = CompressedBranch.apply(q, keys, values, block, docs)  # (B, H, L, D)
        with torch.no_grad():
            slots = self.n_select - 1
            shared = self.shared_selection
            selected = top_blocks(q, keys, block, slots, True, docs.hide_outside, shared)
            if attention_mask is not None:  # a padded query's output is 0: it needs no block
                selected.masked_fill_(~attention_mask[:, None, :, None], -1)
        masks = (attention_mask, segment_ids)
        out_sel = SelectedBlocks.apply(q, k, v, selected, block, True, *masks)
        out_win = WindowBranch.apply(q, k, v, self.window, *masks)
        return GatedSum.apply(gates.to(q.dtype), out_cmp, out_sel, out_win)

    # --- decoding: every key and value, and the compressed key and value of ended blocks ----
    def new_cache(self, batch_size, n_heads, head_dim, *, max_len, device, dtype):
        self._check_head_dim(head_dim)
        return BlockKVCache(
            self.name, batch_size, n_heads, head_dim, block=self.block_size,
            summarise_values=True, max_len=max_len, device=device, dtype=dtype,
        )  # fmt: skip

    def cache_prompt(self, q, k, v, cache: BlockKVCache, gates) -> None:
        cache.append(k, v)
        ended = k.shape[2] // self.block_size * self.block_size
        if ended:
            cache.add_summaries(
                self.compressed(k[:, :, :ended], self.key_mlp),
                self.compressed(v[:, :, :ended], self.value_mlp),
            )

    def decode_step(self, q, k, v, cache: BlockKVCache, gates) -> torch.Tensor:
        cache.append(k, v)
        block = self.block_size
        if cache.length % block == 0:  # the own block ends here: the query sees its summary
            keys, values = cache.keys()[:, :, -block:], cache.values()[:, :, -block:]
            cache.add_summaries(
                self.compressed(keys, self.key_mlp), self.compressed(values, self.value_mlp)
            )
        summary_keys, summary_values = cache.summaries()  # (B, H_kv, n, D) each
        out_cmp = attend_prefix(q, summary_keys, summary_values)  # 0 before the first block ends
        slots = self.n_select - 1
        out_sel = attend_selected(q, cache, summary_keys, slots, self.shared_selection)
        first = max(0, cache.length - self.window)
        out_win = attend_prefix(q, cache.keys()[:, :, first:], cache.values()[:, :, first:])
        return GatedSum.apply(gates.to(q.dtype), out_cmp, out_sel, out_win)  # (B, H, 1, D)

    def flops(self, batch: int, heads: int, seq_len: int, head_dim: int) -> int:
        """4 B H d x the pairs the three branches score (compressed: floor((i + 1) / b) per
        query; selected: own block causal plus up to n_select - 1 full blocks; window:
        min(i + 1, window)), plus the selection scores (2 B H d per query and earlier block)
        and, for `mlp`, the compression's 2 x 2 B H n (b d d + d d)."""
        b = self.block_size
        position = torch.arange(seq_len, dtype=torch.int64)
        compressed = int(((position + 1) // b).sum())
        window = int((position + 1).clamp(max=self.window).sum())
        selected, candidates = block_select_pairs(seq_len, b, self.n_select, True)
        total = 4 * batch * heads * head_dim * (compressed + selected + window)
        total += 2 * batch * heads * head_dim * candidates
        if self.compress == "mlp":
            n_blocks = -(-seq_len // b)
            total += 2 * 2 * batch * heads * n_blocks * (b * head_dim + head_dim) * head_dim
        return total

    def extra_repr(self) -> str:
        return (
            f"causal={self.causal}, block_size={self.block_size}, n_select={self.n_select}, "
            f"window={self.window}, compress={self.compress}, "
            f"shared_selection={self.shared_selection}"
        )


class BlockMLP(nn.Module):
    """NSA's learned compression of a block: x_t + p_t for the block's b positions (learned
    intra-block position vectors p), flattened, Linear(b d, d), GELU, Linear(d, d).
    (B, H, L, d) -> (B, H, ceil(L / b), d); the short last block is zero-padded first. Runs in
    x's dtype (half inputs meet float32 parameters outside autocast)."""

    def __init__(self, block_size: int, head_dim: int):
        super().__init__()
        self.block_size = block_size
        self.position = nn.Parameter(torch.zeros(block_size, head_dim))
        self.hidden = nn.Linear(block_size * head_dim, head_dim)
        self.out = nn.Linear(head_dim, head_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        blocks = pad_to_multiple(x, self.block_size).unflatten(2, (-1, self.block_size))
        blocks = blocks + self.position.to(x.dtype)  # (B, H, n, b, d)
        hidden = F.linear(blocks.flatten(3), *_weights(self.hidden, x.dtype))  # (B, H, n, d)
        return F.linear(F.gelu(hidden), *_weights(self.out, x.dtype))  # (B, H, n, d)


def _weights(linear: nn.Linear, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A linear layer's weight and bias in `dtype`."""
    return linear.weight.to(dtype), linear.bias.to(dtype)
