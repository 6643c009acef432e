"""Sliding-window attention: each query the `window` latest positions, plus attention sinks.

A per-token window (Mistral's, gpt-oss's window layers), not blocks: causally query i sees keys
i - window < j <= i; bidirectionally |i - j| < window. `sink_tokens` adds the first n
positions to every query's keys (StreamingLLM's sinks); `learned_sink` adds one learned logit
per head to the softmax's denominator, with no value (gpt-oss). Decoding keeps a ring of
`window` keys plus the sinks: its cache is flat in the context. Derivation and measurements:
docs/variants.md.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from variants import patterns
from variants.attention.common.base import Attention
from variants.attention.common.cache import WindowCache, attend_prefix
from variants.attention.common.local import (
    from_blocks,
    grouped_window_attention,
    key_windows,
    to_blocks,
    window_mask,
)
from variants.attention.common.masking import document_mask, repeat_kv
from variants.checks import require_bool, require_non_negative_int, require_positive_int
from variants.registry import register_attention


@register_attention
class SlidingWindowAttention(Attention):
    """Sliding window of `window` keys per query, with `sink_tokens` and a `learned_sink`.

    The sequence is tiled in blocks of `window`; a query block reads its own and the previous
    block (and the next, bidirectionally) through SDPA's fused kernel with the band as its mask,
    as `blockwise` does, plus the sink tokens' keys prepended to every tile. `learned_sink` runs
    the tile's scores explicitly (the sink is a logit with no key: one more softmax column).
    """

    name = "sliding_window"
    published_as = {"lra": "Local Attention"}
    family = "fixed"
    takes_scale = True
    exact = False
    knobs = ("window",)
    small_options = {"window": 8, "sink_tokens": 2}
    block_sparse_work = True
    time_complexity = "O(L (w + s) d)"
    memory_complexity = "O(L (w + s))"
    supports_decode = True
    softmax_kernels = "sdpa"
    supports_padding_mask = supports_segments = True
    native_gqa = native_gqa_decode = True
    independent_heads = True  # the learned sinks' logits read through `of_heads`
    decode_masks_padding = True  # a left-padded prompt's slots left out (`Cache.real_keys`)

    def __init__(
        self,
        *,
        causal: bool = False,
        window: int = 128,
        sink_tokens: int = 0,
        learned_sink: bool = False,
        n_heads: int = 4,
    ):
        super().__init__(causal=causal)
        self.window = require_positive_int(self.name, "window", window)
        self.sink_tokens = require_non_negative_int(self.name, "sink_tokens", sink_tokens)
        self.learned_sink = require_bool(self.name, "learned_sink", learned_sink)
        self.n_heads = require_positive_int(self.name, "n_heads", n_heads)
        # gpt-oss's sink: a logit per head in every row's denominator, learned with the model.
        self.sink_logit = nn.Parameter(torch.zeros(self.n_heads)) if learned_sink else None

    def pattern(self, seq_len: int) -> patterns.Pattern:
        """The band of `window` (causal: the `window` latest positions) and the sink columns."""
        band = patterns.Band(self.window)
        if self.sink_tokens:
            band = band | patterns.Global(self.sink_tokens, causal=True)
        return band & patterns.Causal() if self.causal else band

    def _band(self) -> patterns.Pattern:
        band = patterns.Band(self.window)
        return band & patterns.Causal() if self.causal else band

    @property
    def shift_invariant(self) -> bool:  # the window is relative; sinks are the first positions
        return self.sink_tokens == 0

    def kernel_path(self, device, dtype) -> str:
        return "explicit" if self.learned_sink else super().kernel_path(device, dtype)

    def attend(self, q, k, v, *, attention_mask=None, segment_ids=None):
        batch, heads, seq_len, dim = q.shape
        block = min(self.window, seq_len)
        back, fwd = 1, 0 if self.causal else 1
        q_blocks = to_blocks(q, block)  # (B, H, n, b, D)
        k_windows = key_windows(k, block, back, fwd)  # (B, H_kv, n, w*b, D)
        v_windows = key_windows(v, block, back, fwd)
        masks = {"attention_mask": attention_mask, "segment_ids": segment_ids}
        mask = window_mask(
            self._band(), seq_len, block, back, fwd, device=q.device, **masks
        )  # (n, b, w*b), or (B, n, b, w*b) with masks
        if self.sink_tokens:
            k_windows, v_windows, mask = self._with_sinks(k, v, k_windows, v_windows, mask, block,
                                                          masks)  # fmt: skip
        if self.learned_sink:
            group = heads // k.shape[1]  # grouped KV heads, repeated for the explicit scores
            k_windows, v_windows = (x.repeat_interleave(group, 1) for x in (k_windows, v_windows))
            out = self._with_learned_sink(q_blocks, k_windows, v_windows, mask)
            return from_blocks(out, seq_len)  # (B, H, L, D)
        if k.shape[1] != heads:
            out = grouped_window_attention(q_blocks, k_windows, v_windows, mask)
            return from_blocks(out, seq_len)
        q_blocks, k_windows, v_windows = (x.flatten(0, 1) for x in (q_blocks, k_windows, v_windows))
        if mask.dim() == 4:  # one mask per sequence: as (B*H, n, b, W)
            mask = mask[:, None].expand(batch, heads, *mask.shape[1:]).flatten(0, 1)
        else:
            mask = mask[None]  # (1, n, b, W): a 3-D mask takes SDPA's math path on CPU
        # Tiles on SDPA's head axis, the mask broadcast: its fused CPU kernel (as blockwise).
        out = F.scaled_dot_product_attention(q_blocks, k_windows, v_windows, attn_mask=mask)
        return from_blocks(out.unflatten(0, (batch, heads)), seq_len)  # (B, H, L, D)

    def _with_sinks(self, k, v, k_windows, v_windows, mask, block, masks):
        """The first `sink_tokens` keys prepended to every tile's window, masked where the band
        already holds them (a key counts once) or where the query may not see them."""
        n_tiles = k_windows.shape[2]
        sinks = min(self.sink_tokens, k.shape[2])
        sink_k = k[:, :, None, :sinks].expand(-1, -1, n_tiles, -1, -1)  # (B, H_kv, n, s, D)
        sink_v = v[:, :, None, :sinks].expand(-1, -1, n_tiles, -1, -1)
        query = (torch.arange(n_tiles, device=k.device)[:, None] * block
                 + torch.arange(block, device=k.device))[:, :, None]  # (n, b, 1)  # fmt: skip
        key = torch.arange(sinks, device=k.device)[None, None, :]  # (1, 1, s)
        allowed = ~self._band().allows(query, key)  # outside the band: not counted twice
        if self.causal:
            allowed = allowed & (key <= query)
        if any(m is not None for m in masks.values()):
            allowed = allowed & document_mask(masks["attention_mask"], masks["segment_ids"],
                                              query, key)  # fmt: skip
        if mask.dim() == 4 and allowed.dim() == 3:
            allowed = allowed.expand(mask.shape[0], *allowed.shape)
        elif allowed.dim() == 4 and mask.dim() == 3:
            mask = mask.expand(allowed.shape[0], *mask.shape)
        k_windows = torch.cat([sink_k, k_windows], dim=3)  # (B, H_kv, n, s + w*b, D)
        v_windows = torch.cat([sink_v, v_windows], dim=3)
        return k_windows, v_windows, torch.cat([allowed, mask], dim=-1)

    def _with_learned_sink(self, q_blocks, k_windows, v_windows, mask):
        """Explicit softmax over each tile's keys plus the head's sink logit (no value):
        (B, H, n, b, D)."""
        scale = 1.0 / math.sqrt(q_blocks.shape[-1])
        scores = q_blocks @ k_windows.transpose(-1, -2) * scale  # (B, H, n, b, W)
        mask = mask if mask.dim() == 3 else mask[:, None]  # (n, b, W) or (B, 1, n, b, W)
        scores = scores.masked_fill(~mask, float("-inf"))
        return self._sink_softmax(scores) @ v_windows

    def _sink_softmax(self, scores: torch.Tensor) -> torch.Tensor:
        """softmax over [scores, sink logit] with the sink's column dropped: (B, H, ..., n)."""
        heads = scores.shape[1]
        sink = self.of_heads(self.sink_logit).to(scores.dtype)  # (H,) this call's heads
        sink = sink.view(1, heads, *([1] * (scores.dim() - 2)))
        sink = sink.expand(*scores.shape[:-1], 1)
        return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]

    # --- decoding: a ring of the `window` latest positions, the sinks in the store ---------
    def new_cache(self, batch_size, n_heads, head_dim, *, max_len, device, dtype):
        sinks = min(self.sink_tokens, max_len)
        return WindowCache(
            self.name, batch_size, n_heads, head_dim, window=self.window,
            keep=lambda positions: positions < sinks, kept=sinks,
            max_len=max_len, device=device, dtype=dtype,
        )  # fmt: skip

    def cache_prompt(self, q, k, v, cache: WindowCache) -> None:
        cache.append(k, v)

    def decode_step(self, q, k, v, cache: WindowCache) -> torch.Tensor:
        cache.append(k, v)
        query = torch.tensor(cache.length - 1, device=cache.ring_positions.device)
        allows = self.pattern(cache.max_len).allows
        keys, values, held = cache.gather(lambda held: allows(query, held))  # (B, H_kv, n, D)
        real = cache.real_keys(held)  # (B, 1, 1, n) or None
        if not self.learned_sink:
            return attend_prefix(q, keys, values, mask=real)  # (B, H, 1, D)
        keys, values = repeat_kv(keys, q.shape[1]), repeat_kv(values, q.shape[1])
        scores = q @ keys.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, 1, n)
        if real is not None:
            scores = scores.masked_fill(~real, float("-inf"))
        return self._sink_softmax(scores) @ values

    def flops(self, batch: int, heads: int, seq_len: int, head_dim: int) -> int:
        pairs = self.pattern(seq_len).pairs(seq_len, min(self.window, seq_len))
        return 4 * batch * heads * pairs * head_dim

    def extra_repr(self) -> str:
        return (
            f"causal={self.causal}, window={self.window}, sink_tokens={self.sink_tokens}, "
            f"learned_sink={self.learned_sink}"
        )
