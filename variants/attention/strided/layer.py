"""Strided attention (Sparse Transformer): a local window plus every stride-th earlier key."""

from __future__ import annotations

import torch

from variants import patterns
from variants.attention.common import flex
from variants.attention.common.base import Attention, pattern_length
from variants.attention.common.cache import KVCache, attend_prefix
from variants.attention.common.columns import stride_at
from variants.attention.common.masking import repeat_kv
from variants.attention.strided.function import LocalAndColumns, strided_parts
from variants.checks import require_positive_int, require_positive_int_or_auto
from variants.registry import register_attention

# FlexAttention's tile for this pattern: every tile is partial (strided keys are everywhere), so
# the tile only sets the kernel's work granularity; 128 is FlexAttention's default.
FLEX_TILE = 128


@register_attention
class StridedAttention(Attention):
    """Sparse Transformer strided pattern: the last `stride` keys plus every stride-th key.

    Query i attends to key j if (i - j) mod stride == 0 (the strided part) or if j is one of the
    `stride` nearest positions (the local part): i - stride < j <= i when causal, |i - j| < stride
    otherwise; causal also drops every j > i from the strided part. With stride ~ sqrt(L) every
    earlier position is reachable in two hops for O(L sqrt(L)) work. `stride="auto"` picks
    round(sqrt(n)), n the length the pattern is taken at (`pattern_length`): causally
    max(L, `max_seq_len`), the model's longest sequence, so that no output depends on how many
    tokens follow it (a stride of sqrt(L) moved the first outputs as tokens were appended);
    without causality L itself. Each part is computed on its own layout, without any (L, L) tensor:
    the local part as a sliding window of blocks of `stride`, the strided part by viewing the
    sequence as (L / stride, stride) and attending along each column; the two are merged with
    their logsumexps (`LocalAndColumns`). The query itself belongs to both parts and is counted
    in the local one only. Both parts' masks come from `patterns.Band` and `patterns.Strided`
    (`strided_parts`); `impl="flex"` runs FlexAttention on their union instead.

    Grouped KV heads (k, v of H_kv heads) are never repeated: both parts run with the heads
    on the fused kernels' head axis, which maps query head h to key head h // (H / H_kv)
    (`StridedParts`); the decoding cache holds H_kv heads. `impl="flex"` repeats the keys to
    H heads before FlexAttention.
    """

    family = "fixed"
    takes_scale = True
    knobs = ("stride",)

    name = "strided"
    published_as = {"lra": "Sparse Transformer"}
    exact = False
    block_sparse_work = True
    time_complexity = "O(L sqrt(L) d)"
    memory_complexity = "O(L sqrt(L))"
    supports_decode = True
    softmax_kernels = "flash"
    independent_heads = True
    supports_padding_mask = supports_segments = True
    native_gqa = native_gqa_decode = True
    decode_masks_padding = True  # a left-padded prompt's slots left out (`Cache.real_keys`)

    def __init__(
        self,
        *,
        causal: bool = False,
        stride: int | str = "auto",
        impl: str = "native",
        max_seq_len: int = 4096,
    ):
        super().__init__(causal=causal)
        self.stride = require_positive_int_or_auto(self.name, "stride", stride)
        # Not a limit (`Attention.max_seq_len` stays None): only where the auto stride is taken.
        self.model_max_len = require_positive_int(self.name, "max_seq_len", max_seq_len)
        self.impl = flex.require_impl(self.name, impl)
        self._flex_mask = None  # (seq_len, device, BlockMask) of the last flex call

    def pattern(self, seq_len: int) -> patterns.Pattern:
        """The allowed pairs at `seq_len`: the band of `stride` nearest keys or every stride-th
        key, intersected with `Causal` if causal."""
        local, columns = strided_parts(self.stride_for(seq_len), self.causal)
        return local | columns

    def supports_backward(self, device: torch.device) -> bool:
        return flex.supports_backward(self.impl, device)

    def stride_for(self, seq_len: int, at: int | None = None) -> int:
        """The stride on `seq_len` positions: the option, or round(sqrt(n)) if it is 'auto', n
        the `pattern_length` of `at` (decoding: the cache's max_len), by default of seq_len. At
        most seq_len: a longer stride is the same pattern (the local part holds every pair)."""
        length = pattern_length(seq_len if at is None else at, self.model_max_len, self.causal)
        return min(stride_at(self.stride, length), seq_len)

    def unsupported_input(self, option: str) -> str | None:
        return flex.mask_reason(self.impl, option) or super().unsupported_input(option)

    @property
    def shift_invariant(self) -> bool:  # its pattern reads positions through i - j alone
        return True

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        seq_len = q.shape[2]
        stride = self.stride_for(seq_len)
        if self.impl == "flex":
            if self._flex_mask is None or self._flex_mask[:2] != (seq_len, q.device):
                mask = flex.block_mask(self.pattern(seq_len), seq_len, FLEX_TILE, q.device)
                self._flex_mask = (seq_len, q.device, mask)
            # FlexAttention's own grouping is not taken (forward-only on CPU): keys repeated.
            k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])  # (B, H, L, D) each
            return flex.attend(self.name, q, k, v, self._flex_mask[2])
        return LocalAndColumns.apply(
            q, k, v, stride, self.causal, attention_mask, segment_ids
        )  # (B, H, L, D)

    # --- decoding: every key (each is a column key of some later query), read sparsely ------
    def new_cache(self, batch_size, n_heads, head_dim, *, max_len, device, dtype):
        return KVCache(
            self.name, batch_size, n_heads, head_dim, max_len=max_len, device=device, dtype=dtype
        )

    def prefill_attend(self, q, k, v, cache: KVCache, attention_mask=None) -> torch.Tensor:
        # The stride decoding uses (auto: at the cache's pattern length): the forward's, unless
        # max_len exceeds max_seq_len.
        stride = self.stride_for(q.shape[2], at=cache.max_len)
        return LocalAndColumns.apply(q, k, v, stride, True, attention_mask)  # (B, H, T, D)

    def cache_prompt(self, q, k, v, cache: KVCache) -> None:
        cache.append(k, v)

    def decode_step(self, q, k, v, cache: KVCache) -> torch.Tensor:
        """Reads s + i / s keys of the cache: the s nearest (itself included) and its column,
        positions i - s, i - 2s, ... >= 0, as a strided view."""
        cache.append(k, v)
        position, stride = cache.length - 1, self.stride_for(cache.max_len, at=cache.max_len)
        near = slice(max(0, position - stride + 1), position + 1)
        column = slice(position % stride, max(0, position - stride + 1), stride)
        keys = torch.cat([cache.keys_buffer[:, :, column], cache.keys_buffer[:, :, near]], 2)
        values = torch.cat([cache.values_buffer[:, :, column], cache.values_buffer[:, :, near]], 2)
        held = torch.arange(cache.length, device=keys.device)
        real = cache.real_keys(torch.cat([held[column], held[near]]))  # (B, 1, 1, n) or None
        return attend_prefix(q, keys, values, mask=real)  # (B, H, 1, D)

    def flops(self, batch: int, heads: int, seq_len: int, head_dim: int) -> int:
        # Counted in closed form: the pattern has no sparse block form (stride-th keys fall in
        # every tile), so `pattern(L).pairs` would evaluate the predicate on all L^2 pairs.
        stride = self.stride_for(seq_len)
        before = torch.arange(seq_len, dtype=torch.int64)  # positions before query i
        if self.causal:
            local = before.clamp(max=stride - 1) + 1
            strided = before // stride
        else:
            after = seq_len - 1 - before  # positions after query i
            local = before.clamp(max=stride - 1) + after.clamp(max=stride - 1) + 1
            strided = before // stride + after // stride
        pairs = int((local + strided).sum())
        return 4 * batch * heads * pairs * head_dim

    def extra_repr(self) -> str:
        return (
            f"causal={self.causal}, stride={self.stride}, impl={self.impl}, "
            f"max_seq_len={self.model_max_len}"
        )
